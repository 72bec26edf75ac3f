//! The vLLM releases sparkgate is tested against, and where a rank's reported `/version` falls
//! among them: the key of every rule whose right answer differs by release.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A vLLM release sparkgate knows, oldest first (the order is the derived `Ord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum VllmRelease {
    #[serde(rename = "0.33.0")]
    V0_33,
    #[serde(rename = "0.34.0")]
    V0_34,
}

/// How a reported version relates to the releases sparkgate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fit {
    /// The same minor release as a known one (a patch release follows its rules).
    Known,
    /// Newer than the newest known: the newest rules, and a warning.
    Newer,
    /// Older than the oldest known (or between two known ones): the nearest older rules, or
    /// the oldest, and a warning.
    Older,
    /// Not a version string: the oldest rules (the most repairs, each harmless on a newer
    /// release), and a warning.
    Unreadable,
}

/// A reported version placed among the known releases: whose rules apply, and how well.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamVersion {
    /// What rank 0's `/version` said.
    pub reported: String,
    pub rules: VllmRelease,
    pub fit: Fit,
}

impl VllmRelease {
    /// Every known release, oldest first.
    pub const ALL: [VllmRelease; 2] = [VllmRelease::V0_33, VllmRelease::V0_34];
    pub const OLDEST: VllmRelease = VllmRelease::V0_33;
    pub const NEWEST: VllmRelease = VllmRelease::V0_34;

    /// The release's version string, as `/version` and PyPI spell it.
    pub fn version(self) -> &'static str {
        match self {
            VllmRelease::V0_33 => "0.33.0",
            VllmRelease::V0_34 => "0.34.0",
        }
    }

    /// A release named by its version (`0.34.0`, or `0.34`).
    pub fn parse(word: &str) -> Result<VllmRelease, String> {
        let key = numbers(word).filter(|n| n.len() >= 2).map(|n| (n[0], n[1]));
        VllmRelease::ALL
            .into_iter()
            .find(|r| Some(r.minor()) == key)
            .ok_or_else(|| {
                let known: Vec<_> = VllmRelease::ALL.iter().map(|r| r.version()).collect();
                format!("unknown vLLM release `{word}` (known: {})", known.join(", "))
            })
    }

    fn minor(self) -> (u64, u64) {
        let n = numbers(self.version()).expect("a release's version is numeric");
        (n[0], n[1])
    }
}

impl fmt::Display for VllmRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.version())
    }
}

impl UpstreamVersion {
    /// Places `reported` (`0.34.0`, `0.34.1.dev3+g1234`, `0.35.0rc1`) among the known releases.
    pub fn place(reported: &str) -> UpstreamVersion {
        let (rules, fit) = match numbers(reported).filter(|n| n.len() >= 2).map(|n| (n[0], n[1])) {
            None => (VllmRelease::OLDEST, Fit::Unreadable),
            Some(minor) => match VllmRelease::ALL.into_iter().rev().find(|r| r.minor() <= minor) {
                Some(r) if r.minor() == minor => (r, Fit::Known),
                Some(r) if r == VllmRelease::NEWEST => (r, Fit::Newer),
                Some(r) => (r, Fit::Older),
                None => (VllmRelease::OLDEST, Fit::Older),
            },
        };
        UpstreamVersion {
            reported: reported.to_owned(),
            rules,
            fit,
        }
    }

    /// Places the version a `/version` answer names (`{"version": "0.34.0"}`); `None` for a
    /// body of another shape.
    pub fn from_answer(body: &[u8]) -> Option<UpstreamVersion> {
        let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some(UpstreamVersion::place(answer.get("version")?.as_str()?))
    }

    /// What `status` warns about, when the rules are not the reported release's own.
    pub fn warning(&self) -> Option<String> {
        let known = format!(
            "sparkgate knows {} to {}",
            VllmRelease::OLDEST.version(),
            VllmRelease::NEWEST.version()
        );
        match self.fit {
            Fit::Known => None,
            Fit::Newer => Some(format!(
                "vLLM {} is newer than the releases sparkgate is tested with ({known}): the {} rules apply",
                self.reported, self.rules
            )),
            Fit::Older => Some(format!(
                "vLLM {} is not a release sparkgate is tested with ({known}): the {} rules apply",
                self.reported, self.rules
            )),
            Fit::Unreadable => Some(format!(
                "rank 0's /version `{}` is not a version ({known}): the {} rules apply",
                self.reported, self.rules
            )),
        }
    }
}

/// The leading dotted numbers of a version (`0.34.1rc2` → 0, 34, 1), if it starts with one.
fn numbers(version: &str) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    for part in version.trim().trim_start_matches('v').split('.') {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        let Ok(n) = digits.parse() else { break };
        out.push(n);
        if digits.len() < part.len() {
            break;
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_version_takes_the_rules_of_its_minor_release_or_the_nearest() {
        for (reported, rules, fit) in [
            ("0.33.0", VllmRelease::V0_33, Fit::Known),
            ("0.34.0", VllmRelease::V0_34, Fit::Known),
            ("0.34.2", VllmRelease::V0_34, Fit::Known),
            ("0.34.1.dev3+g1234abc", VllmRelease::V0_34, Fit::Known),
            ("0.35.0rc1", VllmRelease::V0_34, Fit::Newer),
            ("1.0.0", VllmRelease::V0_34, Fit::Newer),
            ("0.32.1", VllmRelease::V0_33, Fit::Older),
            ("0.9.2", VllmRelease::V0_33, Fit::Older),
            ("dev", VllmRelease::V0_33, Fit::Unreadable),
            ("", VllmRelease::V0_33, Fit::Unreadable),
        ] {
            let v = UpstreamVersion::place(reported);
            assert_eq!((v.rules, v.fit), (rules, fit), "{reported}");
            assert_eq!(v.warning().is_none(), fit == Fit::Known, "{reported}");
        }
    }

    #[test]
    fn a_version_answer_is_read_by_its_field() {
        let v = UpstreamVersion::from_answer(br#"{"version": "0.34.1"}"#).unwrap();
        assert_eq!((v.reported.as_str(), v.rules), ("0.34.1", VllmRelease::V0_34));
        assert_eq!(UpstreamVersion::from_answer(br#"{"v": "0.34.1"}"#), None);
        assert_eq!(UpstreamVersion::from_answer(b"not json"), None);
    }

    #[test]
    fn releases_parse_by_their_version_and_serialise_as_it() {
        for r in VllmRelease::ALL {
            assert_eq!(VllmRelease::parse(r.version()), Ok(r));
            assert_eq!(serde_json::to_value(r).unwrap(), r.version());
        }
        assert_eq!(VllmRelease::parse("0.34"), Ok(VllmRelease::V0_34));
        assert!(VllmRelease::parse("0.35.0").unwrap_err().contains("0.33.0, 0.34.0"));
        assert!(VllmRelease::OLDEST < VllmRelease::NEWEST);
    }
}
