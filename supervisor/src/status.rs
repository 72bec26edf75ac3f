//! What the supervisor reports: the group's state machine position, its epoch and each rank.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sparkgate_config::{NodeRole, Runtime, SpecMethod, UpstreamVersion};

/// The group's state as published: the supervisor's phase (`machine::Phase`) seen from outside.
/// `Stopped → Starting(epoch) → Ready(epoch) → Restarting → Backoff → Starting …`, or `Failed`
/// when the restart budget is spent. Serialised once (tagged by `state`) into `/admin/status`
/// and read back typed by the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GroupState {
    Stopped,
    Starting {
        epoch: u64,
    },
    Ready {
        epoch: u64,
    },
    /// Stopping the ranks to start them again (an operator's restart or mode switch, or a
    /// failure with no backoff due).
    Restarting {
        reason: String,
        /// Why the serving group was lost (absent for an operator's restart or mode switch).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<LossCause>,
    },
    /// Waiting `retry_in_s` before the next start after a failure.
    Backoff {
        reason: String,
        retry_in_s: f64,
    },
    /// An operator's stop is under way.
    Stopping,
    Failed {
        reason: String,
    },
    /// The gateway is exiting.
    ShuttingDown,
}

impl GroupState {
    /// Every state's name, as `state` spells it.
    pub const NAMES: [&'static str; 8] = [
        "stopped",
        "starting",
        "ready",
        "restarting",
        "backoff",
        "stopping",
        "failed",
        "shutting_down",
    ];

    /// The state's name (the `state` tag).
    pub fn name(&self) -> &'static str {
        match self {
            GroupState::Stopped => "stopped",
            GroupState::Starting { .. } => "starting",
            GroupState::Ready { .. } => "ready",
            GroupState::Restarting { .. } => "restarting",
            GroupState::Backoff { .. } => "backoff",
            GroupState::Stopping => "stopping",
            GroupState::Failed { .. } => "failed",
            GroupState::ShuttingDown => "shutting_down",
        }
    }
}

/// Why a running group was lost: the evidence the gateway's poison guard weighs against the
/// requests vLLM held (`sparkgate_gateway::quarantine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossCause {
    /// A rank exited by itself (an exit code below 128): the engine died of its own error,
    /// which a request can cause.
    Crashed,
    /// A signal ended a rank (the OOM killer, an operator's `kill`; a container's 128 + n).
    Killed,
    /// The runtime lost sight of a rank (a broken wait, an SSH session that ended).
    Unreachable,
    /// The watchdog's verdict: no engine step, no token, or failed health checks.
    Unwell,
    /// Memguard: a node's available memory fell under MEM_GUARD_GIB.
    Memory,
    /// The group never became ready (preparation or start failed).
    FailedStart,
}

/// Why a running group was restarted, as the restart metrics name it: an operator's restart or a
/// speculation-mode switch (planned), or what ended the group (unplanned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartReason {
    Operator,
    SpecSwitch,
    Crashed,
    Killed,
    Unreachable,
    Unwell,
    Memory,
    FailedStart,
}

impl RestartReason {
    /// An operator (or the speculation policy) asked for it.
    pub fn planned(self) -> bool {
        matches!(self, RestartReason::Operator | RestartReason::SpecSwitch)
    }

    pub fn label(self) -> &'static str {
        match self {
            RestartReason::Operator => "operator",
            RestartReason::SpecSwitch => "spec_switch",
            RestartReason::Crashed => "crashed",
            RestartReason::Killed => "killed",
            RestartReason::Unreachable => "unreachable",
            RestartReason::Unwell => "unwell",
            RestartReason::Memory => "memory",
            RestartReason::FailedStart => "failed_start",
        }
    }

    pub fn of_cause(cause: LossCause) -> RestartReason {
        match cause {
            LossCause::Crashed => RestartReason::Crashed,
            LossCause::Killed => RestartReason::Killed,
            LossCause::Unreachable => RestartReason::Unreachable,
            LossCause::Unwell => RestartReason::Unwell,
            LossCause::Memory => RestartReason::Memory,
            LossCause::FailedStart => RestartReason::FailedStart,
        }
    }
}

/// How many restarts had one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartCount {
    pub reason: RestartReason,
    pub planned: bool,
    pub count: u64,
}

