//! The rank group's lifecycle: start order (workers first), readiness, stall diagnostics,
//! watching, group restarts with epochs, backoff and a give-up budget. One task (`actor`) owns
//! the group and runs one state machine (`machine`); everyone else holds a cloneable
//! `SupervisorHandle` that sends commands (each answered, over a bounded queue) and reads the
//! published `Status`. Ranks run as processes (`RUNTIME=process`) or as containers on the
//! head's Docker daemon (`RUNTIME=docker`, through `sparkgate-docker`).

mod actor;
mod adopt;
mod backoff;
mod diagnostics;
mod error;
mod exits;
mod gpu;
mod kernel;
mod leftovers;
mod logsink;
mod machine;
mod memory;
mod nodes;
mod nodewatch;
mod preflight;
mod probe;
mod rank;
mod retention;
mod sampler;
mod start;
mod status;
mod watchdog;
mod watching;

use sparkgate_config::{Config, Runtime};
use tokio::sync::{mpsc, oneshot, watch};

pub use diagnostics::{Bundle, InFlightReport};
pub use error::SupervisorError;
pub use gpu::{GpuSample, NodeGpus};
pub use kernel::{KernelEvent, KernelKind};
pub use machine::Answer;
pub use probe::Progress;
pub use status::{
    GroupState, LastRestart, LogsPruned, LossCause, NodeMemory, RankStatus, RestartCount, RestartReason, Status,
};

use sparkgate_prepare::verify::ssh_target;

/// Preflight on a worker over SSH: enough MemAvailable for a rank (weights + boot margin).
async fn check_worker_memory(
    config: &Config,
    w: &sparkgate_config::Worker,
    worker: &sparkgate_docker::Node,
) -> Result<(), SupervisorError> {
    let s = &config.supervision;
    let (Some(weights), Some(margin)) = (s.weights_gib_per_rank, s.boot_margin_gib) else {
        return Ok(());
    };
    match worker.mem_available_gib(&s.meminfo_path).await {
        Some(avail) if avail < weights + margin => Err(SupervisorError::Preflight(format!(
            "{label}: MemAvailable is {avail:.1} GiB but a rank needs {:.1} GiB ({weights} GiB of weights + BOOT_MARGIN_GIB {margin}); \
             stop other workloads on the {label}, or set BOOT_MARGIN_GIB= to skip this check",
            weights + margin,
            label = w.label
        ))),
        _ => Ok(()),
    }
}

/// The doctor's start checks (`sparkgate doctor` runs them all): a pair that would hang or never
/// form — another kernel or driver, the link down or at another MTU or speed, the peer silent,
/// the RoCE GID empty, the clocks apart — is refused before minutes of loading, in its words.
async fn doctor(config: &Config) -> Result<(), SupervisorError> {
    let report = sparkgate_doctor::examine(config, sparkgate_doctor::Depth::Start).await;
    let failed = report.failures().next().map(sparkgate_doctor::Report::words);
    match failed {
        Some(words) => Err(SupervisorError::Preflight(format!("sparkgate doctor: {words}"))),
        None => Ok(()),
    }
}

/// How a supervisor begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// Adopts a running group of this configuration, or starts one.
    Start,
    /// Adopts a running group of this configuration, else stays stopped until asked to start:
    /// the default model of MODELS, which the gateway loads once it has read the nodes' memory.
    Adopt,
    /// Stays stopped, what an earlier gateway left of this group removed: a model of MODELS
    /// not loaded at start. Its ports and memory are checked when its turn comes (the loaded
    /// model holds them now); its image and weights now.
    Standby,
}

/// A model not loaded at start must have its weights complete on the head: found missing at
/// its first swap, they would take hours to fetch while its clients wait.
fn standby_weights(config: &Config) -> Result<(), SupervisorError> {
    if config.preparation.skip_download {
        return Ok(());
    }
    let missing: Vec<String> = sparkgate_prepare::weights::check(config)
        .iter()
        .filter(|t| !t.complete())
        .map(|t| format!("{} ({}): {}", t.name, t.dir.display(), t.missing.join("; ")))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(SupervisorError::Preflight(format!(
        "{}: weights incomplete on the head: {}; download them first (`sparkgate download` fetches every model's), or set SKIP_DOWNLOAD=1 in its MODELS_FILE section",
        config.profile,
        missing.join(" | ")
    )))
}

