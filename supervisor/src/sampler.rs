//! The watch loop's periodic checks — node memory, rank 0's `/health`, vLLM's progress counters —
//! run in their own task, so a slow SSH command or HTTP answer never delays the actor's handling
//! of a rank exit or an operator command.

use std::path::PathBuf;
use std::time::Duration;

use sparkgate_config::NodeRole;
use sparkgate_docker::Node;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::probe::Probe;
use crate::status::NodeMemory;
use crate::watchdog::Sample;

/// The sampling task; stops when dropped.
#[derive(Debug)]
pub(crate) struct Sampler {
    pub(crate) samples: mpsc::Receiver<Sample>,
    task: JoinHandle<()>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sampler {
    pub(crate) fn start(probe: Probe, meminfo: PathBuf, worker: Option<Node>) -> Sampler {
        let (tx, samples) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // At once, so a round takes one probe's time at most; every round reads the
                // engine heartbeat, which must be seen within seconds.
                let (memory, healthy, progress) = tokio::join!(
                    sample_memory(&meminfo, worker.as_ref()),
                    probe.healthy(),
                    probe.progress()
                );
                let sample = Sample {
                    memory,
                    healthy,
                    progress,
                };
                if tx.send(sample).await.is_err() {
                    break;
                }
            }
        });
        Sampler { samples, task }
    }
}

/// MemAvailable of the head (MEMINFO_PATH) and, for a worker over SSH, the worker.
pub(crate) async fn sample_memory(meminfo: &std::path::Path, worker: Option<&Node>) -> Vec<NodeMemory> {
    let mut out = vec![NodeMemory {
        node: NodeRole::Head,
        mem_available_gib: crate::preflight::mem_available_gib(meminfo),
    }];
    if let Some(node) = worker {
        out.push(NodeMemory {
            node: NodeRole::Worker,
            mem_available_gib: node.mem_available_gib(meminfo).await,
        });
    }
    out
}
