//! One builder for the gateways the integration tests start: `sparkgate serve` on 127.0.0.1
//! port 0, either supervising vllm-sim ranks of its own (RUNTIME=process, fresh loopback ports,
//! fast simulated loads) or in front of an upstream that already runs. Settings are named and
//! default to what most tests want, so a test says only what is particular to it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::harness::{binary_next_to, free_port, Gateway, Proc};

/// The profile a test gateway serves unless told otherwise.
pub const DEFAULT_PROFILE: &str = "deepseek-v4.1-flash";

/// The `sparkgate` binary built next to the `vllm-sim` binary `sim` (`cargo build --workspace`
/// builds both; a test knows `sim` as `env!("CARGO_BIN_EXE_vllm-sim")`).
pub fn sparkgate_bin(sim: &str) -> String {
    binary_next_to(sim, "sparkgate")
}

/// Where the gateway's model is served from.
#[derive(Debug, Clone)]
enum Ranks {
    /// Ranks of its own, their logs under `logs` (a fresh temporary directory, removed with the
    /// gateway's process, when the test names none).
    Supervised { logs: Option<PathBuf> },
    /// An upstream that already runs at this URL (gateway-only mode).
    Upstream(String),
}

/// Which process group the gateway runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcessGroup {
    /// The test's own, as any child's.
    Inherited,
    /// One it leads, as a shell's foreground job does: a terminal's Ctrl-C goes to that group.
    Own,
}

/// Settings of a test gateway; `start`, `start_unready` or `spawn` runs it.
#[derive(Debug, Clone)]
#[must_use]
pub struct TestGateway {
    sim: String,
    profile: String,
    ranks: Ranks,
    env: Vec<(String, String)>,
    group: ProcessGroup,
}

impl TestGateway {
    /// A gateway supervising ranks of the `vllm-sim` binary `sim`, serving DEFAULT_PROFILE; the
    /// `sparkgate` binary is the one built next to `sim`.
    pub fn builder(sim: &str) -> TestGateway {
        TestGateway {
            sim: sim.to_owned(),
            profile: DEFAULT_PROFILE.to_owned(),
            ranks: Ranks::Supervised { logs: None },
            env: Vec::new(),
            group: ProcessGroup::Inherited,
        }
    }

    pub fn profile(mut self, profile: &str) -> Self {
        self.profile = profile.to_owned();
        self
    }

    /// The ranks' log directory (LOG_DIR), for a test that reads the logs or starts a second
    /// gateway over the same directory.
    pub fn logs(mut self, dir: &Path) -> Self {
        self.ranks = Ranks::Supervised {
            logs: Some(dir.to_owned()),
        };
        self
    }

    /// Gateway-only mode in front of the server at `addr`: no ranks of its own.
    pub fn upstream(self, addr: SocketAddr) -> Self {
        self.upstream_url(&format!("http://{addr}"))
    }

    /// Gateway-only mode in front of `url`, which need not answer.
    pub fn upstream_url(mut self, url: &str) -> Self {
        self.ranks = Ranks::Upstream(url.to_owned());
        self
    }