/// Connects to every node the runtime uses and runs preflight: the backend that starts ranks,
/// and (docker) the ranks whose packed Engram files are on their node.
async fn backend(config: &Config, begin: Begin) -> Result<(rank::Backend, Vec<(u32, String)>), SupervisorError> {
    doctor(config).await?;
    let start = begin != Begin::Standby;
    let mut packed = Vec::new();
    let backend = match config.supervision.runtime {
        Runtime::Process => {
            // What an earlier gateway left running would fail the port checks.
            leftovers::remove(&config.supervision.log_dir);
            if start {
                preflight::check(config)?;
            }
            let mut workers = Vec::new();
            for w in config.nodes.remote_workers() {
                let target = ssh_target(config, w);
                let node = sparkgate_docker::Node::ssh_only(&w.label, &target).await?;
                if start {
                    check_worker_memory(config, w, &node).await?;
                }
                workers.push(std::sync::Arc::new(rank::WorkerLink::new(w, target, node, false)));
            }
            rank::Backend::Process {
                bin: config.supervision.vllm_bin.clone(),
                workers,
            }
        }
        Runtime::Docker => {
            let (head, remotes) = sparkgate_prepare::verify::connect(config).await.map_err(|e| match e {
                sparkgate_prepare::PrepareError::Docker(d) => SupervisorError::Docker(d),
                other => SupervisorError::Preflight(other.to_string()),
            })?;
            sparkgate_prepare::image::obtainable_on_head(config, &head)
                .await
                .map_err(|e| SupervisorError::Preflight(format!("head: {e}")))?;
            // Packed Engram files present on a node are mounted into its rank (DeepSeek).
            let nodes = sparkgate_prepare::pack::rank_nodes(config, &head, &remotes);
            packed = sparkgate_prepare::pack::packed_ranks(config, &nodes)
                .await
                .map_err(|e| SupervisorError::Preflight(e.to_string()))?;
            if !start {
                standby_weights(config)?;
            }
            for r in remotes.iter().filter(|_| start) {
                check_worker_memory(config, &r.worker, &r.node).await?;
            }
            // A running group of ours holds the ports: adoption decides, not preflight.
            if start
                && head
                    .list(&[(sparkgate_config::labels::GROUP, &config.group_name())])
                    .await?
                    .is_empty()
            {
                preflight::check(config)?;
            }
            let workers = remotes
                .into_iter()
                .map(|r| {
                    let target = ssh_target(config, &r.worker);
                    std::sync::Arc::new(rank::WorkerLink::new(&r.worker, target, r.node, true))
                })
                .collect();
            rank::Backend::Docker { head, workers }
        }
    };
    Ok((backend, packed))
}

/// Commands that may wait for the actor; one more is answered `Busy`.
const COMMAND_QUEUE: usize = 32;

/// The handle to a running supervisor.
#[derive(Debug, Clone)]
pub struct SupervisorHandle {
    requests: mpsc::Sender<actor::Request>,
    status: watch::Receiver<Status>,
    in_flight: diagnostics::InFlightSlot,
    log_dir: std::path::PathBuf,
    nodes: std::sync::Arc<memory::Nodes>,
    begun: watch::Receiver<bool>,
    pings: mpsc::Sender<oneshot::Sender<()>>,
}

impl SupervisorHandle {
    /// Checks what a start needs (preflight), then starts the supervisor task, which adopts a
    /// running group of this configuration or starts the rank group.
    pub async fn spawn(config: &Config, group: &str) -> Result<SupervisorHandle, SupervisorError> {
        Self::spawn_as(config, group, Begin::Start).await
    }

    /// [`spawn`](Self::spawn), beginning as `begin` says.
    pub async fn spawn_as(config: &Config, group: &str, begin: Begin) -> Result<SupervisorHandle, SupervisorError> {
        let (backend, packed) = backend(config, begin).await?;
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let s = &config.supervision;
        let mode = config.speculation.active;
        let starter = start::Starter {
            backend: std::sync::Arc::new(backend),
            modes: config
                .speculation
                .modes
                .iter()
                .map(|m| start::ModePlan {
                    mode: m.method,
                    plan: config.plan_for(m.method).with_packed_engram(&packed),
                    max_num_seqs: m.max_num_seqs,
                    draft_tokens: m.num_speculative_tokens,
                })
                .collect(),
            probe: probe::Probe::new(
                format!("http://127.0.0.1:{}", config.ports.vllm),
                config.serving.served_model_name.clone(),
                config.secrets.vllm_api_key.as_ref().map(|k| k.expose().to_owned()),
            ),
            log_dir: s.log_dir.clone(),
            retention: retention::Retention {
                epochs: s.log_keep_epochs,
                bytes: s.log_keep_bytes,
            },
            pruned: std::sync::Arc::default(),
            ready_timeout: s.ready_timeout,
            hang: s.hang,
            generate_probe: s.ready_generate_probe,
            warmup: s.boot_shape_warmup,
            drop_page_cache: config.preparation.drop_page_cache,
        };
        let docker = matches!(*starter.backend, rank::Backend::Docker { .. });
        let backoff = backoff::Backoff::new(s.backoff_initial, s.backoff_max, s.healthy_reset, s.restart_budget);
        // Containers outlive the gateway unless asked otherwise: the next gateway adopts them.
        let machine = machine::Machine::new(mode, backoff, docker && !s.stop_ranks_on_exit);
        let in_flight = diagnostics::InFlightSlot::default();
        let (begun_tx, begun) = watch::channel(false);
        let (pings, pings_rx) = mpsc::channel(1);
        let setup = actor::Setup {
            config: std::sync::Arc::new(config.clone()),
            group: group.to_owned(),
            in_flight: in_flight.clone(),
            self_check: s.self_check.clone(),
            meminfo: s.meminfo_path.clone(),
            begin,
            begun: begun_tx,
            limits: watchdog::Limits {
                mem_guard_gib: s.mem_guard.then_some(s.mem_guard_gib),
                progress_timeout: s.progress_timeout,
                stall_timeout: s.stall_timeout,
            },
            pings: pings_rx,
        };
        let (status_tx, status_rx) = watch::channel(Status::fresh(
            GroupState::Stopped,
            0,
            mode,
            config.speculation.active_mode().max_num_seqs,
            starter.backend.runtime(),
        ));
        let nodes = std::sync::Arc::new(memory::Nodes::new(starter.backend.clone(), s.meminfo_path.clone()));
        let actor = actor::Actor::new(machine, starter, setup, rx, status_tx);
        sparkgate_task::spawn("supervisor", actor.run());
        Ok(SupervisorHandle {
            requests: tx,
            status: status_rx,
            in_flight,
            log_dir: s.log_dir.clone(),
            nodes,
            begun,
            pings,
        })
    }

