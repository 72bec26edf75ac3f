//! The watch loop's periodic checks — each node's round (memory, GPUs, kernel log), rank 0's
//! `/health`, vLLM's progress counters — run in their own task, so a slow SSH command or HTTP
//! answer never delays the actor's handling of a rank exit or an operator command.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::probe::Probe;
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
    /// Samples rank 0's health and progress, and each `watched` node.
    pub(crate) fn start(probe: Probe, mut watched: Vec<crate::nodewatch::Watched>) -> Sampler {
        let (tx, samples) = mpsc::channel(1);
        let task = sparkgate_task::spawn("sampler", async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // At once, so a round takes one probe's time at most; every round reads the
                // engine heartbeat, which must be seen within seconds.
                let rounds = futures_util::future::join_all(watched.iter_mut().map(|w| w.round()));
                let (healthy, scrape, rounds) = tokio::join!(probe.healthy(), probe.scrape(), rounds);
                let (mut memory, mut gpus, mut kernel) = (Vec::new(), Vec::new(), Vec::new());
                for r in rounds {
                    memory.push(r.memory);
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
