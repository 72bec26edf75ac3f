//! MODELS: several models served from the same nodes, one loaded at a time. Each model is a
//! whole configuration of its own profile — the shared layers (command line, environment, env
//! file, demo) under its profile's defaults, with its MODELS_FILE `[profile]` section above them —
//! so it keeps its own plan, image, weights, MAX_NUM_SEQS, speculation, aliases and effort rules.
//! A setting whose default differs between the profiles must be set per model: set once for
//! every model, an IMAGE or SERVED_MODEL_NAME would run one model with the other's.

use crate::config::{Config, LoadOptions};
use crate::dotenv::{Assignment, DotEnv};
use crate::error::{ConfigError, InvalidValue};
use crate::knobs::{self, Def, Knob};
use crate::profile::ProfileId;
use crate::section::Group;
use crate::sectioned::{self, GroupConfig};
use crate::source::Source;

/// Sections of the configuration reference whose per-profile defaults make a model what it is:
/// a value set for every model at once there is refused when the two profiles' defaults differ.
const IDENTITY: [Group; 5] = [
    Group::Serving,
    Group::Speculation,
    Group::Runtime,
    Group::Containers,
    Group::Storage,
];

/// Gateway settings a model's section may set: what clients call it and how its efforts map.
const PER_MODEL_GATEWAY: [&str; 2] = ["MODEL_ALIASES", "REASONING_EFFORT_MAP"];

/// Settings a section may not set: the gateway and its port are shared, and the section's name
/// is its profile.
const SHARED: [&str; 4] = ["PROFILE", "PORT", "DEPLOY_DIR", "SCHEDULING_POLICY"];

/// Every model of a MODELS configuration, the default (loaded at start) first; each named by its
/// profile. `base` is the configuration loaded without any section.
pub(crate) fn load(options: &LoadOptions, base: &Config) -> Result<Vec<GroupConfig>, ConfigError> {
    let mut errors = shared_identity(base);
    let profile_set = base
        .settings()
        .iter()
        .any(|s| s.name == "PROFILE" && !matches!(s.source, Source::Profile { .. }));
    if profile_set && base.gateway.models.first() != Some(&base.profile) {
        errors.push(invalid(
            base,
            "PROFILE",
            "names a model other than the first of MODELS (the default, loaded at start): drop PROFILE or put it first in MODELS",
        ));
    }
    if base.gateway.groups_file.is_some() {
        errors.push(invalid(
            base,
            "MODELS",
            "cannot be combined with GROUPS_FILE (one group serves the models in turn)",
        ));
    }
    let mut sections = match &base.gateway.models_file {
        Some(path) => sectioned::read(options, path)?,
        None => Vec::new(),
    };
    for (name, line, _) in &sections {
        if !base.gateway.models.iter().any(|p| p.as_str() == name) {
            errors.push(InvalidValue {
                name: format!("[{name}]"),
                value: String::new(),
                source: Source::EnvFile {
                    path: base.gateway.models_file.clone().unwrap_or_default(),
                    line: *line,
                },
                rule: format!("must name a model of MODELS ({})", words(&base.gateway.models)),
            });
        }
    }
    let mut models = Vec::new();
    for profile in &base.gateway.models {
        let at = sections.iter().position(|(n, _, _)| n == profile.as_str());
        let (header, mut env) = match at {
            Some(i) => {
                let (_, header, env) = sections.swap_remove(i);
                errors.extend(sectioned::refused(profile.as_str(), &env, refused));
                (header, env)
            }
            None => (0, DotEnv::empty(base.gateway.models_file.clone().unwrap_or_default())),
        };
        own_defaults(base, profile.as_str(), header, &mut env);
        let mut one = options.clone();
        one.profile = Some(profile.as_str().to_owned());
        models.extend(sectioned::load(&one, profile.as_str(), &env, &mut errors)?);
    }
    errors.extend(clashing_names(&models));
    if errors.is_empty() {
        Ok(models)
    } else {
        Err(ConfigError::Invalid(errors))
    }
}

fn words(models: &[ProfileId]) -> String {
    models.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
}

fn invalid(base: &Config, name: &str, rule: &str) -> InvalidValue {
    let setting = base.settings().iter().find(|s| s.name == name);
    InvalidValue {
        name: name.to_owned(),
        value: setting.map(|s| s.value.clone()).unwrap_or_default(),
        source: setting.map_or(Source::Profile { profile: base.profile }, |s| s.source.clone()),
        rule: rule.to_owned(),
    }
}

/// Whether a knob's default tells the profiles apart, in a section that makes a model what it is.
fn identity(knob: &Knob) -> bool {
    IDENTITY.contains(&knob.group)
        && knob.deepseek != knob.glm
        && knob.deepseek != Def::Unused
        && knob.glm != Def::Unused
}

/// The identity settings set for every model at once (on the command line, in the environment
/// or in the env file).
fn shared_identity(base: &Config) -> Vec<InvalidValue> {
    base.settings()
        .iter()
        .filter(|s| matches!(s.source, Source::CommandLine | Source::Process | Source::EnvFile { .. }))
        .filter(|s| knobs::knob(s.name).is_some_and(identity))
        .map(|s| InvalidValue {
            name: s.name.to_owned(),
            value: s.value.clone(),
            source: s.source.clone(),
            rule: "differs by profile, so with MODELS it is set per model, in its MODELS_FILE `[profile]` section"
                .into(),
        })
        .collect()
}

/// Why a model's section may not set `a`: the gateway's and the shared settings, and what
/// sparkgate does not know.
fn refused(a: &Assignment) -> Option<String> {
    Some(match knobs::knob(&a.key) {
        None => "is not a sparkgate variable".to_owned(),
        Some(k) if SHARED.contains(&k.name) => "is shared by every model: set it outside MODELS_FILE".to_owned(),
        Some(k) if (k.group == Group::Gateway && !PER_MODEL_GATEWAY.contains(&k.name)) || k.group == Group::Secrets => {
            "is the gateway's, shared by every model: set it outside MODELS_FILE".to_owned()
        }
        Some(_) => return None,
    })
}

/// What a model gets unless its section says otherwise: its own log directory (epochs, rank
/// state and diagnostics apart), given as set on the section's `[profile]` line.
fn own_defaults(base: &Config, model: &str, header: usize, env: &mut DotEnv) {
    if env.find("LOG_DIR").is_none() {
        env.assignments.push(Assignment {
            key: "LOG_DIR".to_owned(),
            value: base.supervision.log_dir.join(model).display().to_string(),
            line: header,
        });
    }
}

/// Two models a client could not tell apart: the same served name.
fn clashing_names(models: &[GroupConfig]) -> Vec<InvalidValue> {
    let mut out = Vec::new();
    for (i, m) in models.iter().enumerate() {
        let name = &m.config.serving.served_model_name;
        if models[..i].iter().any(|o| &o.config.serving.served_model_name == name) {
            out.push(InvalidValue {
                name: format!("[{}] SERVED_MODEL_NAME", m.name),
                value: name.clone(),
                source: m
                    .config
                    .settings()
                    .iter()
                    .find(|s| s.name == "SERVED_MODEL_NAME")
                    .map_or(
                        Source::Profile {
                            profile: m.config.profile,
                        },
                        |s| s.source.clone(),
                    ),
                rule: "must differ from every other model's".into(),
            });
        }
    }
    out
}
