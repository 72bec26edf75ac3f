//! The gateway's rules whose right answer differs by vLLM release: one row each, read for the
//! release the groups run (`groups::Groups::rules`). docs/versions.md lists the same rows.

use sparkgate_config::VllmRelease;

/// A gateway rule that holds on some releases only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Chat's `tools: []` dropped when `tool_choice` means the same without it
    /// (`normalize::drop_empty_tools`).
    DropEmptyTools,
}

/// One row: the rule, its name in `/admin/status` and the docs, and the releases it holds on.
struct Row {
    rule: Rule,
    name: &'static str,
    on: &'static [VllmRelease],
}

const ROWS: &[Row] = &[
    // 0.33 refuses `tools: []` ("`tools` must not be an empty array"), which LiteLLM's
    // Responses bridge sends; 0.34 accepts it, falling back to tool_choice none.
    Row {
        rule: Rule::DropEmptyTools,
        name: "empty_tools",
        on: &[VllmRelease::V0_33],
    },
];

impl Rule {
    /// Whether the rule holds on `release`.
    pub(crate) fn holds(self, release: VllmRelease) -> bool {
        ROWS.iter().any(|row| row.rule == self && row.on.contains(&release))
    }
}

/// The names of the rules that hold on `release` (`/admin/status`'s `vllm.release_rules`).
pub(crate) fn holding(release: VllmRelease) -> Vec<&'static str> {
    ROWS.iter()
        .filter(|r| r.on.contains(&release))
        .map(|r| r.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant of `Rule` (a new one must be added here, and so get its row checked).
    const EVERY_RULE: &[Rule] = &[Rule::DropEmptyTools];

    #[test]
    fn every_rule_has_one_row_naming_known_releases() {
        for &rule in EVERY_RULE {
            assert_eq!(ROWS.iter().filter(|r| r.rule == rule).count(), 1, "{rule:?}");
        }
        let docs = include_str!("../../../docs/versions.md");
        for row in ROWS {
            assert!(!row.on.is_empty(), "{}", row.name);
            assert!(
                docs.contains(&format!("`{}`", row.name)),
                "docs/versions.md lists `{}`",
                row.name
            );
        }
        assert!(Rule::DropEmptyTools.holds(VllmRelease::V0_33));
        assert!(!Rule::DropEmptyTools.holds(VllmRelease::V0_34));
        assert_eq!(holding(VllmRelease::V0_33), ["empty_tools"]);
        assert!(holding(VllmRelease::V0_34).is_empty());
    }
}