    /// Whether the supervisor's actor answers a ping within `within` (systemd's watchdog). An
    /// actor carrying out a stop answers once the stop is done; one that is wedged never does.
    pub async fn alive(&self, within: std::time::Duration) -> bool {
        let (pong, answered) = oneshot::channel();
        let asked = tokio::time::timeout(within, async {
            self.pings.send(pong).await.ok()?;
            answered.await.ok()
        });
        matches!(asked.await, Ok(Some(())))
    }

    /// Returns once the supervisor has begun: what an earlier gateway left is adopted or
    /// removed, and its first state is published.
    pub async fn begun(&self) {
        let mut rx = self.begun.clone();
        let _ = rx.wait_for(|b| *b).await;
    }

    /// Each node's MemAvailable now (the head's from MEMINFO_PATH, a worker's over its SSH
    /// session), read whatever the group's state: what a swap compares before and after.
    pub async fn node_memory(&self) -> Vec<NodeMemory> {
        self.nodes.read().await
    }

    /// The gateway's report of its requests in flight, written into every diagnostics bundle
    /// (set once; later calls are ignored).
    pub fn report_in_flight(&self, report: InFlightReport) {
        self.in_flight.set(report);
    }

    /// The diagnostics bundles under LOG_DIR, oldest epoch first.
    pub fn diagnostics(&self) -> Vec<Bundle> {
        diagnostics::bundles(&self.log_dir)
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Status changes, for whoever mirrors them (the gateway's admission).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Sends `command`; its answer, or `Busy` when COMMAND_QUEUE commands already wait.
    async fn ask(&self, command: machine::Command) -> Answer {
        let (reply, answer) = oneshot::channel();
        match self.requests.try_send(actor::Request { command, reply }) {
            Ok(()) => answer.await.unwrap_or(Answer::ShuttingDown),
            Err(mpsc::error::TrySendError::Full(_)) => Answer::Busy,
            Err(mpsc::error::TrySendError::Closed(_)) => Answer::ShuttingDown,
        }
    }

    /// Stops the group and starts it again with a new epoch (the caller drains first).
    pub async fn restart(&self, reason: impl Into<String>) -> Answer {
        self.ask(machine::Command::Restart {
            reason: reason.into(),
            mode: None,
        })
        .await
    }

    /// Restarts the group into `mode` (the caller drains first); asked while the group starts
    /// or stops, the mode is kept for the next start. The mode must be one of the profile's.
    pub async fn switch_mode(&self, mode: sparkgate_config::SpecMethod, reason: impl Into<String>) -> Answer {
        self.ask(machine::Command::Restart {
            reason: reason.into(),
            mode: Some(mode),
        })
        .await
    }

    pub async fn stop(&self) -> Answer {
        self.ask(machine::Command::Stop).await
    }

    /// Starts a stopped or failed group; a running one is left alone (`AlreadyRunning`).
    pub async fn start(&self) -> Answer {
        self.ask(machine::Command::Start).await
    }

    /// Stops every rank (or leaves containers for adoption) and ends the supervisor; returns
    /// when that is done.
    pub async fn shutdown(&self) {
        let _ = self.ask(machine::Command::Shutdown).await;
    }
}
