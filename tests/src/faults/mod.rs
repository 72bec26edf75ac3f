//! The fault matrix: client loops mixing chat, chat stream, completions stream, Responses
//! stream and Anthropic Messages stream run against the demo topology (`sparkgate serve`, two
//! vllm-sim rank processes) while each fault is injected in turn; every request is classified
//! (`client.rs`), and after each fault the group must be ready again with no rank process left
//! over from an earlier epoch. The SSH faults run on rigs of their own: the worker rank as a
//! process over SSH (`Rig::over_ssh`), and as a container on a Docker daemon reached over SSH
//! (`Rig::docker_over_ssh`). `tests/tests/fault_matrix.rs` runs a subset; the `fault-matrix`
//! binary runs them all and prints the table BENCHMARKS.md holds.

pub mod client;
pub mod trail;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use client::{Kind, Outcome};

use crate::harness::{free_port, Gateway, Proc};
use crate::http::request;
use crate::test_gateway::TestGateway;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

/// Every fault of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    KillRank0,
    KillRank1,
    StopRank0,
    StopRank1,
    StopRank0Resumed,
    StopRank1Resumed,
    Restart,
    RestartForce,
    StartWhileRunning,
    SpecSwitch,
    SigtermWithinDrain,
    SigtermPastDrain,
    SigintGroup,
    KillGateway,
    /// The worker rank runs over SSH (`Rig::over_ssh`); every SSH session is cut.
    SshCut,
    /// The worker rank is a container on a daemon reached over SSH (`Rig::docker_over_ssh`);
    /// every SSH session is cut.
    DockerSshCut,
}

impl Fault {
    pub const ALL: [Fault; 14] = [
        Fault::KillRank0,
        Fault::KillRank1,
        Fault::StopRank0,
        Fault::StopRank1,
        Fault::StopRank0Resumed,
        Fault::StopRank1Resumed,
        Fault::Restart,
        Fault::RestartForce,
        Fault::StartWhileRunning,
        Fault::SpecSwitch,
        Fault::SigtermWithinDrain,
        Fault::SigtermPastDrain,
        Fault::SigintGroup,
        Fault::KillGateway,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillRank0 => "SIGKILL rank 0",
            Fault::KillRank1 => "SIGKILL rank 1",
            Fault::StopRank0 => "SIGSTOP rank 0",
            Fault::StopRank1 => "SIGSTOP rank 1",
            Fault::StopRank0Resumed => "SIGSTOP rank 0, SIGCONT after 2 s",
            Fault::StopRank1Resumed => "SIGSTOP rank 1, SIGCONT after 2 s",
            Fault::Restart => "restart",
            Fault::RestartForce => "restart --force",
            Fault::StartWhileRunning => "start while running",
            Fault::SpecSwitch => "spec-mode switch under load",
            Fault::SigtermWithinDrain => "SIGTERM within the drain",
            Fault::SigtermPastDrain => "SIGTERM past the drain",
            Fault::SigintGroup => "SIGINT to the process group",
            Fault::KillGateway => "SIGKILL the gateway, start again",
            Fault::SshCut => "the worker's SSH session cut (process over SSH)",
            Fault::DockerSshCut => "the worker's SSH session cut (docker over SSH)",
        }
    }

    /// A SIGKILLed gateway cannot answer what it had accepted: those requests are cut with it.
    fn cuts_accepted(self) -> bool {
        self == Fault::KillGateway
    }
}

/// The counts and times of one fault.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub completed: usize,
    pub explicit_errors: usize,
    pub truncated: usize,
    pub hung: usize,
    pub lost: usize,
    pub refused: usize,
    /// 502s saying the upstream was unreachable: requests that never reached a rank.
    pub unreachable_502: usize,
    /// Accepted requests cut by a SIGKILLed gateway (only that fault).
    pub cut_with_gateway: usize,
    /// Streams the gateway continues (chat, completions) that ended with an error event
    /// instead (an admission's 429/503 is a refusal, not this).
    pub resumable_errors: usize,
    /// Completed continued-kind streams whose text differs from an uninterrupted run's: text
    /// duplicated or missing at a splice.
    pub splice_mismatches: usize,
    /// Streams the gateway continued (`sparkgate_stream_resumes_total` over the fault).
    pub resumed: u64,
    pub orphans: usize,
    /// What the fault logged and the restarts it counted (none for the faults that start
    /// another gateway: its log is a new one).
    pub trail: Option<trail::Trail>,
    pub detected_s: Option<f64>,
    pub recovered_s: f64,
    pub samples: Vec<String>,
}

