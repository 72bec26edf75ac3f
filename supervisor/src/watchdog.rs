//! The running group's checks as one pure, unit-tested judge: memguard (MemAvailable under
//! MEM_GUARD_GIB in two samples in a row), liveness (three failed `/health` checks in a row),
//! the engine heartbeat (requests running or waiting and no engine step — rank 0's
//! `vllm:iteration_tokens_total` count — for STALL_TIMEOUT; an unanswered `/metrics` is no
//! step) and, as a backstop, progress (requests running and no token for PROGRESS_TIMEOUT). It
//! reads samples in the caller's time and says when the group must be restarted, since when it
//! was unwell, and whether it looks stalled meanwhile (admission holds then).

use std::time::{Duration, Instant};

use crate::machine::Failure;
use crate::probe::Progress;
use crate::status::{LossCause, NodeMemory};

/// One round of checks (`sampler.rs` takes one about every second).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) memory: Vec<NodeMemory>,
    pub(crate) healthy: bool,
    /// vLLM's counters, when this round read `/metrics`.
    pub(crate) progress: Option<Progress>,
    /// The `/metrics` text they were read from (kept for the diagnostics bundle).
    pub(crate) scrape: Option<std::sync::Arc<str>>,
    /// Each node's GPUs (nodes with `nvidia-smi`).
    pub(crate) gpus: Vec<crate::gpu::NodeGpus>,
    /// Kernel log lines new since the last sample (Xid, OOM).
    pub(crate) kernel: Vec<crate::kernel::KernelEvent>,
}

#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// MEM_GUARD_GIB when MEM_GUARD=1.
    pub(crate) mem_guard_gib: Option<f64>,
    pub(crate) progress_timeout: Duration,
    pub(crate) stall_timeout: Duration,
}

#[derive(Debug)]
pub(crate) struct Watchdog {
    limits: Limits,
    low_memory: u32,
    unhealthy: u32,
    /// The last healthy answer (or the start of watching).
    healthy_at: Instant,
    last_generated: Option<f64>,
    progress_at: Instant,
    /// The last engine step count seen, and when it last moved (or the engine was idle).
    steps: Option<f64>,
    step_at: Instant,
    /// Requests running or waiting at the last answered `/metrics`.
    pending: f64,
}

/// A kernel log line after which the group cannot go on (a fatal Xid): lost at once.
fn kernel(sample: &Sample) -> Option<Failure> {
    let e = sample.kernel.iter().find(|e| e.kind.ends_the_group())?;
    Some(Failure {
        reason: format!("{} kernel: {}", e.node, e.line.trim()),
        detected_in: Some(Duration::ZERO),
        cause: LossCause::Unwell,
    })
}

impl Watchdog {
    pub(crate) fn new(limits: Limits, now: Instant) -> Self {
        Self {
            limits,
            low_memory: 0,
            unhealthy: 0,
            healthy_at: now,
            last_generated: None,
            progress_at: now,
            steps: None,
            step_at: now,
            pending: 0.0,
        }
    }

    /// The group looks stalled (admission holds) while rank 0 fails its health checks, or work
    /// is pending and no engine step came for a third of STALL_TIMEOUT — until it answers and
    /// steps again, or the stall becomes a restart.
    pub(crate) fn stalled_for(&self, now: Instant) -> Option<Duration> {
        if self.unhealthy > 0 {
            return Some(now.saturating_duration_since(self.healthy_at));
        }
        let quiet = now.saturating_duration_since(self.step_at);
        (self.pending > 0.0 && quiet >= self.limits.stall_timeout / 3).then_some(quiet)
    }

    /// The verdict on one sample: `Some` when the group must be restarted.
    pub(crate) fn observe(&mut self, sample: &Sample, now: Instant) -> Option<Failure> {
        kernel(sample)
            .or_else(|| self.memory(sample))
            .or_else(|| self.health(sample, now))
            .or_else(|| self.heartbeat(sample, now))
            .or_else(|| self.progress(sample, now))
    }

