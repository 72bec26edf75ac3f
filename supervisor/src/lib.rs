//! The rank group's lifecycle: start order (workers first), readiness, stall diagnostics,
//! watching, group restarts with epochs, backoff and a give-up budget. One task (`actor`) owns
//! the group; everyone else holds a cloneable `SupervisorHandle` that sends commands and reads
//! the published `Status`. Ranks run as processes (`RUNTIME=process`) or as containers on the
//! head's Docker daemon (`RUNTIME=docker`, through `sparkgate-docker`).

mod actor;
mod backoff;
mod container;
mod diagnostics;
mod error;
mod logsink;
mod preflight;
mod probe;
mod process;
mod rank;
mod remote;
mod sampler;
pub mod spec_policy;
mod status;

use sparkgate_config::{Config, Runtime};
use tokio::sync::{mpsc, oneshot, watch};

pub use error::SupervisorError;
pub use status::{GroupState, LastRestart, NodeMemory, RankStatus, Status};

use sparkgate_prepare::verify::ssh_target;

/// Preflight on the worker over SSH: enough MemAvailable for a rank (weights + boot margin).
async fn check_worker_memory(config: &Config, worker: &sparkgate_docker::Node) -> Result<(), SupervisorError> {
    let s = &config.supervision;
    let (Some(weights), Some(margin)) = (s.weights_gib_per_rank, s.boot_margin_gib) else {
        return Ok(());
    };
    match worker.mem_available_gib(&s.meminfo_path).await {
        Some(avail) if avail < weights + margin => Err(SupervisorError::Preflight(format!(
            "worker: MemAvailable is {avail:.1} GiB but a rank needs {:.1} GiB ({weights} GiB of weights + BOOT_MARGIN_GIB {margin}); \
             stop other workloads on the worker, or set BOOT_MARGIN_GIB= to skip this check",
            weights + margin
        ))),
        _ => Ok(()),
    }
}

/// The handle to a running supervisor.
#[derive(Debug, Clone)]
pub struct SupervisorHandle {
    cmd: mpsc::UnboundedSender<actor::Command>,
    status: watch::Receiver<Status>,
}

impl SupervisorHandle {
    /// Checks what a start needs (preflight), then starts the supervisor task, which adopts a
    /// running group of this configuration or starts the rank group.
    pub async fn spawn(config: &Config) -> Result<SupervisorHandle, SupervisorError> {
        let mut packed = Vec::new();
        let backend = match config.supervision.runtime {
            Runtime::Process => {
                preflight::check(config)?;
                let worker = match ssh_target(config) {
                    Some(target) => {
                        let node = sparkgate_docker::Node::ssh_only("worker", &target).await?;
                        check_worker_memory(config, &node).await?;
                        Some(rank::WorkerLink::new(target, node, false))
                    }
                    None => None,
                };
                rank::Backend::Process {
                    bin: config.supervision.vllm_bin.clone(),
                    worker,
                }
            }
            Runtime::Docker => {
                let head = sparkgate_docker::Node::local("head", &config.supervision.docker_socket).await?;
                let worker = match ssh_target(config) {
                    Some(target) => {
                        let node = sparkgate_docker::Node::over_ssh("worker", &target).await?;
                        Some((target, node))
                    }
                    None => None,
                };
                sparkgate_prepare::image::obtainable_on_head(config, &head)
                    .await
                    .map_err(|e| SupervisorError::Preflight(format!("head: {e}")))?;
                // Packed Engram files present on a node are mounted into its rank (DeepSeek).
                let nodes = sparkgate_prepare::pack::rank_nodes(config, &head, worker.as_ref().map(|(_, w)| w));
                packed = sparkgate_prepare::pack::packed_ranks(config, &nodes)
                    .await
                    .map_err(|e| SupervisorError::Preflight(e.to_string()))?;
                if let Some((_, w)) = &worker {
                    check_worker_memory(config, w).await?;
                }
                // A running group of ours holds the ports: adoption decides, not preflight.
                if head
                    .list(&[(sparkgate_config::labels::GROUP, &config.group_name())])
                    .await?
                    .is_empty()
                {
                    preflight::check(config)?;
                }
                rank::Backend::Docker {
                    head,
                    worker: worker.map(|(t, n)| rank::WorkerLink::new(t, n, true)),
                }
            }
        };
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (status_tx, status_rx) = watch::channel(Status {
            state: GroupState::Stopped,
            epoch: 0,
            mode: config.speculation.active.to_string(),
            max_num_seqs: config.speculation.active_mode().max_num_seqs,
            runtime: backend.name(),
            ranks: Vec::new(),
            restarts: 0,
            last_restart: None,
            memory: Vec::new(),
            preparing: None,
        });
        let actor = actor::Actor::new(config, backend, &packed, cmd_rx, status_tx);
        tokio::spawn(actor.run());
        Ok(SupervisorHandle {
            cmd: cmd_tx,
            status: status_rx,
        })
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Status changes, for whoever mirrors them (the gateway's admission).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Stops the group and starts it again with a new epoch.
    pub fn restart(&self, reason: impl Into<String>) {
        let _ = self.cmd.send(actor::Command::Restart {
            reason: reason.into(),
            mode: None,
        });
    }

    /// Restarts the group into `mode` (the caller drains first). The mode must be one of the
    /// profile's (`Config::speculation.modes`); others are ignored by the actor.
    pub fn switch_mode(&self, mode: sparkgate_config::SpecMethod, reason: impl Into<String>) {
        let _ = self.cmd.send(actor::Command::Restart {
            reason: reason.into(),
            mode: Some(mode),
        });
    }

    pub fn stop(&self) {
        let _ = self.cmd.send(actor::Command::Stop);
    }

    pub fn start(&self) {
        let _ = self.cmd.send(actor::Command::Start);
    }

    /// Stops every rank and ends the supervisor; returns when the ranks are gone.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(actor::Command::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}
