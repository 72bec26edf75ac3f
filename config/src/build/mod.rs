//! Turns resolved strings into the typed `Config`. Every knob's own rule (the table's `Rule`)
//! is checked first, in one pass; the builder then reads typed values and checks only the
//! relations between knobs. Every problem is collected, so one run names them all.

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::choice::Choice;
use crate::config::*;
use crate::error::{ConfigError, InvalidValue};
use crate::knobs::{self, KNOBS};
use crate::profile::ProfileId;
use crate::resolve::{Layers, Resolver};
use crate::rule::{self, Rule};
use crate::secret::Secret;
use crate::words::shell_words;

mod gateway;
mod prepare;
mod serving;
mod supervision;

pub(crate) fn build(layers: Layers<'_>, env_file: Option<PathBuf>) -> Result<Config, ConfigError> {
    // PROFILE has the same default in every profile, so any resolver can read it.
    let probe = Resolver::new(layers, ProfileId::DeepSeekV41Flash);
    let chosen = probe.get("PROFILE");
    // With MODELS the first model is the default, unless PROFILE names it.
    let first = probe
        .get("MODELS")
        .value
        .split(',')
        .map(str::trim)
        .find(|w| !w.is_empty())
        .map(str::to_owned);
    let chosen = match (first, &chosen.source) {
        (Some(first), crate::source::Source::Profile { .. }) => crate::resolve::Resolved { value: first, ..chosen },
        _ => chosen,
    };
    let profile = ProfileId::from_str(&chosen.value).map_err(|_| {
        ConfigError::Invalid(vec![InvalidValue {
            name: "PROFILE".into(),
            value: chosen.value.clone(),
            source: chosen.source.clone(),
            rule: Rule::OneOf(ProfileId::WORDS)
                .check(&chosen.value, ProfileId::DeepSeekV41Flash)
                .join("; "),
        }])
    })?;
    let b = Builder {
        r: Resolver::new(probe.layers, profile),
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    b.finish(env_file)
}

struct Builder<'a> {
    r: Resolver<'a>,
    errors: Vec<InvalidValue>,
    warnings: Vec<String>,
}