    fn heartbeat(&mut self, sample: &Sample, now: Instant) -> Option<Failure> {
        if let Some(p) = sample.progress {
            self.pending = p.running + p.waiting;
            if self.pending == 0.0 || self.steps != Some(p.steps) {
                self.steps = Some(p.steps);
                self.step_at = now;
                return None;
            }
        } else if self.pending == 0.0 {
            // Unanswered while idle: the health checks judge that.
            self.step_at = now;
            return None;
        }
        let quiet = now.saturating_duration_since(self.step_at);
        // Busy GPUs at low power on every node: the ranks spin in a collective (vLLM 42354).
        let hang = if crate::gpu::collective_hang(&sample.gpus) {
            "collective hang (the GPUs are busy at low power): "
        } else {
            ""
        };
        (quiet >= self.limits.stall_timeout).then(|| Failure {
            reason: format!(
                "{hang}no engine step for {:.0}s while {} requests were running or waiting (STALL_TIMEOUT={}s)",
                quiet.as_secs_f64(),
                self.pending,
                self.limits.stall_timeout.as_secs()
            ),
            detected_in: Some(quiet),
            cause: LossCause::Unwell,
        })
    }

    fn memory(&mut self, sample: &Sample) -> Option<Failure> {
        let threshold = self.limits.mem_guard_gib?;
        let Some(low) = sample
            .memory
            .iter()
            .find(|m| m.mem_available_gib.is_some_and(|a| a < threshold))
        else {
            self.low_memory = 0;
            return None;
        };
        self.low_memory += 1;
        if self.low_memory < 2 {
            return None;
        }
        self.low_memory = 0;
        Some(Failure {
            reason: format!(
                "memguard: MemAvailable {:.2} GiB < MEM_GUARD_GIB {threshold} on {} in two consecutive samples",
                low.mem_available_gib.unwrap_or(0.0),
                low.node
            ),
            detected_in: Some(Duration::ZERO),
            cause: LossCause::Memory,
        })
    }

    fn health(&mut self, sample: &Sample, now: Instant) -> Option<Failure> {
        if sample.healthy {
            self.unhealthy = 0;
            self.healthy_at = now;
            return None;
        }
        self.unhealthy += 1;
        (self.unhealthy >= 3).then(|| Failure {
            reason: "rank 0 failed 3 health checks in a row".into(),
            detected_in: Some(now.saturating_duration_since(self.healthy_at)),
            cause: LossCause::Unwell,
        })
    }

    fn progress(&mut self, sample: &Sample, now: Instant) -> Option<Failure> {
        let p = sample.progress?;
        if p.running == 0.0 || self.last_generated != Some(p.generated) {
            self.last_generated = Some(p.generated);
            self.progress_at = now;
            return None;
        }
        let quiet = now.saturating_duration_since(self.progress_at);
        (quiet >= self.limits.progress_timeout).then(|| Failure {
            reason: format!(
                "no token generated for {:.0}s while {} requests ran (PROGRESS_TIMEOUT)",
                quiet.as_secs_f64(),
                p.running
            ),
            detected_in: Some(quiet),
            cause: LossCause::Unwell,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            mem_guard_gib: Some(4.0),
            progress_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(300),
        }
    }

    fn beat(running: f64, waiting: f64, steps: f64) -> Sample {
        Sample {
            memory: Vec::new(),
            healthy: true,
            progress: Some(Progress {
                running,
                waiting,
                generated: steps,
                steps,
            }),
            scrape: None,
            gpus: Vec::new(),
            kernel: Vec::new(),
        }
    }

    #[test]
    fn no_engine_step_while_work_waits_is_a_stall_seen_first_as_stalled() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut w = Watchdog::new(
            Limits {
                stall_timeout: Duration::from_secs(30),
                progress_timeout: Duration::from_secs(600),
                ..limits()
            },
            t0,
        );
        assert_eq!(w.observe(&beat(0.0, 0.0, 10.0), s(0)), None);
        assert_eq!(w.observe(&beat(0.0, 0.0, 10.0), s(100)), None, "idle is not a stall");
        assert_eq!(w.stalled_for(s(100)), None);
        // A long prefill: no token, but steps move (chunks), so it is alive.
        for (i, t) in (101..=160).enumerate() {
            assert_eq!(w.observe(&beat(1.0, 0.0, 11.0 + i as f64), s(t)), None, "t={t}");
        }
        assert_eq!(w.stalled_for(s(160)), None);
        // Then the steps stop with work waiting.
        assert_eq!(w.observe(&beat(1.0, 2.0, 70.0), s(161)), None);
        assert_eq!(w.observe(&beat(1.0, 2.0, 70.0), s(170)), None);
        assert_eq!(
            w.stalled_for(s(170)),
            Some(Duration::from_secs(10)),
            "stalled after a third of STALL_TIMEOUT"
        );
        let mut unanswered = beat(0.0, 0.0, 0.0);
        unanswered.progress = None;
        assert_eq!(
            w.observe(&unanswered, s(180)),
            None,
            "an unanswered /metrics is no step"
        );
        let f = w.observe(&unanswered, s(190)).expect("30 s without a step");
        assert!(
            f.reason.contains("STALL_TIMEOUT=30s") && f.reason.contains("3 requests"),
            "{}",
            f.reason
        );
        assert_eq!(f.detected_in, Some(Duration::from_secs(30)));
    }

