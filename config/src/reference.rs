//! Text renderings of the knob table: docs/configuration.md's reference and the
//! `sparkgate config` listing.

use std::fmt::Write as _;

use crate::config::Config;
use crate::knobs::{Def, Knob, KNOBS};
use crate::profile::ProfileId;
use crate::section::Group;

fn cell(def: Def) -> String {
    match def {
        Def::Unused => "—".into(),
        Def::Value("") => "(empty)".into(),
        Def::Value(v) => format!("`{}`", v.replace('|', "\\|")),
        Def::Derived(how) => format!("*{how}*"),
    }
}

/// What the knob's rule accepts, per profile where the profiles differ.
fn accepts(k: &Knob) -> String {
    let used: Vec<(ProfileId, String)> = ProfileId::ALL
        .into_iter()
        .filter(|p| match p {
            ProfileId::DeepSeekV41Flash => k.deepseek != Def::Unused,
            ProfileId::Glm53Flash => k.glm != Def::Unused,
        })
        .map(|p| (p, k.rule_for(p).describe(p)))
        .collect();
    match used.as_slice() {
        [(_, a), (_, b)] if a != b => format!("deepseek: {a}; glm: {b}"),
        [(_, a), ..] => a.clone(),
        [] => String::new(),
    }
}

/// The configuration reference in Markdown, generated from the knob table. docs/configuration.md embeds it
/// between markers and a test keeps the two equal.
pub fn reference_markdown() -> String {
    let mut out = String::new();
    let mut group: Option<Group> = None;
    for k in KNOBS {
        if group != Some(k.group) {
            group = Some(k.group);
            let _ = write!(
                out,
                "\n### {}\n\n| Variable | deepseek-v4.1-flash | glm-5.3-flash | Accepts | Meaning |\n|---|---|---|---|---|\n",
                k.group.title()
            );
        }
        let mut name = format!("`{}`", k.name);
        for alias in k.aliases {
            let _ = write!(name, " (also `{alias}`)");
        }
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} |",
            cell(k.deepseek),
            cell(k.glm),
            accepts(k).replace('|', "\\|"),
            k.doc.replace('|', "\\|")
        );
    }
    out.trim_start().to_owned()
}

/// `NAME=value  # source`, grouped, secrets redacted: the text form of `sparkgate config`.
pub fn settings_table(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# profile {}", config.profile);
    if let Some(path) = &config.env_file {
        let _ = writeln!(out, "# env file {}", path.display());
    }
    let mut group: Option<Group> = None;
    for s in config.settings() {
        if group != Some(s.group) {
            group = Some(s.group);
            let _ = writeln!(out, "\n# == {} ==", s.group.title());
        }
        let value = shlex::try_quote(&s.value)
            .map(|q| q.into_owned())
            .unwrap_or_else(|_| s.value.clone());
        let alias = s.alias.map(|a| format!(" (set as {a})")).unwrap_or_default();
        let _ = writeln!(out, "{}={value}  # {}{alias}", s.name, s.source);
    }
    for w in config.warnings() {
        let _ = writeln!(out, "# warning: {w}");
    }
    out
}
