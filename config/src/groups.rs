//! GROUPS_FILE: several rank groups behind one gateway. The file holds `[name]` sections of env
//! lines (the `.env` syntax); each section is the highest layer of its group's configuration,
//! over the command line, the environment and the env file, so a group differs from the others
//! only where its section says so. Each group is then built and validated like any
//! configuration; what the groups must not share (a head's ports, container names) is checked
//! across them.

use std::collections::BTreeSet;

use crate::config::{Config, LoadOptions};
use crate::dotenv::{Assignment, DotEnv};
use crate::error::{ConfigError, InvalidValue};
use crate::knobs;
use crate::section::Group;
use crate::sectioned;
pub use crate::sectioned::{GroupConfig, SINGLE_GROUP};
use crate::source::Source;

/// Variables one group may not set apart from the others: the gateway is shared, and every
/// group serves the same model.
const SHARED: &[&str] = &[
    "PROFILE",
    "SERVED_MODEL_NAME",
    "PORT",
    "DEPLOY_DIR",
    "MODEL",
    "IMAGE",
    // The shared queue orders by it.
    "SCHEDULING_POLICY",
];

impl Config {
    /// Every group of the deployment: one named [`SINGLE_GROUP`] without GROUPS_FILE, else one
    /// per section of the file, in file order; with MODELS, one per model (named by its
    /// profile, the default first), of which one runs at a time.
    pub fn load_groups(options: &LoadOptions) -> Result<Vec<GroupConfig>, ConfigError> {
        let base = Config::load(options)?;
        if !base.gateway.models.is_empty() {
            return crate::models::load(options, &base);
        }
        let Some(path) = base.gateway.groups_file.clone() else {
            return Ok(vec![GroupConfig {
                name: SINGLE_GROUP.into(),
                config: base,
            }]);
        };
        let mut errors = Vec::new();
        let mut groups = Vec::new();
        for (name, header, mut env) in sectioned::read(options, &path)? {
            errors.extend(sectioned::refused(&name, &env, refused));
            defaults(&base, &name, header, &mut env);
            groups.extend(sectioned::load(options, &name, &env, &mut errors)?);
        }
        errors.extend(clashes(&groups));
        if errors.is_empty() {
            Ok(groups)
        } else {
            Err(ConfigError::Invalid(errors))
        }
    }
}

/// Why a group's section may not set `a`: the variable is shared, or sparkgate does not know it.
fn refused(a: &Assignment) -> Option<String> {
    Some(match knobs::knob(&a.key) {
        None => "is not a sparkgate variable".to_owned(),
        Some(k) if k.group == Group::Gateway || k.group == Group::Secrets || SHARED.contains(&k.name) => {
            "must be the same for every group: set it outside GROUPS_FILE".to_owned()
        }
        Some(_) => return None,
    })
}

/// What a group gets unless its section says otherwise: its own log directory and container
/// names (groups may share a head), given as set on the section's `[name]` line.
fn defaults(base: &Config, name: &str, header: usize, env: &mut DotEnv) {
    let own = [
        ("LOG_DIR", base.supervision.log_dir.join(name).display().to_string()),
        ("CONTAINER_HEAD", format!("{}-{name}", base.containers.head_name)),
        ("CONTAINER_WORKER", format!("{}-{name}", base.containers.worker_name)),
    ];
    for (key, value) in own {
        if env.find(key).is_none() {
            env.assignments.push(Assignment {
                key: key.to_owned(),
                value,
                line: header,
            });
        }
    }
}

/// Groups whose heads share an address must not share a port or a container name.
fn clashes(groups: &[GroupConfig]) -> Vec<InvalidValue> {
    let mut seen: BTreeSet<(String, &'static str, String)> = BTreeSet::new();
    let mut out = Vec::new();
    for g in groups {
        let c = &g.config;
        let head = c.nodes.head_ip.to_string();
        let taken = [
            ("VLLM_PORT", c.ports.vllm.to_string()),
            ("MASTER_PORT", c.ports.master.to_string()),
            ("CONTAINER_HEAD", c.containers.head_name.clone()),
        ];
        for (key, value) in taken {
            if !seen.insert((head.clone(), key, value.clone())) {
                out.push(InvalidValue {
                    name: format!("[{}] {key}", g.name),
                    source: c
                        .settings()
                        .iter()
                        .find(|s| s.name == key)
                        .map_or(Source::Profile { profile: c.profile }, |s| s.source.clone()),
                    value,
                    rule: format!("must differ from every other group on head {head}"),
                });
            }
        }
    }
    out
}
