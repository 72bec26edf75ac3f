//! A rank of either runtime, and the backend that starts ranks: child processes
//! (`RUNTIME=process`) or containers on a Docker node (`RUNTIME=docker`).

use std::path::Path;
use std::time::Duration;

use sparkgate_config::RankPlan;
use sparkgate_docker::{Node, SshTarget};
use tokio::sync::mpsc;

use crate::actor::Event;
use crate::container::RankContainer;
use crate::error::SupervisorError;
use crate::process::RankProc;
use crate::remote::RankRemote;
use crate::status::RankStatus;

#[derive(Debug)]
pub(crate) enum Rank {
    Process(RankProc),
    /// A process on the worker, over SSH (RUNTIME=process).
    Remote(RankRemote),
    Container(RankContainer),
}

impl Rank {
    pub(crate) fn rank(&self) -> u32 {
        match self {
            Rank::Process(p) => p.rank,
            Rank::Remote(r) => r.rank,
            Rank::Container(c) => c.rank,
        }
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        match self {
            Rank::Process(p) => Some(p.pid),
            Rank::Remote(_) | Rank::Container(_) => None,
        }
    }

    /// Seconds since the last log line that shows progress.
    pub(crate) fn quiet_for(&self) -> f64 {
        match self {
            Rank::Process(p) => p.quiet_for(),
            Rank::Remote(r) => r.quiet_for(),
            Rank::Container(c) => c.quiet_for(),
        }
    }

    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        match self {
            Rank::Process(p) => p.tail(n),
            Rank::Remote(r) => r.tail(n),
            Rank::Container(c) => c.tail(n),
        }
    }

    pub(crate) fn status(&self) -> RankStatus {
        match self {
            Rank::Process(p) => p.status(),
            Rank::Remote(r) => r.status(),
            Rank::Container(c) => c.status(),
        }
    }

    /// Kills the rank and waits until it is gone.
    pub(crate) async fn stop(&mut self) {
        match self {
            Rank::Process(p) => {
                p.kill();
                if tokio::time::timeout(Duration::from_secs(30), p.reaped()).await.is_err() {
                    tracing::error!(rank = p.rank, pid = p.pid, "rank did not exit after SIGKILL");
                }
            }
            Rank::Remote(r) => r.stop().await,
            Rank::Container(c) => c.stop().await,
        }
    }
}

/// The worker's Docker daemon over SSH, reconnected when the session has died.
#[derive(Debug)]
pub(crate) struct WorkerLink {
    target: SshTarget,
    node: tokio::sync::Mutex<Option<Node>>,
    /// Forward the worker's Docker socket (docker runtime) or only run commands (process).
    docker: bool,
}

impl WorkerLink {
    pub(crate) fn new(target: SshTarget, node: Node, docker: bool) -> Self {
        Self {
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
            tracing::warn!(destination = %self.target.destination, "the worker's SSH session is gone; reconnecting");
        }
        *guard = None;
        let n = if self.docker {
            Node::over_ssh("worker", &self.target).await?
        } else {
            Node::ssh_only("worker", &self.target).await?
        };
        *guard = Some(n.clone());
        Ok(n)
    }
}

/// How ranks are started.
#[derive(Debug)]
pub(crate) enum Backend {
    /// Local child processes; workers over SSH when `worker` is set.
    Process { bin: String, worker: Option<WorkerLink> },
    /// Rank 0 on the head's daemon; workers on `worker` (over SSH) or, without it, the head's.
    Docker { head: Node, worker: Option<WorkerLink> },
}

impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Process { .. } => "process",
            Backend::Docker { .. } => "docker",
        }
    }

    pub(crate) async fn start(
        &self,
        plan: &RankPlan,
        epoch: u64,
        log: &Path,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Rank, SupervisorError> {
        match self {
            Backend::Process { bin, worker: Some(w) } if plan.rank > 0 => {
                let node = w.node().await?;
                Ok(Rank::Remote(
                    RankRemote::spawn(&node, bin, plan, epoch, log, events).await?,
                ))
            }
            Backend::Process { bin, .. } => Ok(Rank::Process(RankProc::spawn(bin, plan, epoch, log, events).await?)),
            Backend::Docker { .. } => {
                let node = self.node_for(plan.rank).await?;
                Ok(Rank::Container(
                    RankContainer::start(&node, plan, epoch, log, events, None).await?,
                ))
            }
        }
    }

    /// The Docker node that runs `rank`.
    /// The SSH link to a remote worker, whichever runtime runs ranks there.
    pub(crate) fn worker(&self) -> Option<&WorkerLink> {
        match self {
            Backend::Process { worker, .. } | Backend::Docker { worker, .. } => worker.as_ref(),
        }
    }

    pub(crate) async fn node_for(&self, rank: u32) -> Result<Node, SupervisorError> {
        match self {
            Backend::Docker { worker: Some(w), .. } if rank > 0 => w.node().await,
            Backend::Docker { head, .. } => Ok(head.clone()),
            Backend::Process { .. } => unreachable!("process ranks have no node"),
        }
    }
}
