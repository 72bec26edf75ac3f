//! One rank, whatever runs it — a local child process (`RUNTIME=process`), a process on the
//! worker over SSH, or a container on a Docker node (`RUNTIME=docker`) — with its log captured
//! the same way (`logsink::Capture`) and its exit reported the same way (`exits::watch_exit`);
//! and the `Backend` that starts ranks.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use sparkgate_config::{labels, NodeRole, RankEnvValue, RankPlan};
use sparkgate_docker::{Node, SshTarget};
use tokio::sync::{mpsc, oneshot};

use crate::error::SupervisorError;
use crate::exits::{watch_exit, ExitKind, Exited, RankExit};
use crate::logsink::{Capture, LogSink};
use crate::status::RankStatus;

/// Variables a local rank takes from the gateway's environment besides the plan's: what a
/// program needs to run at all. Nothing else (tokens, keys) reaches a rank.
const INHERITED: [&str; 7] = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// What runs the rank.
#[derive(Debug)]
enum Runtime {
    /// A local child, leading its own process group (`pid` = group id).
    Process {
        pid: u32,
        kill: Option<oneshot::Sender<()>>,
    },
    /// Stopped through the worker link, which reconnects: the session that started it may be
    /// the one that was cut.
    Remote {
        link: Arc<WorkerLink>,
        pid: u32,
    },
    Container {
        docker: Node,
        id: String,
    },
}

/// A running rank.
#[derive(Debug)]
pub(crate) struct Rank {
    rank: u32,
    node: NodeRole,
    log: PathBuf,
    sink: LogSink,
    exited: Exited,
    runtime: Runtime,
}

/// Where a new rank reports: its epoch, log file and the exit channel.
#[derive(Debug, Clone)]
pub(crate) struct Reporting<'a> {
    pub(crate) epoch: u64,
    pub(crate) log: &'a Path,
    pub(crate) exits: mpsc::UnboundedSender<RankExit>,
}

fn plan_env(plan: &RankPlan) -> Vec<(String, String)> {
    plan.container
        .env
        .iter()
        .map(|(k, v)| match v {
            RankEnvValue::Plain(p) => (k.clone(), p.clone()),
            RankEnvValue::Secret(s) => (k.clone(), s.expose().to_owned()),
        })
        .collect()
}