impl Builder<'_> {
    fn finish(mut self, env_file: Option<PathBuf>) -> Result<Config, ConfigError> {
        self.check_rules();
        let nodes = self.nodes();
        let ports = self.ports();
        let serving = self.serving();
        let speculation = self.speculation(&serving);
        self.profile_constraints(&serving, &speculation);
        let containers = self.containers();
        let storage = self.storage();
        let supervision = self.supervision();
        let gateway = self.gateway();
        let preparation = self.preparation(&nodes);
        let secrets = self.secrets();
        let (rank_env, mut warnings) = crate::passthrough::rank_env_and_warnings(&self.r);
        warnings.append(&mut self.warnings);
        let settings = crate::resolve::settings(&self.r);
        if !self.errors.is_empty() {
            return Err(ConfigError::Invalid(self.errors));
        }
        Ok(Config {
            profile: self.r.profile,
            deploy_dir: PathBuf::from(self.r.layers.deploy_dir.clone()),
            env_file,
            nodes,
            ports,
            serving,
            speculation,
            containers,
            storage,
            preparation,
            supervision,
            gateway,
            secrets,
            rank_env,
            settings,
            warnings,
        })
    }

    /// Each knob the profile uses against its own rule.
    fn check_rules(&mut self) {
        let profile = self.r.profile;
        let used: Vec<_> = KNOBS.iter().filter(|k| self.r.applies(k)).collect();
        for knob in used {
            let raw = self.r.value(knob.name);
            for broken in knob.rule_for(profile).check(&raw, profile) {
                self.fail(knob.name, broken);
            }
        }
    }

    /// Records that `name`'s value breaks `rule` (a relation to other knobs, or its own rule).
    fn fail(&mut self, name: &str, rule: impl Into<String>) {
        let resolved = self.r.get(name);
        let display_name = match resolved.alias {
            Some(alias) => format!("{name} (set as {alias})"),
            None => name.to_owned(),
        };
        self.errors.push(InvalidValue {
            name: display_name,
            value: knobs::redact(name, &resolved.value),
            source: resolved.source,
            rule: rule.into(),
        });
    }

    /// Whether the profile uses `name` at all (the table's default is not `Unused`).
    fn used(&self, name: &str) -> bool {
        knobs::knob(name).is_some_and(|k| self.r.applies(k))
    }

    fn rule(&self, name: &str) -> Rule {
        knobs::knob(name)
            .unwrap_or_else(|| panic!("unknown knob {name}"))
            .rule_for(self.r.profile)
    }

    fn text(&self, name: &str) -> String {
        self.r.value(name)
    }

    fn opt_text(&self, name: &str) -> Option<String> {
        Some(self.text(name)).filter(|v| !v.is_empty())
    }

    /// An integer knob's value; a value its rule refused (already reported) reads as the
    /// rule's minimum, so relations checked afterwards see a sane number.
    fn num<T: TryFrom<i64> + Default>(&self, name: &str) -> T {
        let min = match self.rule(name) {
            Rule::Int(min, _) | Rule::Because(&Rule::Int(min, _), _) => min,
            other => panic!("{name} is read as an integer but its rule is {other:?}"),
        };
        let v = rule::int(&self.text(name)).unwrap_or(min);
        T::try_from(v).unwrap_or_default()
    }

    fn opt_num<T: TryFrom<i64>>(&self, name: &str) -> Option<T> {
        assert!(
            matches!(self.rule(name), Rule::Optional(Rule::Int(..))),
            "{name} is read as an optional integer"
        );
        rule::int(&self.text(name)).and_then(|v| T::try_from(v).ok())
    }

    fn float(&self, name: &str) -> f64 {
        match self.rule(name) {
            Rule::Float(_, max) => rule::decimal(&self.text(name)).unwrap_or(max),
            other => panic!("{name} is read as a decimal but its rule is {other:?}"),
        }
    }

    fn opt_float(&self, name: &str) -> Option<f64> {
        assert!(
            matches!(self.rule(name), Rule::Optional(Rule::Float(..))),
            "{name} is read as an optional decimal"
        );
        rule::decimal(&self.text(name))
    }

    fn seconds(&self, name: &str) -> Duration {
        Duration::from_secs(self.num(name))
    }

    fn seconds_f64(&self, name: &str) -> Duration {
        Duration::from_secs_f64(self.float(name))
    }

    fn flag(&self, name: &str) -> bool {
        debug_assert_eq!(self.rule(name), Rule::Flag, "{name} is read as a flag");
        self.text(name) == "1"
    }

    fn choice<T: Choice>(&self, name: &str) -> T {
        debug_assert!(
            matches!(self.rule(name), Rule::OneOf(_) | Rule::SpecMode),
            "{name} is read as a choice"
        );
        self.text(name).parse().unwrap_or_else(|_| T::first())
    }

    fn ip(&self, name: &str) -> IpAddr {
        self.text(name).parse().unwrap_or(IpAddr::from([127, 0, 0, 1]))
    }

    /// A command line's words, split as its rule says.
    fn words(&self, name: &str) -> Vec<String> {
        let raw = self.text(name);
        match self.rule(name) {
            Rule::ShellWords => shlex::split(&raw),
            Rule::Command | Rule::Optional(Rule::Command) => shell_words(&raw),
            other => panic!("{name} is read as words but its rule is {other:?}"),
        }
        .unwrap_or_default()
    }

    fn secret(&self, name: &str) -> Option<Secret> {
        self.opt_text(name).map(Secret::new)
    }

    /// Comma-separated items, trimmed, empty ones dropped.
    fn list(&self, name: &str) -> Vec<String> {
        self.text(name)
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(String::from)
            .collect()
    }

    fn nodes(&mut self) -> Nodes {
        let nic = |b: &Self, side: &str| Nic {
            ifname: b.text(&format!("{side}_CX7_IF")),
            hca: b.text(&format!("{side}_CX7_IB")),
            gid_index: b.num(&format!("{side}_GID")),
        };
        let mut nodes = Nodes {
            head_ip: self.ip("HEAD_IP"),
            ssh: SshSettings {
                keyfile: self.opt_text("WORKER_SSH_KEY").map(PathBuf::from),
                known_hosts: self.choice("SSH_KNOWN_HOSTS"),
                known_hosts_file: self.opt_text("SSH_KNOWN_HOSTS_FILE").map(PathBuf::from),
                connect_timeout: self.seconds("SSH_CONNECT_TIMEOUT"),
                control_dir: PathBuf::from(self.text("SSH_CONTROL_DIR")),
                worker_docker_socket: self.text("WORKER_DOCKER_SOCKET"),
            },
            head_nic: nic(self, "HEAD"),
            workers: Vec::new(),
        };
        let one = Worker {
            rank: 1,
            ip: self.ip("WORKER_IP"),
            user: self.text("WORKER_USER"),
            home: self.text("WORKER_HOME"),
            ssh: self.text("WORKER_SSH"),
            ssh_port: self.num("WORKER_SSH_PORT"),
            nic: nic(self, "WORKER"),
            label: "worker".into(),
            configured_home: self.text("WORKER_HOME"),
        };
        nodes.workers = self.workers(one, nodes.head_ip);
        nodes
    }

    /// Ranks 1..NNODES: the entries of WORKERS, each inheriting `one` (the WORKER_* knobs) where
    /// it says nothing; without WORKERS, `one` itself when NNODES is 2.
    fn workers(&mut self, one: Worker, head_ip: IpAddr) -> Vec<Worker> {
        let nnodes: usize = self.num("NNODES");
        let entries: Vec<rule::WorkerEntry> = self
            .list("WORKERS")
            .iter()
            .filter_map(|e| rule::worker_entry(e).ok())
            .collect();
        if entries.is_empty() {
            if nnodes > 2 {
                self.fail(
                    "NNODES",
                    "must be 1 or 2 without WORKERS: list every worker in WORKERS for more nodes",
                );
            }
            return if nnodes >= 2 { vec![one] } else { Vec::new() };
        }
        for set_too in ["WORKER_IP", "WORKER_SSH"] {
            if !matches!(self.r.get(set_too).source, crate::source::Source::Profile { .. }) {
                self.fail(
                    set_too,
                    "must not be set with WORKERS: list the worker in WORKERS instead",
                );
            }
        }
        if nnodes != entries.len() + 1 {
            self.fail(
                "NNODES",
                format!("must be 1 + the {} WORKERS ({})", entries.len(), entries.len() + 1),
            );
        }
        let mut workers: Vec<Worker> = Vec::new();
        for (i, e) in entries.into_iter().enumerate() {
            let port = e.port.unwrap_or(one.ssh_port);
            if e.ip != head_ip && workers.iter().any(|w| w.ip == e.ip && w.ssh_port == port) {
                self.fail(
                    "WORKERS",
                    format!("must list each worker once: {} is listed twice", e.ip),
                );
            }
            let user = e.user.unwrap_or_else(|| one.user.clone());
            let home = if user == one.user {
                one.home.clone()
            } else {
                self.r.home_of(&user)
            };
            workers.push(Worker {
                rank: i as u32 + 1,
                ssh: format!("{user}@{}", e.ip),
                ip: e.ip,
                user,
                home,
                ssh_port: port,
                label: String::new(),
                ..one.clone()
            });
        }
        let many = workers.len() > 1;
        for w in &mut workers {
            w.label = if many {
                format!("worker {}", w.rank)
            } else {
                "worker".into()
            };
        }
        workers
    }

    fn ports(&mut self) -> Ports {
        // vLLM's own port matters only when the gateway fronts the local rank 0 (not when it
        // fronts another vLLM given by UPSTREAM_URL).
        let local_rank =
            self.text("UPSTREAM_URL").trim_end_matches('/') == format!("http://127.0.0.1:{}", self.text("VLLM_PORT"));
        for (a, b) in [
            ("PORT", "VLLM_PORT"),
            ("PORT", "MASTER_PORT"),
            ("VLLM_PORT", "MASTER_PORT"),
        ] {
            if b == "VLLM_PORT" && !local_rank {
                continue;
            }
            if self.text(a) == self.text(b) {
                self.fail(b, format!("must differ from {a}"));
            }
        }
        Ports {
            public: self.num("PORT"),
            vllm: self.num("VLLM_PORT"),
            master: self.num("MASTER_PORT"),
        }
    }

    fn secrets(&mut self) -> Secrets {
        Secrets {
            hf_token: self.secret("HF_TOKEN"),
            ghcr_user: self.text("GHCR_USER"),
            ghcr_token: self.secret("GHCR_TOKEN"),
            vllm_api_key: self.secret("VLLM_API_KEY"),
            api_keys: self.api_keys(),
            admin_token: self.secret("ADMIN_TOKEN"),
        }
    }
}

#[cfg(test)]
mod rules_tests;