    fn sample(avail: f64, healthy: bool, progress: Option<(f64, f64)>) -> Sample {
        Sample {
            memory: vec![NodeMemory {
                node: "worker".into(),
                mem_available_gib: Some(avail),
            }],
            healthy,
            progress: progress.map(|(running, generated)| Progress {
                running,
                waiting: 0.0,
                generated,
                steps: generated,
            }),
            scrape: None,
            gpus: Vec::new(),
            kernel: Vec::new(),
        }
    }

    #[test]
    fn memguard_needs_two_low_samples_in_a_row() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(limits(), t0);
        assert_eq!(w.observe(&sample(3.0, true, None), t0), None);
        assert_eq!(w.observe(&sample(9.0, true, None), t0), None, "a good sample resets");
        assert_eq!(w.observe(&sample(3.0, true, None), t0), None);
        let f = w.observe(&sample(3.5, true, None), t0).unwrap();
        assert!(
            f.reason.contains("3.50 GiB < MEM_GUARD_GIB 4 on worker"),
            "{}",
            f.reason
        );
        let mut off = Watchdog::new(
            Limits {
                mem_guard_gib: None,
                ..limits()
            },
            t0,
        );
        assert_eq!(off.observe(&sample(0.1, true, None), t0), None);
        assert_eq!(
            off.observe(&sample(0.1, true, None), t0),
            None,
            "MEM_GUARD=0 never fires"
        );
    }

    #[test]
    fn three_failed_health_checks_and_since_when() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut w = Watchdog::new(limits(), t0);
        assert_eq!(w.observe(&sample(9.0, true, None), s(1)), None);
        assert_eq!(w.observe(&sample(9.0, false, None), s(2)), None);
        assert_eq!(w.observe(&sample(9.0, false, None), s(3)), None);
        let f = w.observe(&sample(9.0, false, None), s(4)).unwrap();
        assert_eq!(
            f.detected_in,
            Some(Duration::from_secs(3)),
            "from the last healthy answer"
        );
    }

    #[test]
    fn no_token_while_requests_run_is_a_stall_but_idle_is_not() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut w = Watchdog::new(limits(), t0);
        assert_eq!(w.observe(&sample(9.0, true, Some((0.0, 5.0))), s(0)), None);
        assert_eq!(w.observe(&sample(9.0, true, Some((0.0, 5.0))), s(100)), None, "idle");
        assert_eq!(w.observe(&sample(9.0, true, Some((2.0, 5.0))), s(101)), None);
        assert_eq!(
            w.observe(&sample(9.0, true, Some((2.0, 9.0))), s(120)),
            None,
            "progress"
        );
        assert_eq!(w.observe(&sample(9.0, true, Some((2.0, 9.0))), s(149)), None);
        let f = w.observe(&sample(9.0, true, Some((2.0, 9.0))), s(150)).unwrap();
        assert!(f.reason.contains("PROGRESS_TIMEOUT"), "{}", f.reason);
        assert_eq!(f.detected_in, Some(Duration::from_secs(30)));
    }
}