impl Row {
    fn count(&mut self, kind: Kind, outcome: Outcome, cuts_accepted: bool) {
        if kind.resumable() && matches!(&outcome, Outcome::ExplicitError { status, .. } if !matches!(status, 429 | 503))
        {
            self.resumable_errors += 1;
            if let Outcome::ExplicitError { message, .. } = &outcome {
                self.samples.push(format!("{kind:?}: {message}"));
            }
        }
        match outcome {
            Outcome::Completed => self.completed += 1,
            Outcome::ExplicitError { status: 502, message } if message.contains("unreachable") => {
                self.unreachable_502 += 1;
                self.samples.push(format!("502 {message}"));
            }
            Outcome::ExplicitError { .. } => self.explicit_errors += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::Lost(_) | Outcome::Truncated(_) if cuts_accepted => self.cut_with_gateway += 1,
            Outcome::Truncated(why) => {
                self.truncated += 1;
                self.samples.push(why);
            }
            Outcome::Hung => self.hung += 1,
            Outcome::Lost(how) => {
                self.lost += 1;
                self.samples.push(format!("lost: {how}"));
            }
        }
    }

    /// Counts every outcome; a continued kind's text against `reference`.
    fn tally(
        &mut self,
        outcomes: Vec<(Kind, Outcome, Option<String>)>,
        reference: &[(Kind, Option<String>)],
        cuts: bool,
    ) {
        for (kind, o, text) in outcomes {
            let expected = reference.iter().find(|(k, _)| *k == kind).and_then(|(_, t)| t.as_ref());
            if let (Some(got), Some(want)) = (&text, expected) {
                if got != want {
                    self.splice_mismatches += 1;
                    self.samples.push(format!("{kind:?} text differs: {got:?} / {want:?}"));
                }
            }
            self.count(kind, o, cuts);
        }
    }

    /// Nothing silently truncated, hung or lost, no 502 for a request that never reached a
    /// rank, nothing left running.
    pub fn clean(&self) -> bool {
        self.truncated + self.hung + self.lost + self.unreachable_502 + self.orphans + self.splice_mismatches == 0
    }
}

/// How the rig's ranks run.
#[derive(Debug)]
enum Ranks {
    Processes,
    /// Containers labelled `sparkgate.group=<group>` (removed when the rig is dropped).
    Containers {
        group: String,
    },
}

/// The demo topology with fixed ports, so a gateway started again is found where it was.
#[derive(Debug)]
pub struct Rig {
    ranks: Ranks,
    model: String,
    /// Directories the rig's ranks use (the containers' model and HF directories).
    dirs: Vec<tempfile::TempDir>,
    /// How the rig's gateway is started, again after each kill.
    gateway_settings: TestGateway,
    /// The log directory every gateway of the rig shares (its ranks.json lets one adopt).
    _logs: tempfile::TempDir,
    pub gateway: Option<Proc>,
    pub addr: Arc<RwLock<SocketAddr>>,
    master_port: u16,
    /// The worker host of `over_ssh` (127.0.0.2), and its SSH control directory.
    sshd: Option<(crate::hosts::Sshd, tempfile::TempDir)>,
}

impl Rig {
    pub fn start(sim: &str) -> Rig {
        Self::with(sim, None, Vec::new())
    }

    /// The demo topology with the worker rank on 127.0.0.2 through a real sshd
    /// (RUNTIME=process over SSH).
    pub fn over_ssh(sim: &str) -> Rig {
        Self::with(sim, Some(ssh_worker()), Vec::new())
    }

    /// RUNTIME=docker with the simulator image: the head container on this machine's daemon,
    /// the worker's on the daemon of 127.0.0.2 reached through a real sshd (the same daemon,
    /// forwarded over SSH).
    pub fn docker_over_ssh(sim: &str) -> Rig {
        let model = format!("faults-{}", std::process::id());
        let host_dir = tempfile::tempdir().expect("model dir");
        let mut env = crate::hosts::docker_env(sim, &model, host_dir.path());
        env.push(("STOP_RANKS_ON_EXIT".into(), "1".into()));
        let mut rig = Self::with(sim, Some(ssh_worker()), env);
        let group = format!("deepseek-v4.1-flash.{model}");
        rig.ranks = Ranks::Containers { group: group.clone() };
        rig.model = model;
        rig.dirs.push(host_dir);
        let s = rig.status();
        assert_eq!(s["supervisor"]["runtime"], "docker", "{s}");
        assert_eq!(
            crate::hosts::group_containers(&group).len(),
            2,
            "both ranks are containers: {s}"
        );
        rig
    }

