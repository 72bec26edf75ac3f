//! The two deployment profiles and the facts of each that are not knobs (parsers, fixed flags).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// A reference deployment sparkgate knows by heart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ProfileId {
    #[serde(rename = "deepseek-v4.1-flash")]
    DeepSeekV41Flash,
    #[serde(rename = "glm-5.3-flash")]
    Glm53Flash,
}

impl ProfileId {
    pub const ALL: [ProfileId; 2] = [ProfileId::DeepSeekV41Flash, ProfileId::Glm53Flash];

    pub fn as_str(self) -> &'static str {
        match self {
            ProfileId::DeepSeekV41Flash => "deepseek-v4.1-flash",
            ProfileId::Glm53Flash => "glm-5.3-flash",
        }
    }

    pub(crate) fn facts(self) -> &'static ProfileFacts {
        match self {
            ProfileId::DeepSeekV41Flash => &DEEPSEEK,
            ProfileId::Glm53Flash => &GLM,
        }
    }
}

impl fmt::Display for ProfileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProfileId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProfileId::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("must be one of: {}", ProfileId::ALL.map(|p| p.as_str()).join(", ")))
    }
}

/// Fixed parts of a profile's launch: what the reference launcher hard-codes rather than reads
/// from a variable.
#[derive(Debug)]
pub(crate) struct ProfileFacts {
    /// In-container directory for the chat template and overlay files.
    pub(crate) opt_dir: &'static str,
    /// `vllm serve` flags that follow `--distributed-executor-backend mp` on every rank.
    pub(crate) fixed_serve_flags: &'static [&'static str],
    /// `--hf-overrides` JSON, when the profile passes one.
    pub(crate) hf_overrides: Option<&'static str>,
    /// Capabilities added to each rank container.
    pub(crate) cap_add: &'static [&'static str],
}

static DEEPSEEK: ProfileFacts = ProfileFacts {
    opt_dir: "/opt/dsv41",
    fixed_serve_flags: &[
        "--tokenizer-mode",
        "deepseek_v41",
        "--tool-call-parser",
        "deepseek_v41",
        "--reasoning-parser",
        "deepseek_v41",
        "--enable-auto-tool-choice",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--no-enable-flashinfer-autotune",
    ],
    hf_overrides: Some(r#"{"engram_table_dir":"/engram-src"}"#),
    cap_add: &["SYS_PTRACE", "IPC_LOCK"],
};

static GLM: ProfileFacts = ProfileFacts {
    opt_dir: "/opt/glm53",
    fixed_serve_flags: &[
        "--tool-call-parser",
        "glm47",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "glm45",
        "--enable-prefix-caching",
        "--no-enable-flashinfer-autotune",
    ],
    hf_overrides: None,
    cap_add: &["IPC_LOCK"],
};
