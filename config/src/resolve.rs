//! Layering: command line > process environment > `.env` > the demo's defaults > profile
//! default, per variable.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::config::Setting;
use crate::dotenv::DotEnv;
use crate::knobs::{self, Def, Knob};
use crate::profile::ProfileId;
use crate::source::Source;
use crate::spec::{self, SpecMethod};

/// A variable's value and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    pub(crate) value: String,
    pub(crate) source: Source,
    /// The name it was set under when that was an alias (e.g. `DSV41_HANG_SECONDS`).
    pub(crate) alias: Option<&'static str>,
}

/// The raw inputs, before any default applies.
#[derive(Debug)]
pub(crate) struct Layers<'a> {
    /// One group's section of GROUPS_FILE: above every other layer, for that group only.
    pub(crate) group: Option<&'a DotEnv>,
    pub(crate) command_line: &'a BTreeMap<String, String>,
    pub(crate) process: &'a BTreeMap<String, String>,
    pub(crate) dotenv: Option<&'a DotEnv>,
    pub(crate) demo: &'a BTreeMap<String, String>,
    pub(crate) deploy_dir: String,
}

impl Layers<'_> {
    /// The highest layer that sets `name` (or one of its aliases), if any. An empty value counts
    /// as set: `X= sparkgate …` means "X is empty", not "use the default".
    fn explicit(&self, knob: &'static Knob) -> Option<Resolved> {
        let names = std::iter::once(knob.name).chain(knob.aliases.iter().copied());
        let alias_of = |n: &'static str| (n != knob.name).then_some(n);
        if let Some(a) = self.group.and_then(|g| g.find(knob.name)) {
            return Some(Resolved {
                value: a.value.clone(),
                source: Source::EnvFile {
                    path: self.group.expect("found in it").path.clone(),
                    line: a.line,
                },
                alias: None,
            });
        }
        for name in names.clone() {
            if let Some(v) = self.command_line.get(name) {
                return Some(Resolved {
                    value: v.clone(),
                    source: Source::CommandLine,
                    alias: alias_of(name),
                });
            }
        }
        for name in names.clone() {
            if let Some(v) = self.process.get(name) {
                return Some(Resolved {
                    value: v.clone(),
                    source: Source::Process,
                    alias: alias_of(name),
                });
            }
        }
        let from_file = self.dotenv.and_then(|dotenv| {
            names
                .clone()
                .filter_map(|name| dotenv.find(name).map(|a| (name, a)))
                .max_by_key(|(_, a)| a.line)
                .map(|(name, a)| Resolved {
                    value: a.value.clone(),
                    source: Source::EnvFile {
                        path: dotenv.path.clone(),
                        line: a.line,
                    },
                    alias: alias_of(name),
                })
        });
        from_file.or_else(|| {
            self.demo.get(knob.name).map(|v| Resolved {
                value: v.clone(),
                source: Source::Demo,
                alias: None,
            })
        })
    }

    fn host(&self, name: &str, fallback: &str) -> String {
        self.process
            .get(name)
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| fallback.to_owned())
    }
}

/// Resolves variables of one profile on demand, memoised; defaults may refer to other variables.
#[derive(Debug)]
pub(crate) struct Resolver<'a> {
    pub(crate) layers: Layers<'a>,
    pub(crate) profile: ProfileId,
    cache: RefCell<BTreeMap<&'static str, Resolved>>,
}

impl<'a> Resolver<'a> {
    pub(crate) fn new(layers: Layers<'a>, profile: ProfileId) -> Self {
        Self {
            layers,
            profile,
            cache: RefCell::new(BTreeMap::new()),
        }
    }

    pub(crate) fn default_of(&self, knob: &Knob) -> Def {
        match self.profile {
            ProfileId::DeepSeekV41Flash => knob.deepseek,
            ProfileId::Glm53Flash => knob.glm,
        }
    }

