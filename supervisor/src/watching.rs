//! The running group's watch as the actor holds it: what the watch last saw (`Observed`, kept
//! across epochs for the status), the sampler and its judge (`Watching`), and each sample turned
//! into the actor's next event (`watch_next`).

use std::collections::VecDeque;
use std::time::Instant;

use crate::diagnostics::Trail;
use crate::machine::{Event, Failure};
use crate::nodewatch::Watched;
use crate::sampler::Sampler;
use crate::start::Starter;
use crate::status::NodeMemory;
use crate::watchdog::{Limits, Watchdog};

/// Kernel log events kept for the status.
const KERNEL_EVENTS: usize = 20;

/// What the running group's watch last saw.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    pub(crate) memory: Vec<NodeMemory>,
    /// Seconds the running group has looked stalled (the watchdog's `stalled_for`).
    pub(crate) stalled_s: Option<f64>,
    pub(crate) gpus: Vec<crate::gpu::NodeGpus>,
    /// The last `KERNEL_EVENTS` Xid and OOM lines, across epochs.
    pub(crate) kernel: VecDeque<crate::kernel::KernelEvent>,
    /// The nodes said to have no GPU.
    pub(crate) said_off: crate::nodewatch::SaidOff,
}

/// The running group's watch: samples in, verdicts out.
#[derive(Debug)]
pub(crate) struct Watching {
    pub(crate) epoch: u64,
    sampler: Sampler,
    watchdog: Watchdog,
    /// Heartbeats and rank 0's last scrape, for the diagnostics bundle.
    pub(crate) trail: Trail,
    /// The stall's lines (when it starts, every 10 s, when it ends).
    stall: sparkgate_events::Stall,
}

impl Watching {
    /// Watches `epoch`'s group: each node's first round at once — not at the sampler's first
    /// tick, so the ready state is published with its memory readings (each round is bounded)
    /// — then the sampler every second.
    pub(crate) async fn start(
        epoch: u64,
        s: &sparkgate_config::Supervision,
        limits: &Limits,
        starter: &Starter,
        seen: &mut Observed,
    ) -> Watching {
        let meminfo = s.meminfo_path.display().to_string();
        let said = &seen.said_off;
        let mut watched = vec![Watched::new(
            "head".into(),
            s.node_root("head"),
            None,
            &meminfo,
            said.clone(),
        )];
        for link in starter.backend.workers() {
            if let Ok(node) = link.node().await {
                let root = s.node_root(&link.label);
                watched.push(Watched::new(
                    link.label.clone(),
                    root,
                    Some(node),
                    &meminfo,
                    said.clone(),
                ));
            }
        }
        let first = futures_util::future::join_all(watched.iter_mut().map(|w| w.round())).await;
        seen.gpus = first.iter().filter_map(|r| r.gpus.clone()).collect();
        seen.memory = first.into_iter().map(|r| r.memory).collect();
        Watching {
            epoch,
            sampler: Sampler::start(starter.probe.clone(), watched),
            watchdog: Watchdog::new(limits.clone(), Instant::now()),
            trail: Trail::default(),
            stall: sparkgate_events::Stall::default(),
        }
    }
}

/// The next watch event: `Some(Some(e))` a verdict, `Some(None)` a sample without one (memory
/// updated), pending while nothing is watched.
pub(crate) async fn watch_next(
    watching: &mut Option<Watching>,
    seen: &mut Observed,
    group: &str,
) -> Option<Option<Event>> {
    let Some(w) = watching.as_mut() else {
        return std::future::pending().await;
    };
    let sample = w.sampler.samples.recv().await?;
    seen.memory = sample.memory.clone();
    seen.gpus = sample.gpus.clone();
    for e in &sample.kernel {
        if seen.kernel.len() == KERNEL_EVENTS {
            seen.kernel.pop_front();
        }
        seen.kernel.push_back(e.clone());
    }
    w.trail.record(&sample);
    let epoch = w.epoch;
    let now = Instant::now();
    let verdict = w.watchdog.observe(&sample, now);
    let stalled = w.watchdog.stalled_for(now);
    seen.stalled_s = stalled.map(|d| d.as_secs_f64().round());
    // A stall that becomes a restart ends with the group's loss, logged there.
    if verdict.is_none() {
        if let Some(e) = w.stall.observe(group, stalled, now) {
            e.emit();
        }
    }
    Some(verdict.map(|failure: Failure| Event::Unwell { epoch, failure }))
}
