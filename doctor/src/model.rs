//! The doctor's vocabulary: every check (`Check`), a verdict, a row of the table, what a node
//! was seen to be (`Seen`) and what it is judged against (`Limits`).

use serde::Serialize;

use crate::facts::Facts;

/// Every check, in the order the table prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The worker's SSH session opens (key, known hosts, BatchMode).
    Ssh,
    /// The node's Docker daemon answers (RUNTIME=docker).
    DockerDaemon,
    /// The image is on every node with the same digest (RUNTIME=docker).
    ImageDigest,
    /// vLLM, torch, NCCL and CUDA inside the image are the same on every node.
    ImageVersions,
    Kernel,
    Driver,
    /// The ranks' interface is up, with the same MTU and speed on every node.
    Interface,
    /// The peer answers over the network the ranks use.
    Peer,
    /// The RoCE GID entry the ranks use is populated.
    RoceGid,
    /// Clock skew between the head and the node, bounded by the SSH round trip.
    Clock,
    /// MemAvailable covers a rank's weights and the boot margin.
    Memory,
    /// LOG_DIR's filesystem has MIN_FREE_DISK_GIB.
    Disk,
    /// The weights' files and sizes are the same on every node.
    Weights,
    /// The ports the ranks and the gateway need are free on the head.
    Ports,
}

impl Check {
    pub const ALL: [Check; 14] = [
        Check::Ssh,
        Check::DockerDaemon,
        Check::ImageDigest,
        Check::ImageVersions,
        Check::Kernel,
        Check::Driver,
        Check::Interface,
        Check::Peer,
        Check::RoceGid,
        Check::Clock,
        Check::Memory,
        Check::Disk,
        Check::Weights,
        Check::Ports,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Check::Ssh => "ssh",
            Check::DockerDaemon => "docker_daemon",
            Check::ImageDigest => "image_digest",
            Check::ImageVersions => "image_versions",
            Check::Kernel => "kernel",
            Check::Driver => "driver",
            Check::Interface => "interface",
            Check::Peer => "peer",
            Check::RoceGid => "roce_gid",
            Check::Clock => "clock",
            Check::Memory => "memory",
            Check::Disk => "disk",
            Check::Weights => "weights",
            Check::Ports => "ports",
        }
    }

    /// Run before every start (`serve`): cheap (no container, no file walk), not fixed by the
    /// start's own preparation (image, weights), and not already the supervisor's preflight
    /// (memory, disk, ports — which knows when an adopted group holds them).
    pub fn at_start(self) -> bool {
        matches!(
            self,
            Check::Ssh | Check::Kernel | Check::Driver | Check::Interface | Check::Peer | Check::RoceGid | Check::Clock
        )
    }
}

/// A check's verdict on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// Not applicable here, or the fact does not exist on this node (no GPU, no RoCE device).
    Skip,
}

/// One row of the doctor's table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub check: Check,
    pub node: String,
    pub verdict: Verdict,
    /// What was found.
    pub found: String,
    /// What to do (empty when it passed).
    pub fix: String,
}

/// What one node was seen to be.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub node: String,
    /// The SSH session (workers) failed: why.
    pub unreachable: Option<String>,
    pub facts: Option<Facts>,
    /// Clock offset from the head and its bound (half the round trip), seconds.
    pub clock: Option<(f64, f64)>,
    /// The daemon (RUNTIME=docker): the image's id, or why not.
    pub image: Option<Result<String, String>>,
    /// The image's versions (vLLM, torch, NCCL, CUDA), or why not read.
    pub versions: Option<Result<String, String>>,
}

/// What the judge compares against.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// GiB a rank needs (weights + boot margin), when known.
    pub memory_gib: Option<f64>,
    pub min_free_disk_gib: Option<f64>,
    pub max_skew_s: f64,
    /// Ports the head needs and whether each is free.
    pub ports: Vec<(String, u16, bool)>,
    pub image: String,
    /// HEAD_IP is a loopback address: the ranks talk over loopback (the demo, the tests), so a
    /// node without the CX7 interface is not a fault.
    pub loopback: bool,
}

pub(crate) fn row(check: Check, node: &str, verdict: Verdict, found: impl Into<String>, fix: impl Into<String>) -> Row {
    Row {
        check,
        node: node.to_owned(),
        verdict,
        found: found.into(),
        fix: fix.into(),
    }
}
