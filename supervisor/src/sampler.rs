//! The watch loop's periodic checks — node memory, rank 0's `/health`, vLLM's progress counters —
//! run in their own task, so a slow SSH command or HTTP answer never delays the actor's handling
//! of a rank exit or an operator command.

use std::path::PathBuf;
use std::time::Duration;

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
    /// Samples rank 0's health and progress, and the memory of the head and of `workers` (each
    /// named as its node is, over SSH).
    pub(crate) fn start(
        probe: Probe,
        meminfo: PathBuf,
        workers: Vec<(String, Node)>,
        mut watched: Vec<crate::nodewatch::Watched>,
    ) -> Sampler {
        let (tx, samples) = mpsc::channel(1);
        let task = sparkgate_task::spawn("sampler", async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // At once, so a round takes one probe's time at most; every round reads the
                // engine heartbeat, which must be seen within seconds.
                let rounds = futures_util::future::join_all(watched.iter_mut().map(|w| w.round()));
                let (memory, healthy, scrape, rounds) = tokio::join!(
                    sample_memory(&meminfo, &workers),
                    probe.healthy(),
                    probe.scrape(),
                    rounds
                );
                let (mut gpus, mut kernel) = (Vec::new(), Vec::new());
                for r in rounds {
                    gpus.extend(r.gpus);
                    kernel.extend(r.kernel);
                }
                let sample = Sample {
                    memory,
                    healthy,
                    progress: scrape.as_deref().map(crate::probe::Progress::of_exposition),
                    scrape,
                    gpus,
                    kernel,
                };
                if tx.send(sample).await.is_err() {
                    break;
                }
            }
        });
        Sampler { samples, task }
    }
}

/// MemAvailable of the head (MEMINFO_PATH) and of each worker over SSH, read at once.
pub(crate) async fn sample_memory(meminfo: &std::path::Path, workers: &[(String, Node)]) -> Vec<NodeMemory> {
    let mut out = vec![NodeMemory {
        node: "head".into(),
        mem_available_gib: crate::preflight::mem_available_gib(meminfo),
    }];
    let reads = workers.iter().map(|(name, node)| async move {
        NodeMemory {
            node: name.clone(),
            mem_available_gib: node.mem_available_gib(meminfo).await,
        }
    });
    out.extend(futures_util::future::join_all(reads).await);
    out
}
