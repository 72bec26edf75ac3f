//! The knob table's rules are what validation enforces: for every knob and profile, a value its
//! rule refuses is refused by `Config::load` with the rule's own message, and every default
//! passes its rule.

use std::collections::BTreeMap;

use crate::config::{Config, LoadOptions};
use crate::knobs::{Def, KNOBS};
use crate::profile::ProfileId;
use crate::rule::Rule;

/// A value `rule` refuses (`None` for a rule that takes anything).
fn refused(rule: &Rule) -> Option<String> {
    Some(match rule {
        Rule::Text => return None,
        Rule::Int(_, max) if *max < i64::MAX => (max + 1).to_string(),
        Rule::Optional(inner) | Rule::Because(inner, _) => return refused(inner),
        Rule::NonEmpty => String::new(),
        Rule::Word => "two words".into(),
        Rule::HttpUrl => "ftp://127.0.0.1".into(),
        Rule::AbsolutePath => "relative/dir".into(),
        Rule::DockerName => "-name".into(),
        Rule::ShellWords | Rule::Command => "\"open".into(),
        Rule::JsonObject => "[1]".into(),
        Rule::EnvPairs => "no-equals-sign".into(),
        Rule::EffortMap => "turbo=high".into(),
        Rule::Flag => "2".into(),
        _ => "not-a-valid-value".into(),
    })
}

fn load(profile: ProfileId, name: &str, value: &str) -> Result<Config, crate::ConfigError> {
    let process = BTreeMap::from([
        ("HOME".to_owned(), "/home/op".to_owned()),
        ("USER".to_owned(), "op".to_owned()),
        ("PROFILE".to_owned(), profile.as_str().to_owned()),
        (name.to_owned(), value.to_owned()),
    ]);
    Config::load(&LoadOptions {
        env_file: None,
        profile: None,
        overrides: BTreeMap::new(),
        demo: BTreeMap::new(),
        process_env: process,
        working_dir: std::env::temp_dir(),
    })
}

#[test]
fn every_rule_in_the_table_is_enforced_with_its_own_message() {
    let mut checked = 0;
    for profile in ProfileId::ALL {
        for knob in KNOBS.iter().filter(|k| k.name != "PROFILE") {
            let used = match profile {
                ProfileId::DeepSeekV41Flash => knob.deepseek,
                ProfileId::Glm53Flash => knob.glm,
            } != Def::Unused;
            let rule = knob.rule_for(profile);
            let Some(bad) = refused(&rule).filter(|_| used) else {
                continue;
            };
            let message = rule.check(&bad, profile);
            assert!(
                !message.is_empty(),
                "{profile} {}: {bad:?} should break {rule:?}",
                knob.name
            );
            let err = load(profile, knob.name, &bad)
                .err()
                .unwrap_or_else(|| panic!("{profile} {}={bad:?} was accepted", knob.name))
                .to_string();
            // A secret's value is never shown, neither in the line nor in its message.
            let shown = if knob.secret {
                assert!(
                    !message[0].contains(&bad),
                    "{}: {message:?} shows the secret",
                    knob.name
                );
                format!("{:?}", crate::secret::REDACTED)
            } else {
                format!("{bad:?}")
            };
            let expected = format!("{}={shown} (from process environment): {}", knob.name, message[0]);
            assert!(err.contains(&expected), "{profile}: expected {expected}\n got: {err}");
            checked += 1;
        }
    }
    assert!(checked > 200, "only {checked} rules were exercised");
}

#[test]
fn every_default_passes_its_own_rule() {
    for profile in ProfileId::ALL {
        let config = load(profile, "UNRELATED", "").unwrap_or_else(|e| panic!("{profile}: {e}"));
        for setting in config.settings() {
            let knob = crate::knobs::knob(setting.name).expect("a knob");
            let broken = knob.rule_for(profile).check(&setting.value, profile);
            assert!(
                broken.is_empty(),
                "{profile} {}={:?}: {broken:?}",
                setting.name,
                setting.value
            );
        }
    }
}
