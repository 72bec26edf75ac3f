//! The watch's reads of each node (issue #35): every sample, one shell round — the head's
//! locally, a worker's over its SSH session — that reads MemAvailable (memguard's and the
//! memory guard's), runs `nvidia-smi`'s query and, every `KERNEL_EVERY` rounds, tails the kernel
//! log (`dmesg`); commands are looked up under the node's NODE_ROOT `bin/` first. A node without
//! `nvidia-smi` is said once (`gpu_watch_off`) and stays quiet; a new Xid or OOM line is an
//! event (`kernel_log`).

use std::time::Duration;

use sparkgate_docker::Node;
use sparkgate_events::Event;

use crate::gpu::{self, NodeGpus};
use crate::kernel::{self, KernelEvent};
use crate::status::NodeMemory;

/// How long one node's round may take.
const LIMIT: Duration = Duration::from_secs(2);

/// Rounds between two reads of the kernel log: the whole `dmesg` ring is read each time, and a
/// fatal Xid seen within five seconds is soon enough.
const KERNEL_EVERY: u64 = 5;

/// The round's script; `$1` is the node's root, `$2` where MemAvailable is read, `$3` `kernel`
/// when the kernel log is read this round. A hung `nvidia-smi` or `dmesg` (a wedged GPU can
/// hang the driver's query) is cut at 1.5 s, so the memory reading still comes back.
fn script() -> String {
    format!(
        r#"PATH="$1/bin:$PATH"
echo "== memory"; awk '/^MemAvailable:/ {{print $2}}' "$2" 2>/dev/null
t=""; if command -v timeout >/dev/null 2>&1; then t="timeout 1.5"; fi
if command -v nvidia-smi >/dev/null 2>&1; then echo "== gpus"; $t {} 2>/dev/null; else echo "== no-gpu"; fi
if [ "$3" = kernel ]; then echo "== kernel"; $t dmesg 2>/dev/null | tail -n 30; fi
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
    /// Where its MemAvailable is read: MEMINFO_PATH on this machine, `/proc/meminfo` over SSH.
    meminfo: String,
    said_off: SaidOff,
    /// The last kernel log line seen (none before the first read).
    seen: Option<String>,
    rounds: u64,
}

/// What one round saw on one node.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) memory: NodeMemory,
    pub(crate) gpus: Option<NodeGpus>,
    pub(crate) kernel: Vec<KernelEvent>,
}

impl Watched {
    /// A node read under `root`; its MemAvailable from `meminfo` unless it is reached over SSH.
    pub(crate) fn new(name: String, root: String, node: Option<Node>, meminfo: &str, said_off: SaidOff) -> Watched {
        let remote = node.as_ref().is_some_and(Node::is_remote);
        Watched {
            name,
            root,
            node,
            meminfo: if remote { "/proc/meminfo" } else { meminfo }.to_owned(),
            said_off,
            seen: None,
            rounds: 0,
        }
    }

    async fn read(&self, kernel: bool) -> Option<String> {
        let args = [self.root.as_str(), &self.meminfo, if kernel { "kernel" } else { "" }];
        let script = script();
        let run = sparkgate_docker::run_script(self.node.as_ref(), &script, &args);
        tokio::time::timeout(LIMIT, run).await.ok()?.ok()
    }

    /// One round: the memory and GPUs as now, and (every `KERNEL_EVERY` rounds, and every
    /// round until one has read it) the kernel lines new since the last read.
    pub(crate) async fn round(&mut self) -> Round {
        // Until its history has been read once, every round reads the log: a line written
        // after the watch began is never taken for history.
        let kernel = self.seen.is_none() || self.rounds % KERNEL_EVERY == 0;
        self.rounds += 1;
        let text = self.read(kernel).await.unwrap_or_default();
        let section = |name: &str| -> Option<String> {
            text.split(&format!("== {name}\n"))
                .nth(1)
                .map(|rest| rest.split("\n== ").next().unwrap_or("").to_owned())
        };
        let kib: Option<f64> = section("memory").and_then(|m| m.trim().parse().ok());
        let memory = NodeMemory {
            node: self.name.clone(),
            mem_available_gib: kib.map(|k| k / (1024.0 * 1024.0)),
        };
        if text.is_empty() {
            return Round {
                memory,
                gpus: None,
                kernel: Vec::new(),
            };
        }
        let has_gpu = !text.contains("== no-gpu");
        if !has_gpu && self.said_off.lock().expect("said lock").insert(self.name.clone()) {
            Event::GpuWatchOff {
                node: self.name.clone(),
            }
            .emit();
        }
        let gpus = has_gpu.then(|| NodeGpus {
            node: self.name.clone(),
            gpus: gpu::parse(&section("gpus").unwrap_or_default()),
        });
        let kernel = section("kernel").map(|tail| self.follow(&tail)).unwrap_or_default();
        Round { memory, gpus, kernel }
    }

    /// The kernel log's tail: events for its Xid and OOM lines new since the last read.
    fn follow(&mut self, tail: &str) -> Vec<KernelEvent> {
        let fresh = kernel::new_lines(tail, self.seen.as_deref());
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
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(root: &std::path::Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = root.join("bin").join(name);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[tokio::test]
    async fn a_round_reads_the_memory_each_time_and_the_kernel_log_every_fifth_round() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let meminfo = root.join("meminfo");
        std::fs::write(&meminfo, "MemTotal: 134217728 kB\nMemAvailable: 4194304 kB\n").unwrap();
        let reads = root.join("dmesg-reads");
        command(root, "dmesg", &format!("echo x >> '{}'", reads.display()));
        let mut w = Watched::new(
            "head".into(),
            root.display().to_string(),
            None,
            &meminfo.display().to_string(),
            SaidOff::default(),
        );
        for _ in 0..6 {
            let round = w.round().await;
            assert_eq!(round.memory.mem_available_gib, Some(4.0));
        }
        let read = std::fs::read_to_string(&reads).unwrap_or_default();
        assert_eq!(read.lines().count(), 2, "rounds 1 and 6 read the kernel log");
        // A node whose meminfo cannot be read has no reading, and the round still comes back.
        std::fs::remove_file(&meminfo).unwrap();
        assert_eq!(w.round().await.memory.mem_available_gib, None);
    }
}