impl Rank {
    /// A local child process in its own process group (a terminal's Ctrl-C, sent to the
    /// foreground group, never reaches it), killed with the gateway (`setpriv --pdeathsig`,
    /// when the host has it), with exactly the plan's environment plus `INHERITED`.
    pub(crate) async fn spawn_process(bin: &str, plan: &RankPlan, to: Reporting<'_>) -> Result<Rank, SupervisorError> {
        let sink = LogSink::new();
        let out = Capture::open(to.log, sink.clone()).await?;
        let err = Capture::open(to.log, sink.clone()).await?;
        let mut cmd = match which_setpriv() {
            Some(setpriv) => {
                let mut c = tokio::process::Command::new(setpriv);
                c.args(["--pdeathsig", "KILL", "--", bin]);
                c
            }
            None => tokio::process::Command::new(bin),
        };
        cmd.args(plan.vllm_argv())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .env_clear()
            .envs(INHERITED.iter().filter_map(|k| Some((*k, std::env::var_os(k)?))))
            .envs(plan_env(plan));
        let mut child = cmd.spawn().map_err(|source| SupervisorError::Spawn {
            bin: bin.to_owned(),
            rank: plan.rank,
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let readers = [
            child
                .stdout
                .take()
                .map(|s| sparkgate_task::spawn("rank-stdout", out.follow(s))),
            child
                .stderr
                .take()
                .map(|s| sparkgate_task::spawn("rank-stderr", err.follow(s))),
        ];
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let exited = watch_exit(to.epoch, plan.rank, to.exits, async move {
            let status = tokio::select! {
                s = child.wait() => s,
                _ = kill_rx => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            // The whole tree goes with it: whatever the rank started is in its group.
            kill_group(pid);
            for r in readers.into_iter().flatten() {
                let _ = r.await;
            }
            match status {
                Ok(s) => (s.to_string(), ExitKind::of_status(&s)),
                Err(e) => (format!("wait failed: {e}"), ExitKind::Unknown),
            }
        });
        let runtime = Runtime::Process {
            pid,
            kill: Some(kill_tx),
        };
        Ok(Rank::of(plan, to.log, sink, exited, runtime))
    }

    /// A process on the worker over SSH (sshd gives it its own session).
    pub(crate) async fn spawn_remote(
        link: &Arc<WorkerLink>,
        bin: &str,
        plan: &RankPlan,
        to: Reporting<'_>,
    ) -> Result<Rank, SupervisorError> {
        let sink = LogSink::new();
        let mut capture = Capture::open(to.log, sink.clone()).await?;
        let ssh = link.node().await?;
        let mut process = ssh.spawn_remote(bin, plan.vllm_argv(), &plan_env(plan)).await?;
        sparkgate_task::spawn("rank-remote-output", async move {
            while let Some(line) = process.lines.recv().await {
                capture.chunk(line.as_bytes()).await;
                capture.chunk(b"\n").await;
            }
        });
        let exit = process.exit;
        let exited = watch_exit(to.epoch, plan.rank, to.exits, async move {
            match exit.await {
                Ok(e) => (e.status, e.kind.map_or(ExitKind::Unknown, exit_kind)),
                Err(_) => ("the SSH session ended".into(), ExitKind::Unknown),
            }
        });
        let runtime = Runtime::Remote {
            link: link.clone(),
            pid: process.pid,
        };
        Ok(Rank::of(plan, to.log, sink, exited, runtime))
    }

    /// Runs the rank's container, or attaches to `adopt` (a running container of this epoch).
    pub(crate) async fn start_container(
        docker: &Node,
        plan: &RankPlan,
        to: Reporting<'_>,
        adopt: Option<String>,
    ) -> Result<Rank, SupervisorError> {
        let sink = LogSink::new();
        let mut capture = Capture::open(to.log, sink.clone()).await?;
        let adopted = adopt.is_some();
        let id = match adopt {
            Some(id) => id,
            None => {
                docker
                    .run(&plan.container, &[(labels::EPOCH.to_owned(), to.epoch.to_string())])
                    .await?
            }
        };
        // Adopted: follow from now (the earlier output is in the previous gateway's log file).
        let mut output = Box::pin(docker.logs(&id, adopted.then_some(0)));
        sparkgate_task::spawn("rank-container-logs", async move {
            while let Some(chunk) = output.next().await {
                capture.chunk(&chunk).await;
            }
            capture.finish();
        });
        let (waiter, wait_id) = (docker.clone(), id.clone());
        let exited = watch_exit(to.epoch, plan.rank, to.exits, async move {
            let exit = waiter.wait_exit(&wait_id).await;
            (exit.status, exit.kind.map_or(ExitKind::Unknown, exit_kind))
        });
        let runtime = Runtime::Container {
            docker: docker.clone(),
            id,
        };
        Ok(Rank::of(plan, to.log, sink, exited, runtime))
    }

    /// The handle every runtime's start ends with.
    fn of(plan: &RankPlan, log: &Path, sink: LogSink, exited: Exited, runtime: Runtime) -> Rank {
        Rank {
            rank: plan.rank,
            node: plan.node,
            log: log.to_path_buf(),
            sink,
            exited,
            runtime,
        }
    }

    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }

    /// The pid of a local rank process (it leads its process group).
    pub(crate) fn local_pid(&self) -> Option<u32> {
        match &self.runtime {
            Runtime::Process { pid, .. } => Some(*pid),
            Runtime::Remote { .. } | Runtime::Container { .. } => None,
        }
    }

    /// The rank's output as the watchdogs read it.
    pub(crate) fn sink(&self) -> LogSink {
        self.sink.clone()
    }

    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        self.sink.tail(n)
    }

    pub(crate) fn running(&self) -> bool {
        !self.exited.get()
    }

    pub(crate) fn status(&self) -> RankStatus {
        let (pid, container) = match &self.runtime {
            Runtime::Process { pid, .. } | Runtime::Remote { pid, .. } => (Some(*pid), None),
            Runtime::Container { id, .. } => (None, Some(id.clone())),
        };
        RankStatus {
            rank: self.rank,
            node: self.node,
            pid,
            container,
            running: self.running(),
            uptime_s: self.sink.uptime_s(),
            log: self.log.clone(),
        }
    }

    /// How to take a Python stack dump of the rank's main process (for stall diagnostics).
    pub(crate) fn stack_dumper(&self) -> StackDumper {
        match &self.runtime {
            Runtime::Container { docker, id } => StackDumper::Container(docker.clone(), id.clone()),
            Runtime::Process { pid, .. } => StackDumper::Local(*pid),
            Runtime::Remote { .. } => StackDumper::None,
        }
    }

    /// Kills the rank with everything it started, and waits (bounded) until it is gone.
    pub(crate) async fn stop(&mut self) {
        match &mut self.runtime {
            Runtime::Process { pid, kill } => {
                kill_group(*pid);
                if let Some(k) = kill.take() {
                    let _ = k.send(());
                }
            }
            Runtime::Remote { link, pid } => {
                match link.node().await {
                    Ok(ssh) => {
                        if let Err(e) = ssh.kill_remote(*pid).await {
                            not_stopped(self.rank, format!("cannot kill remote pid {pid}: {e}"));
                        }
                    }
                    // Its process ends with its SSH session (its output pipes close): unconfirmed.
                    Err(e) => sparkgate_events::Event::RankUnconfirmed {
                        rank: self.rank,
                        detail: format!("remote pid {pid}: {e}"),
                    }
                    .emit(),
                }
            }
            Runtime::Container { docker, id } => {
                if let Err(e) = docker.kill_and_remove(id).await {
                    let detail = format!("cannot remove container {id}: {e}");
                    // A daemon behind a cut SSH session: the next start removes the container.
                    if docker.connected().await {
                        not_stopped(self.rank, detail);
                    } else {
                        sparkgate_events::Event::RankUnconfirmed {
                            rank: self.rank,
                            detail,
                        }
                        .emit();
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.running() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.running() {
            not_stopped(self.rank, "it did not exit within 30 s of SIGKILL".into());
        }
    }
}

/// `py-spy dump` of a rank's main process, taken without holding the rank.
#[derive(Debug, Clone)]
pub(crate) enum StackDumper {
    Local(u32),
    Container(Node, String),
    None,
}

impl StackDumper {
    /// The dump and a one-line note of how it was taken.
    pub(crate) async fn dump(&self) -> Option<(String, String)> {
        match self {
            StackDumper::Container(docker, id) => {
                let dump = docker.exec(id, &["py-spy", "dump", "--pid", "1"]).await;
                let note = format!(
                    "container {id}: py-spy via docker exec: {}",
                    dump.lines().next().unwrap_or("")
                );
                Some((dump, note))
            }
            StackDumper::Local(pid) => {
                let out = tokio::process::Command::new("py-spy")
                    .args(["dump", "--pid", &pid.to_string()])
                    .output()
                    .await;
                Some(match out {
                    Ok(o) => (
                        String::from_utf8_lossy(&[o.stdout, o.stderr].concat()).into_owned(),
                        format!("pid {pid}: py-spy dump written"),
                    ),
                    Err(e) => (String::new(), format!("pid {pid}: no py-spy dump ({e})")),
                })
            }
            StackDumper::None => None,
        }
    }
}

/// SIGKILL to the process group `pgid` leads (a rank spawned with `process_group(0)`).
pub(crate) fn kill_group(pgid: u32) {
    let Some(pid) = i32::try_from(pgid).ok().and_then(rustix::process::Pid::from_raw) else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

fn which_setpriv() -> Option<&'static str> {
    static FOUND: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        let found = ["/usr/bin/setpriv", "/bin/setpriv"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        if found.is_none() {
            tracing::warn!("setpriv (util-linux) not found: ranks will not die with a killed gateway (the next start removes them)");
        }
        found
    })
}

/// A remote worker's Docker daemon (or command channel) over SSH, reconnected when the session
/// has died.
#[derive(Debug)]
pub(crate) struct WorkerLink {
    /// The rank the worker runs.
    pub(crate) rank: u32,
    /// How logs and status name it (`worker`, `worker 2`).
    pub(crate) label: String,
    target: SshTarget,
    node: tokio::sync::Mutex<Option<Node>>,
    /// Forward the worker's Docker socket (docker runtime) or only run commands (process).
    docker: bool,
}

impl WorkerLink {
    pub(crate) fn new(worker: &sparkgate_config::Worker, target: SshTarget, node: Node, docker: bool) -> Self {
        Self {
            rank: worker.rank,
            label: worker.label.clone(),
            target,
            node: tokio::sync::Mutex::new(Some(node)),
            docker,
        }
    }

    pub(crate) async fn node(&self) -> Result<Node, SupervisorError> {
        let mut guard = self.node.lock().await;
        if let Some(n) = guard.as_ref() {
            if n.connected().await {
                return Ok(n.clone());
            }
            sparkgate_events::Event::SshLost {
                node: self.label.clone(),
                destination: self.target.destination.clone(),
            }
            .emit();
        }
        *guard = None;
        let n = if self.docker {
            Node::over_ssh(&self.label, &self.target).await?
        } else {
            Node::ssh_only(&self.label, &self.target).await?
        };
        *guard = Some(n.clone());
        Ok(n)
    }
}

/// How ranks are started.
#[derive(Debug)]
pub(crate) enum Backend {
    /// Local child processes; the ranks of remote workers (`workers`) over SSH.
    Process { bin: String, workers: Vec<Arc<WorkerLink>> },
    /// Rank 0 on the head's daemon; each remote worker's rank on its daemon (`workers`, over
    /// SSH), a worker on the head's address on the head's daemon.
    Docker { head: Node, workers: Vec<Arc<WorkerLink>> },
}

impl Backend {
    pub(crate) fn runtime(&self) -> sparkgate_config::Runtime {
        match self {
            Backend::Process { .. } => sparkgate_config::Runtime::Process,
            Backend::Docker { .. } => sparkgate_config::Runtime::Docker,
        }
    }

    pub(crate) async fn start(&self, plan: &RankPlan, to: Reporting<'_>) -> Result<Rank, SupervisorError> {
        match (self, self.link(plan.rank)) {
            (Backend::Process { bin, .. }, Some(w)) => Rank::spawn_remote(w, bin, plan, to).await,
            (Backend::Process { bin, .. }, None) => Rank::spawn_process(bin, plan, to).await,
            (Backend::Docker { .. }, _) => {
                let node = self.node_for(plan.rank).await.expect("docker runtime")?;
                Rank::start_container(&node, plan, to, None).await
            }
        }
    }

    /// The SSH links to the remote workers, in rank order, whichever runtime runs ranks there.
    pub(crate) fn workers(&self) -> &[Arc<WorkerLink>] {
        match self {
            Backend::Process { workers, .. } | Backend::Docker { workers, .. } => workers,
        }
    }

    /// The link to the remote worker that runs `rank`, if that worker is another machine.
    fn link(&self, rank: u32) -> Option<&Arc<WorkerLink>> {
        self.workers().iter().find(|w| w.rank == rank)
    }

    /// The Docker node that runs `rank` (docker runtime only).
    pub(crate) async fn node_for(&self, rank: u32) -> Option<Result<Node, SupervisorError>> {
        match (self, self.link(rank)) {
            (Backend::Docker { .. }, Some(w)) => Some(w.node().await),
            (Backend::Docker { head, .. }, None) => Some(Ok(head.clone())),
            (Backend::Process { .. }, _) => None,
        }
    }
}

/// The exit kind of what the Docker crate saw (a container's code, a remote process's end).
fn exit_kind(kind: sparkgate_docker::ExitKind) -> ExitKind {
    match kind {
        sparkgate_docker::ExitKind::Code(c) => ExitKind::Code(c),
        sparkgate_docker::ExitKind::Signal => ExitKind::Signal,
    }
}

fn not_stopped(rank: u32, detail: String) {
    sparkgate_events::Event::RankNotStopped { rank, detail }.emit();
}