    fn with(sim: &str, sshd: Option<(crate::hosts::Sshd, tempfile::TempDir)>, extra: Vec<(String, String)>) -> Rig {
        let (port, vllm, master) = (free_port(), free_port(), free_port());
        let env = [
            ("PORT", port.to_string()),
            ("VLLM_PORT", vllm.to_string()),
            ("MASTER_PORT", master.to_string()),
            ("SIM_SPEED", "20".into()),
            ("STALL_TIMEOUT", "10".into()),
            ("DRAIN_TIMEOUT", "3".into()),
            ("RESTART_BACKOFF_INITIAL", "0.5".into()),
            ("RESTART_BUDGET", "50".into()),
        ];
        let mut env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        if let Some((sshd, control)) = &sshd {
            env.extend(sshd.worker_env(control.path()));
        }
        env.extend(extra);
        let logs = tempfile::tempdir().expect("log dir");
        let mut rig = Rig {
            ranks: Ranks::Processes,
            model: MODEL.to_owned(),
            dirs: Vec::new(),
            gateway_settings: TestGateway::builder(sim)
                .logs(logs.path())
                .envs(&env)
                .own_process_group(),
            _logs: logs,
            gateway: None,
            addr: Arc::new(RwLock::new(SocketAddr::from(([127, 0, 0, 1], port)))),
            master_port: master,
            sshd,
        };
        rig.spawn_gateway();
        rig
    }

    fn spawn_gateway(&mut self) {
        let gw = Gateway::listening(self.gateway_settings.clone().spawn());
        *self.addr.write().expect("addr") = gw.addr;
        self.gateway = Some(gw.proc);
        assert!(self.wait_ready(Duration::from_secs(60)).is_some(), "the group is ready");
    }

    fn addr(&self) -> SocketAddr {
        *self.addr.read().expect("addr")
    }

    /// What each continued kind says without a fault (the simulator is deterministic).
    fn reference(&self, max_tokens: u32) -> Vec<(Kind, Option<String>)> {
        let at = *self.addr.read().expect("addr");
        Kind::ALL
            .iter()
            .filter(|k| k.resumable())
            .map(|&k| {
                (
                    k,
                    client::exchange_text(at, k, &self.model, max_tokens, Duration::from_secs(90)).1,
                )
            })
            .collect()
    }

