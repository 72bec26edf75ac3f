//! The two deployment profiles and the facts of each that are not knobs (parsers, fixed flags).

use serde::Serialize;

use crate::choice::choice;

choice! {
    /// A reference deployment sparkgate knows by heart.
    pub enum ProfileId {
        DeepSeekV41Flash = "deepseek-v4.1-flash",
        Glm53Flash = "glm-5.3-flash",
    }
}

impl ProfileId {
    /// How this profile's chat template treats `reasoning_effort`.
    pub fn reasoning(self) -> &'static ReasoningFacts {
        &self.facts().reasoning
    }

    pub(crate) fn facts(self) -> &'static ProfileFacts {
        match self {
            ProfileId::DeepSeekV41Flash => &DEEPSEEK,
            ProfileId::Glm53Flash => &GLM,
        }
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
    pub(crate) reasoning: ReasoningFacts,
}

/// What the profile's chat template does with `reasoning_effort` (seed-launchers reference §1.11,
/// §2.8). The gateway validates and translates efforts against this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasoningFacts {
    /// Effort names the template renders as themselves, with the integer each stands for
    /// where the template is numeric.
    pub named: &'static [(&'static str, Option<u8>)],
    /// Integer efforts the template accepts (DeepSeek: 1..=100), if any.
    pub integer_range: Option<(u8, u8)>,
    /// What the template renders when no effort reaches it.
    pub template_default: &'static str,
    /// What the template renders for a value it does not know (GLM: `max`, silently).
    pub unknown_renders_as: Option<&'static str>,
    /// Thinking is on unless the request turns it off.
    pub thinking_default_on: bool,
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
        // render, tokens-in generate and derender: how a cut generation continues exactly
        // (docs/resume.md); the gateway's route table never exposes them to clients.
        "--enable-scale-out",
    ],
    hf_overrides: Some(r#"{"engram_table_dir":"/engram-src"}"#),
    cap_add: &["SYS_PTRACE", "IPC_LOCK"],
    reasoning: ReasoningFacts {
        named: &[("low", Some(50)), ("high", Some(75)), ("max", Some(100))],
        integer_range: Some((1, 100)),
        template_default: "high",
        unknown_renders_as: None,
        thinking_default_on: true,
    },
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
        "--enable-scale-out",
    ],
    hf_overrides: None,
    cap_add: &["IPC_LOCK"],
    reasoning: ReasoningFacts {
        named: &[("low", None), ("high", None)],
        integer_range: None,
        template_default: "max",
        unknown_renders_as: Some("max"),
        thinking_default_on: true,
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_facts_match_the_templates() {
        let ds = ProfileId::DeepSeekV41Flash.reasoning();
        assert_eq!(ds.template_default, "high");
        assert!(ds.named.contains(&("high", Some(75))));
        assert_eq!(ds.integer_range, Some((1, 100)));
        let glm = ProfileId::Glm53Flash.reasoning();
        assert_eq!(glm.named.iter().map(|n| n.0).collect::<Vec<_>>(), ["low", "high"]);
        assert_eq!(glm.unknown_renders_as, Some("max"));
        assert_eq!(glm.integer_range, None);
    }
}
