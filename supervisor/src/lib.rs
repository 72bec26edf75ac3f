//! The rank group's lifecycle: start order (workers first), readiness, stall diagnostics,
//! watching, group restarts with epochs, backoff and a give-up budget. One task (`actor`) owns
//! the group; everyone else holds a cloneable `SupervisorHandle` that sends commands and reads
//! the published `Status`. Ranks run as processes (`RUNTIME=process`); the Docker runtime
//! arrives with `sparkgate-docker`.

mod actor;
mod backoff;
mod diagnostics;
mod error;
mod probe;
mod process;
mod status;

use sparkgate_config::{Config, Runtime};
use tokio::sync::{mpsc, oneshot, watch};

pub use error::SupervisorError;
pub use status::{GroupState, LastRestart, RankStatus, Status};

/// The handle to a running supervisor.
#[derive(Debug, Clone)]
pub struct SupervisorHandle {
    cmd: mpsc::UnboundedSender<actor::Command>,
    status: watch::Receiver<Status>,
}

impl SupervisorHandle {
    /// Starts the supervisor task, which immediately starts the rank group.
    pub fn spawn(config: &Config) -> Result<SupervisorHandle, SupervisorError> {
        if config.supervision.runtime == Runtime::Docker {
            return Err(SupervisorError::DockerUnavailable);
        }
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (status_tx, status_rx) = watch::channel(Status {
            state: GroupState::Stopped,
            epoch: 0,
            mode: config.speculation.active.to_string(),
            runtime: "process",
            ranks: Vec::new(),
            restarts: 0,
            last_restart: None,
        });
        let actor = actor::Actor::new(config, cmd_rx, status_tx);
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
        let _ = self.cmd.send(actor::Command::Restart { reason: reason.into() });
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