    /// One more environment variable; a later value for the same name wins.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// More environment variables, in order.
    pub fn envs<K: AsRef<str>, V: AsRef<str>>(mut self, pairs: &[(K, V)]) -> Self {
        self.env.extend(
            pairs
                .iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())),
        );
        self
    }

    /// The gateway leads a process group of its own.
    pub fn own_process_group(mut self) -> Self {
        self.group = ProcessGroup::Own;
        self
    }

    /// Starts the gateway and waits until `/ready` answers 200.
    pub fn start(self) -> Gateway {
        let gw = self.start_unready();
        gw.wait_ready();
        gw
    }

    /// Starts the gateway and waits only until it listens.
    pub fn start_unready(self) -> Gateway {
        Gateway::listening(self.spawn())
    }

    /// The gateway's process, without waiting for anything.
    pub fn spawn(self) -> Proc {
        let sparkgate = sparkgate_bin(&self.sim);
        let own_group = self.group == ProcessGroup::Own;
        match &self.ranks {
            Ranks::Upstream(url) => {
                let args = [
                    "--profile",
                    &self.profile,
                    "serve",
                    "--upstream",
                    url,
                    "--port",
                    "0",
                    "--bind",
                    "127.0.0.1",
                ]
                .map(String::from);
                // The response store goes to a directory of the gateway's own, unless given.
                let state = tempfile::tempdir().expect("a state directory");
                let store = state.path().join("responses.sqlite").display().to_string();
                let mut env = vec![("SPARKGATE_LOG", "info"), ("STORE_URL", &store)];
                env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                Proc::spawn_as(&sparkgate, &args, &env, own_group).keeping(state)
            }
            Ranks::Supervised { logs: Some(dir) } => self.spawn_supervised(&sparkgate, dir, own_group),
            Ranks::Supervised { logs: None } => {
                let dir = tempfile::tempdir().expect("a log directory");
                self.spawn_supervised(&sparkgate, dir.path(), own_group).keeping(dir)
            }
        }
    }

    /// `sparkgate serve` with RUNTIME=process and VLLM_BIN=vllm-sim on loopback, fresh ports.
    fn spawn_supervised(&self, sparkgate: &str, log_dir: &Path, own_group: bool) -> Proc {
        let (vllm_port, master_port) = (free_port().to_string(), free_port().to_string());
        let log = log_dir.display().to_string();
        let store = log_dir.join("state/responses.sqlite").display().to_string();
        let mut full: Vec<(&str, &str)> = vec![
            ("RUNTIME", "process"),
            ("VLLM_BIN", &self.sim),
            ("PORT", "0"),
            ("BIND_ADDR", "127.0.0.1"),
            ("HEAD_IP", "127.0.0.1"),
            ("WORKER_IP", "127.0.0.1"),
            ("VLLM_PORT", &vllm_port),
            ("MASTER_PORT", &master_port),
            ("LOG_DIR", &log),
            ("SIM_LOAD_SECONDS", "0"),
            ("SIM_SPEED", "instant"),
            ("RESTART_BACKOFF_INITIAL", "0.2"),
            ("READY_TIMEOUT", "60"),
            ("WEIGHTS_GIB_PER_RANK", ""),
            ("SPARKGATE_LOG", "info"),
            // The response store beside the logs, unless given (a second gateway over the same
            // log directory shares it).
            ("STORE_URL", &store),
        ];
        // WORKERS lists the workers itself: the one-worker form may not be set beside it.
        if self.env.iter().any(|(k, _)| k == "WORKERS") {
            full.retain(|(k, _)| *k != "WORKER_IP");
        }
        full.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let rank_env = rank_env(&full);
        full.retain(|(k, _)| *k != "RANK_ENV");
        full.push(("RANK_ENV", &rank_env));
        let args = ["--profile", &self.profile, "serve"].map(String::from);
        Proc::spawn_as(sparkgate, &args, &full, own_group)
    }
}

/// RANK_ENV for `env`: the ranks get only the plan's environment, so the simulator's settings
/// (SIM_*, the last value of each) go by RANK_ENV, before any RANK_ENV the test gave.
fn rank_env(env: &[(&str, &str)]) -> String {
    let mut sim: Vec<(&str, &str)> = Vec::new();
    for (k, v) in env.iter().filter(|(k, _)| k.starts_with("SIM_")) {
        sim.retain(|(seen, _)| seen != k);
        sim.push((k, v));
    }
    let given = env
        .iter()
        .filter(|(k, v)| *k == "RANK_ENV" && !v.is_empty())
        .map(|(_, v)| v.to_string());
    let all: Vec<String> = sim.iter().map(|(k, v)| format!("{k}={v}")).chain(given).collect();
    all.join(",")
}

/// A GROUPS_FILE in `dir` of the groups `names` on loopback, each with its own ports; its path.
pub fn groups_file(dir: &Path, names: &[&str]) -> String {
    let mut text = String::new();
    for name in names {
        text.push_str(&format!(
            "[{name}]\nVLLM_PORT={}\nMASTER_PORT={}\n",
            free_port(),
            free_port()
        ));
    }
    let path = dir.join("groups.env");
    std::fs::write(&path, text).expect("the groups file");
    path.display().to_string()
}
