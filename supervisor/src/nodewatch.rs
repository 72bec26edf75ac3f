//! The wedge watch's reads (issue #35): on each node, every sample, one shell round — the
//! head's locally, a worker's over its SSH session — that runs `nvidia-smi`'s query and tails
//! the kernel log (`dmesg`), both looked up under the node's NODE_ROOT `bin/` first. A node
//! without `nvidia-smi` is said once (`gpu_watch_off`) and stays quiet; a new Xid or OOM line is
//! an event (`kernel_log`).

use std::time::Duration;

use sparkgate_docker::Node;
use sparkgate_events::Event;

use crate::gpu::{self, NodeGpus};
use crate::kernel::{self, KernelEvent};

/// How long one node's round may take.
const LIMIT: Duration = Duration::from_secs(2);

/// The round's script; `$1` is the node's root.
fn script() -> String {
    format!(
        r#"PATH="$1/bin:$PATH"
if command -v nvidia-smi >/dev/null 2>&1; then echo "== gpus"; {} 2>/dev/null; else echo "== no-gpu"; fi
echo "== kernel"; dmesg 2>/dev/null | tail -n 30
"#,
        gpu::QUERY
    )
}

/// The nodes said to have no GPU, for the supervisor's life (each is said once, not per epoch).
pub(crate) type SaidOff = std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>;

/// One node as the watch follows it.
pub(crate) struct Watched {
    pub(crate) name: String,
    root: String,
    /// `None`: the head (a local shell).
    node: Option<Node>,
    said_off: SaidOff,
    /// The last kernel log line seen (none before the first read).
    seen: Option<String>,
}

/// What one round saw on one node.
#[derive(Debug, Default)]
pub(crate) struct Round {
    pub(crate) gpus: Option<NodeGpus>,
    pub(crate) kernel: Vec<KernelEvent>,
}

impl Watched {
    pub(crate) fn new(name: String, root: String, node: Option<Node>, said_off: SaidOff) -> Watched {
        Watched {
            name,
            root,
            node,
            said_off,
            seen: None,
        }
    }

    async fn read(&self) -> Option<String> {
        let run = async {
            match &self.node {
                Some(n) => n
                    .shell(&format!("set -- '{}'\n{}", self.root.replace('\'', ""), script()))
                    .await
                    .ok(),
                None => tokio::process::Command::new("sh")
                    .args(["-c", &script(), "watch", &self.root])
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .output()
                    .await
                    .ok()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned()),
            }
        };
        tokio::time::timeout(LIMIT, run).await.ok().flatten()
    }

    /// One round: the GPUs as now, and the kernel lines new since the last round.
    pub(crate) async fn round(&mut self) -> Round {
        let Some(text) = self.read().await else {
            return Round::default();
        };
        let section = |name: &str| -> String {
            text.split(&format!("== {name}\n"))
                .nth(1)
                .map(|rest| rest.split("\n== ").next().unwrap_or("").to_owned())
                .unwrap_or_default()
        };
        let has_gpu = !text.contains("== no-gpu");
        if !has_gpu && self.said_off.lock().expect("said lock").insert(self.name.clone()) {
            Event::GpuWatchOff {
                node: self.name.clone(),
            }
            .emit();
        }
        let gpus = has_gpu.then(|| NodeGpus {
            node: self.name.clone(),
            gpus: gpu::parse(&section("gpus")),
        });
        let tail = section("kernel");
        let fresh = kernel::new_lines(&tail, self.seen.as_deref());
        let at_unix = crate::status::unix_now() as u64;
        let events = fresh
            .iter()
            .filter_map(|line| {
                let kind = kernel::classify(line)?;
                Event::KernelLog {
                    node: self.name.clone(),
                    line: (*line).to_owned(),
                }
                .emit();
                Some(KernelEvent {
                    node: self.name.clone(),
                    kind,
                    line: (*line).to_owned(),
                    at_unix,
                })
            })
            .collect();
        if let Some(last) = tail.lines().rfind(|l| !l.trim().is_empty()) {
            self.seen = Some(last.to_owned());
        } else if self.seen.is_none() {
            self.seen = Some(String::new());
        }
        Round { gpus, kernel: events }
    }
}