    pub(crate) fn applies(&self, knob: &Knob) -> bool {
        self.default_of(knob) != Def::Unused
    }

    /// The value of `name`. Panics on a name missing from the knob table or unused by the
    /// profile: both are programming errors that every test run would hit.
    pub(crate) fn get(&self, name: &str) -> Resolved {
        let knob = knobs::knob(name).unwrap_or_else(|| panic!("unknown knob {name}"));
        assert!(self.applies(knob), "knob {name} is unused by profile {}", self.profile);
        if let Some(hit) = self.cache.borrow().get(knob.name) {
            return hit.clone();
        }
        let resolved = self.layers.explicit(knob).unwrap_or_else(|| Resolved {
            value: self.default_value(knob),
            source: Source::Profile { profile: self.profile },
            alias: None,
        });
        self.cache.borrow_mut().insert(knob.name, resolved.clone());
        resolved
    }

    pub(crate) fn value(&self, name: &str) -> String {
        self.get(name).value
    }

    fn default_value(&self, knob: &Knob) -> String {
        match self.default_of(knob) {
            Def::Unused => unreachable!("checked by get"),
            Def::Value(template) => self.expand(template),
            Def::Derived(_) => self.derive(knob.name),
        }
    }

    /// Expands `${NAME}` in a default: another variable, or HOME / USER of the process.
    fn expand(&self, template: &str) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .map(|e| start + e)
                .expect("defaults close every ${");
            let name = &rest[start + 2..end];
            out.push_str(&match name {
                "HOME" => self.layers.host("HOME", "/root"),
                "USER" => self.layers.host("USER", "root"),
                other => self.value(other),
            });
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// A user's home on a worker: this process's $HOME for the local user, else /home/<user>.
    pub(crate) fn home_of(&self, user: &str) -> String {
        if user == self.layers.host("USER", "root") {
            self.layers.host("HOME", "/root")
        } else {
            format!("/home/{user}")
        }
    }

    fn derive(&self, name: &str) -> String {
        match name {
            "DEPLOY_DIR" => self.layers.deploy_dir.clone(),
            "WORKER_HOME" => self.home_of(&self.value("WORKER_USER")),
            "NNODES" => match pairs_of(&self.value("WORKERS")) {
                0 => "2".into(),
                n => (n + 1).to_string(),
            },
            "MAX_NUM_SEQS" => {
                let modes = spec::mode_defs(self.profile);
                let active = self.value("SPEC_METHOD").parse::<SpecMethod>().ok();
                let mode = modes.iter().find(|m| Some(m.method) == active).unwrap_or(&modes[0]);
                mode.max_num_seqs.to_string()
            }
            "MODEL_CACHE_NAME" => hf_cache_name(&self.value("MODEL")),
            "DFLASH_MODEL_DIR" => format!(
                "/root/.cache/huggingface/hub/{}/snapshots/{}",
                hf_cache_name(&self.value("DFLASH_MODEL")),
                self.value("DFLASH_REVISION")
            ),
            other => unreachable!("no derivation for {other}"),
        }
    }
}

/// How many comma-separated items a list value has (empty items dropped).
fn pairs_of(raw: &str) -> usize {
    raw.split(',').filter(|item| !item.trim().is_empty()).count()
}

/// `org/name` → `models--org--name`, the Hugging Face cache directory of a repository.
pub(crate) fn hf_cache_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// Every knob the profile uses as `sparkgate config` shows it: value (secrets redacted),
/// source and group.
pub(crate) fn settings(r: &Resolver<'_>) -> Vec<Setting> {
    knobs::KNOBS
        .iter()
        .filter(|k| r.applies(k))
        .map(|k| {
            let resolved = r.get(k.name);
            Setting {
                name: k.name,
                value: knobs::redact(k.name, &resolved.value),
                source: resolved.source,
                alias: resolved.alias,
                group: k.group,
            }
        })
        .collect()
}