/// One rank as last seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankStatus {
    pub rank: u32,
    pub node: NodeRole,
    /// Process id (process runtime).
    pub pid: Option<u32>,
    /// Container id (docker runtime).
    pub container: Option<String>,
    pub running: bool,
    pub uptime_s: f64,
    pub log: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastRestart {
    pub reason: String,
    /// The epoch it ended.
    #[serde(default)]
    pub epoch: u64,
    pub at_unix: u64,
    /// Seconds from the last sign of life (a health answer, an engine step) to the failure
    /// being noticed; absent for an operator's restart.
    pub detected_in_s: Option<f64>,
    /// What ended the group; absent for an operator's restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<LossCause>,
    /// The diagnostics bundle written for it (an unplanned restart's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<String>,
}

/// Seconds since the Unix epoch, now.
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl LastRestart {
    pub(crate) fn now(epoch: u64, reason: &str, detected_in_s: Option<f64>, cause: Option<LossCause>) -> Self {
        let at_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            reason: reason.to_owned(),
            epoch,
            at_unix,
            detected_in_s,
            cause,
            diagnostics: None,
        }
    }
}

/// The supervisor's published status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    #[serde(flatten)]
    pub state: GroupState,
    pub epoch: u64,
    pub mode: SpecMethod,
    /// The concurrency limit of `mode` (what the gateway admits).
    pub max_num_seqs: u32,
    pub runtime: Runtime,
    pub ranks: Vec<RankStatus>,
    pub restarts: u32,
    pub last_restart: Option<LastRestart>,
    /// MemAvailable of each node, GiB (sampled while the group runs).
    pub memory: Vec<NodeMemory>,
    /// The tightest node's MemAvailable above MEM_GUARD_GIB, GiB (negative: under it), while the
    /// group runs and a node was read: what the gateway's memory guard admits prefills into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom_gib: Option<f64>,
    /// Each node's GPUs at the last sample (nodes with `nvidia-smi`).
    #[serde(default)]
    pub gpus: Vec<crate::gpu::NodeGpus>,
    /// The last Xid and OOM-killer lines of the nodes' kernel logs.
    #[serde(default)]
    pub kernel_events: Vec<crate::kernel::KernelEvent>,
    /// What node preparation is doing before the first start (a download, a ship, a build).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preparing: Option<String>,
    /// Seconds the ready group has had work pending and no engine step: admission holds
    /// until a step comes (or STALL_TIMEOUT restarts the group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_s: Option<f64>,
    /// Rank 0's vLLM release, read from its `/version` when the group became ready (kept
    /// until the next ready group replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm: Option<UpstreamVersion>,
    /// Restarts of a running group by reason, since the gateway started.
    #[serde(default)]
    pub restart_counts: Vec<RestartCount>,
    /// When the group entered its current state (seconds since the epoch).
    #[serde(default)]
    pub state_since_unix: f64,
    /// Old epochs' log directories removed by retention (LOG_KEEP_EPOCHS, LOG_KEEP_BYTES).
    #[serde(default)]
    pub logs_pruned: LogsPruned,
}

/// What LOG_DIR retention removed since the gateway started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsPruned {
    pub epochs: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeMemory {
    /// `head`, `worker`, or `worker <rank>` when the group has several workers.
    pub node: String,
    pub mem_available_gib: Option<f64>,
}

impl NodeMemory {
    /// The least MemAvailable above `line` GiB among `nodes` (negative: under it); `None` when
    /// no node was read.
    pub(crate) fn headroom_gib(nodes: &[NodeMemory], line: f64) -> Option<f64> {
        nodes
            .iter()
            .filter_map(|m| m.mem_available_gib)
            .map(|a| a - line)
            .reduce(f64::min)
    }
}

impl Status {
    /// A group's status before anything happened to it: no ranks, restarts, memory readings or
    /// preparation.
    pub(crate) fn fresh(
        state: GroupState,
        epoch: u64,
        mode: SpecMethod,
        max_num_seqs: u32,
        runtime: Runtime,
    ) -> Status {
        Status {
            state,
            epoch,
            mode,
            max_num_seqs,
            runtime,
            ranks: Vec::new(),
            restarts: 0,
            last_restart: None,
            memory: Vec::new(),
            headroom_gib: None,
            gpus: Vec::new(),
            kernel_events: Vec::new(),
            preparing: None,
            stalled_s: None,
            vllm: None,
            logs_pruned: LogsPruned::default(),
            restart_counts: Vec::new(),
            state_since_unix: 0.0,
        }
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.state, GroupState::Ready { .. })
    }

    /// Ready and not stalled: requests may be sent to it.
    pub fn is_serving(&self) -> bool {
        self.is_ready() && self.stalled_s.is_none()
    }
}
