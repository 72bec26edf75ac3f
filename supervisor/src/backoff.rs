//! Restart pacing: exponential backoff with jitter (Kubernetes' anchor: 10 s doubling to 5 min,
//! reset after 10 min healthy) and a give-up budget of failures in a row.

use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    budget: u32,
    failures: u32,
    seed: u64,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration, reset_after: Duration, budget: u32) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Self::seeded(initial, max, reset_after, budget, seed)
    }

    /// With a fixed jitter seed (tests replay the same delays).
    pub(crate) fn seeded(initial: Duration, max: Duration, reset_after: Duration, budget: u32, seed: u64) -> Self {
        let seed = seed | 1;
        Self {
            initial,
            max,
            reset_after,
            budget,
            failures: 0,
            seed,
        }
    }

    /// Records a failure; the delay before the next attempt, or `None` when the budget is spent.
    pub(crate) fn failed(&mut self) -> Option<Duration> {
        self.failures += 1;
        if self.failures > self.budget {
            return None;
        }
        let exp = self.initial.as_secs_f64() * 2f64.powi(self.failures as i32 - 1);
        let base = exp.min(self.max.as_secs_f64());
        // ±10 % jitter so a fleet does not restart in lockstep.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let unit = (self.seed >> 11) as f64 / (1u64 << 53) as f64;
        Some(Duration::from_secs_f64(
            (base * (0.9 + 0.2 * unit)).min(self.max.as_secs_f64()).max(0.0),
        ))
    }

    /// A group that stayed healthy this long has earned a clean slate.
    pub(crate) fn healthy_for(&mut self, d: Duration) {
        if d >= self.reset_after {
            self.failures = 0;
        }
    }

    /// An operator's start: the failures so far no longer count.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_then_gives_up() {
        let mut b = Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(300),
            Duration::from_secs(600),
            7,
        );
        let delays: Vec<f64> = (0..7).map(|_| b.failed().unwrap().as_secs_f64()).collect();
        for (d, expected) in delays.iter().zip([10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]) {
            assert!((d - expected).abs() <= expected * 0.1 + 1e-9, "{d} vs {expected}");
            assert!(*d <= 300.0);
        }
        assert_eq!(b.failed(), None, "budget spent");
    }

    #[test]
    fn a_long_healthy_run_resets() {
        let mut b = Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(300),
            Duration::from_secs(600),
            3,
        );
        b.failed();
        b.failed();
        b.healthy_for(Duration::from_secs(599));
        assert_eq!(b.failures(), 2);
        b.healthy_for(Duration::from_secs(600));
        assert_eq!(b.failures(), 0);
        assert!(b.failed().unwrap() <= Duration::from_secs(11));
    }
}