    /// The gateway's `sparkgate_stream_resumes_total` (0 when it cannot be read).
    fn resumes(&self) -> u64 {
        let text = crate::http::try_request(self.addr(), "GET", "/metrics", &[], b"")
            .map(|r| r.text())
            .unwrap_or_default();
        text.lines()
            .find_map(|l| {
                l.strip_prefix("sparkgate_stream_resumes_total ")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map_or(0, |v| v as u64)
    }

    pub fn status(&self) -> Value {
        crate::http::try_request(self.addr(), "GET", "/admin/status", &[], b"").map_or(Value::Null, |r| r.json())
    }

    /// Waits until `/ready` answers 200; how long that took.
    pub fn wait_ready(&self, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < within {
            let ready = crate::http::try_request(self.addr(), "GET", "/ready", &[], b"");
            if ready.is_some_and(|r| r.status == 200) {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn rank_pid(&self, rank: u64) -> u32 {
        let s = self.status();
        let ranks = s["supervisor"]["ranks"].as_array().cloned().unwrap_or_default();
        ranks
            .iter()
            .find(|r| r["rank"] == rank)
            .and_then(|r| r["pid"].as_u64())
            .unwrap_or(0) as u32
    }

    /// Ranks of this group that the status does not list: processes or containers left over
    /// from an earlier epoch or gateway.
    pub fn orphans(&self) -> Vec<String> {
        match &self.ranks {
            Ranks::Processes => {
                let listed = [self.rank_pid(0), self.rank_pid(1)];
                crate::hosts::processes_with(&format!("--master-port {}", self.master_port))
                    .into_iter()
                    .filter(|p| !listed.contains(p))
                    .map(|p| p.to_string())
                    .collect()
            }
            Ranks::Containers { group } => {
                let s = self.status();
                let listed: Vec<String> = s["supervisor"]["ranks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["container"].as_str().map(str::to_owned))
                    .collect();
                crate::hosts::group_containers(group)
                    .into_iter()
                    .filter(|id| {
                        !listed
                            .iter()
                            .any(|l| id.starts_with(l.as_str()) || l.starts_with(id.as_str()))
                    })
                    .collect()
            }
        }
    }

    fn post(&self, path: &str, body: &Value) -> u16 {
        request(
            self.addr(),
            "POST",
            path,
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        )
        .status
    }

    fn signal_gateway(&mut self, sig: &str, group: bool) {
        let pid = self.gateway.as_ref().expect("gateway").pid();
        let target = if group { format!("-{pid}") } else { pid.to_string() };
        signal(&target, sig);
    }

    /// Injects `fault`; returns once the group has been asked to recover (or was restarted).
    fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::KillRank0 => signal(&self.rank_pid(0).to_string(), "-KILL"),
            Fault::KillRank1 => signal(&self.rank_pid(1).to_string(), "-KILL"),
            Fault::StopRank0 => signal(&self.rank_pid(0).to_string(), "-STOP"),
            Fault::StopRank1 => signal(&self.rank_pid(1).to_string(), "-STOP"),
            Fault::StopRank0Resumed | Fault::StopRank1Resumed => {
                let pid = self
                    .rank_pid(if fault == Fault::StopRank0Resumed { 0 } else { 1 })
                    .to_string();
                signal(&pid, "-STOP");
                std::thread::sleep(Duration::from_secs(2));
                signal(&pid, "-CONT");
            }
            Fault::Restart => assert_eq!(self.post("/admin/restart", &json!({})), 202),
            Fault::RestartForce => assert_eq!(self.post("/admin/restart?force=1", &json!({})), 202),
            Fault::StartWhileRunning => assert_eq!(self.post("/admin/start", &json!({})), 200),
            Fault::SpecSwitch => {
                assert_eq!(self.post("/admin/spec", &json!({"mode": "none"})), 202);
                self.wait_mode("none");
                assert_eq!(self.post("/admin/spec", &json!({"mode": "dspark"})), 202);
                self.wait_mode("dspark");
            }
            Fault::SshCut | Fault::DockerSshCut => {
                let epoch = self.status()["supervisor"]["epoch"].clone();
                let (sshd, _) = self.sshd.as_mut().expect("a rig over SSH");
                sshd.cut();
                let deadline = Instant::now() + Duration::from_secs(60);
                while self.status()["supervisor"]["epoch"] == epoch && self.status()["supervisor"]["state"] == "ready" {
                    assert!(Instant::now() < deadline, "the cut was noticed");
                    std::thread::sleep(Duration::from_millis(20));
                }
                self.sshd.as_mut().expect("a rig over SSH").0.run();
            }
            Fault::SigtermWithinDrain | Fault::SigtermPastDrain | Fault::SigintGroup | Fault::KillGateway => {
                let (sig, group) = match fault {
                    Fault::SigintGroup => ("-INT", true),
                    Fault::KillGateway => ("-KILL", false),
                    _ => ("-TERM", false),
                };
                self.signal_gateway(sig, group);
                let mut old = self.gateway.take().expect("gateway");
                old.wait_exit(Duration::from_secs(60));
                self.spawn_gateway();
            }
        }
    }

    fn wait_mode(&self, mode: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(self.status()["supervisor"]["mode"] == mode && self.status()["supervisor"]["state"] == "ready") {
            assert!(Instant::now() < deadline, "the switch to {mode} finished");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `loops` client loops while `fault` is injected; the fault's row.
    pub fn run(&mut self, fault: Fault, loops: usize) -> Row {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        // SIGTERM past the drain needs streams longer than DRAIN_TIMEOUT; the others short ones.
        let max_tokens = if fault == Fault::SigtermPastDrain { 3000 } else { 60 };
        let reference = self.reference(max_tokens);
        let resumed_before = self.resumes();
        let clients: Vec<_> = (0..loops)
            .map(|i| {
                let (stop, outcomes, addr) = (stop.clone(), outcomes.clone(), self.addr.clone());
                let model = self.model.clone();
                std::thread::spawn(move || {
                    let mut n = i;
                    while !stop.load(Ordering::SeqCst) {
                        let kind = Kind::ALL[n % Kind::ALL.len()];
                        let at = *addr.read().expect("addr");
                        let (outcome, text) =
                            client::exchange_text(at, kind, &model, max_tokens, Duration::from_secs(90));
                        // Clients back off when told to come back (503/429 carry Retry-After;
                        // capped so the loops see the recovery) or when nothing listens.
                        match &outcome {
                            Outcome::Refused => std::thread::sleep(Duration::from_millis(50)),
                            Outcome::ExplicitError { status: 429 | 503, .. } => {
                                std::thread::sleep(Duration::from_millis(300))
                            }
                            _ => {}
                        }
                        outcomes.lock().expect("outcomes").push((kind, outcome, text));
                        n += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(if fault == Fault::SigtermPastDrain {
            2
        } else {
            1
        }));
        let before = self.status();
        let epoch = before["supervisor"]["epoch"].as_u64();
        let pid = self.gateway.as_ref().map(Proc::pid);
        let logged = self.gateway.as_ref().map_or(0, |g| g.log().len());
        let injected = Instant::now();
        self.inject(fault);
        self.wait_recovered(epoch, fault);
        let recovered = injected.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            let _ = c.join();
        }
        let mut row = Row {
            recovered_s: recovered.as_secs_f64(),
            ..Row::default()
        };
        let status = self.status();
        if status["supervisor"]["epoch"].as_u64() != epoch {
            row.detected_s = status["supervisor"]["last_restart"]["detected_in_s"].as_f64();
        }
        row.tally(
            std::mem::take(&mut *outcomes.lock().expect("outcomes")),
            &reference,
            fault.cuts_accepted(),
        );
        row.resumed = self.resumes().saturating_sub(resumed_before);
        if let Some(g) = self.gateway.as_ref().filter(|g| Some(g.pid()) == pid) {
            row.trail = Some(trail::Trail::of(&g.log()[logged..], &before, &status));
        }
        row.orphans = self.orphans().len();
        row
    }

    /// Waits until the group serves again (a new epoch for the faults that restart it).
    fn wait_recovered(&self, epoch: Option<u64>, fault: Fault) {
        let started = Instant::now();
        // A gateway started again begins its own epochs; `inject` waited for it to be ready.
        let restarts = !matches!(
            fault,
            Fault::StartWhileRunning
                | Fault::StopRank0Resumed
                | Fault::StopRank1Resumed
                | Fault::SigtermWithinDrain
                | Fault::SigtermPastDrain
                | Fault::SigintGroup
                | Fault::KillGateway
        );
        let deadline = started + Duration::from_secs(120);
        loop {
            let s = self.status();
            let ready = s["supervisor"]["state"] == "ready" && s["supervisor"]["stalled_s"].is_null();
            let moved = !restarts || s["supervisor"]["epoch"].as_u64() != epoch;
            if ready && moved && self.wait_ready(Duration::from_millis(50)).is_some() {
                return;
            }
            assert!(Instant::now() < deadline, "{} did not recover: {s}", fault.name());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // The gateway first (its Proc ends it), then whatever containers it left.
        self.gateway = None;
        if let Ranks::Containers { group } = &self.ranks {
            for id in crate::hosts::group_containers(group) {
                let _ = std::process::Command::new("docker").args(["rm", "-f", &id]).output();
            }
        }
    }
}

/// The worker host of the SSH rigs (127.0.0.2) and its SSH control directory (short: unix socket
/// paths are limited).
fn ssh_worker() -> (crate::hosts::Sshd, tempfile::TempDir) {
    let control = tempfile::Builder::new()
        .prefix("sgc")
        .tempdir_in("/tmp")
        .expect("control dir");
    (crate::hosts::Sshd::start(), control)
}

fn signal(target: &str, sig: &str) {
    let _ = std::process::Command::new("kill").args([sig, "--", target]).status();
}

/// The table BENCHMARKS.md holds.
pub fn table(rows: &[(Fault, Row)]) -> String {
    let mut out = String::from(
        "| fault | completed | resumed | explicit error | of them resumable streams | splice mismatches | truncated | hung | lost | refused (gateway down) | 502 never reached | cut with the gateway | orphans | restarts counted | WARN/ERROR events | detected in s | recovered in s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (f, r) in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |\n",
            f.name(),
            r.completed,
            r.resumed,
            r.explicit_errors,
            r.resumable_errors,
            r.splice_mismatches,
            r.truncated,
            r.hung,
            r.lost,
            r.refused,
            r.unreachable_502,
            r.cut_with_gateway,
            r.orphans,
            r.trail
                .as_ref()
                .map_or("(new gateway)".into(), |t| match t.restarts.as_slice() {
                    [] => "—".into(),
                    rs => rs.join(", "),
                }),
            r.trail.as_ref().map_or("(new gateway)".into(), trail::Trail::shown),
            r.detected_s.map_or("—".into(), |d| format!("{d:.1}")),
            r.recovered_s
        ));
    }
    out
}
