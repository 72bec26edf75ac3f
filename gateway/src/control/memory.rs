//! The admission's memory guard (issue #35): a prefill takes transient unified memory on every
//! node of its group — about PREFILL_BYTES_PER_TOKEN per prompt token, given back when its
//! first token comes — and a node pushed under MEM_GUARD_GIB during a long prefill can freeze
//! the whole host before any restart helps. Admission therefore grants a prompt only when its
//! need fits above the line; one that does not waits in the queue while shorter ones go ahead.
//!
//! Two readings decide, since the supervisor's one-second samples lag the grants:
//! - `now`, the last sample (the tightest node of the open groups, bytes above the line): a new
//!   need must fit there, so memory taken by anything else holds prefills too;
//! - `idle`, the headroom with no prefill admitted by the gateway running: every need
//!   outstanding plus the new one must fit there. Counting them against `now` instead would
//!   count a running prefill twice (its reservation, and the memory the sample already shows
//!   it took), holding short prompts that do fit.
//!
//! Each sample bounds `idle` from both sides: it is at least `now` (what running prefills took
//! comes back when they end) and at most `now + reserved` (while the estimates are upper bounds
//! of what prefills take, they cannot have taken more); with nothing outstanding it is `now`.

/// A prompt's tokens estimated from its body's bytes before vLLM has tokenised it.
const BODY_BYTES_PER_TOKEN: u64 = 4;

/// A prompt's tokens estimated from the bytes of the body that carries it.
pub(crate) fn prompt_estimate(bytes: usize) -> u64 {
    bytes as u64 / BODY_BYTES_PER_TOKEN
}

/// What the guard knows; all figures in bytes above the line (negative: under it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct MemoryGuard {
    /// PREFILL_BYTES_PER_TOKEN; 0: no guard.
    per_token: u64,
    now: Option<i64>,
    idle: Option<i64>,
    /// The needs of admitted requests whose prefill has not ended.
    reserved: u64,
}

/// Why a waiter is not granted now, for its deadline's error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Short {
    pub(crate) need: u64,
    /// What it could have now: the least of the two readings, less what is outstanding.
    pub(crate) room: i64,
}

impl MemoryGuard {
    pub(crate) fn new(per_token: u64) -> MemoryGuard {
        MemoryGuard {
            per_token,
            ..MemoryGuard::default()
        }
    }

    /// The transient memory a prompt carried by `bytes` of body takes; 0 with no guard.
    pub(crate) fn need(&self, bytes: usize) -> u64 {
        prompt_estimate(bytes).saturating_mul(self.per_token)
    }

    /// Whether a prefill needing `need` may start now; `Err` says by how much it falls short.
    pub(crate) fn fits(&self, need: u64) -> Result<(), Short> {
        let Some(now) = self.now.filter(|_| need > 0) else {
            // No guard, no reading (gateway-only mode, a group not yet sampled): nothing to hold by.
            return Ok(());
        };
        let idle = self.idle.unwrap_or(now);
        let room = now.min(idle.saturating_sub(self.reserved as i64));
        if need as i64 <= room {
            Ok(())
        } else {
            Err(Short { need, room })
        }
    }

    /// Whether a prefill needing `need` would fit once the prefills now running have ended (it
    /// is worth holding the queue for).
    pub(crate) fn fits_when_idle(&self, need: u64) -> bool {
        self.idle.or(self.now).is_none_or(|idle| need as i64 <= idle)
    }

    /// A prefill needing `need` was admitted.
    pub(crate) fn take(&mut self, need: u64) {
        self.reserved += need;
    }

    /// A prefill needing `need` ended (its first token, or its request's end).
    pub(crate) fn give(&mut self, need: u64) {
        self.reserved -= need;
    }

    /// A new sample: bytes above the line on the tightest node of the open groups (`None`: no
    /// reading, so no guard until one comes).
    pub(crate) fn observe(&mut self, headroom: Option<i64>) {
        self.now = headroom;
        self.idle = headroom.map(|now| {
            let most = now.saturating_add(self.reserved as i64);
            self.idle.map_or(most, |idle| idle.min(most)).max(now)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    fn guard(headroom: i64) -> MemoryGuard {
        let mut g = MemoryGuard::new(1000);
        g.observe(Some(headroom));
        g
    }

    #[test]
    fn a_need_over_the_headroom_is_held_and_one_under_it_goes() {
        let g = guard(2 * GIB);
        assert_eq!(g.need(4000), 1_000_000);
        assert!(g.fits(GIB as u64).is_ok());
        let short = g.fits(3 * GIB as u64).unwrap_err();
        assert_eq!((short.need, short.room), (3 * GIB as u64, 2 * GIB));
    }

    #[test]
    fn under_the_line_no_prefill_is_admitted_and_without_a_reading_or_a_knob_nothing_is_held() {
        assert!(guard(-1).fits(1).is_err(), "under the line: not even one token");
        assert!(MemoryGuard::new(1000).fits(u64::MAX / 2).is_ok(), "no reading yet");
        let mut off = MemoryGuard::new(0);
        off.observe(Some(-GIB));
        assert_eq!(off.need(1 << 20), 0);
        assert!(off.fits(off.need(1 << 20)).is_ok(), "PREFILL_BYTES_PER_TOKEN=0");
    }

    #[test]
    fn a_running_prefill_counts_once_not_twice() {
        let mut g = guard(4 * GIB);
        g.take(3 * GIB as u64);
        // The next sample shows the long prefill having taken 2 GiB of its 3.
        g.observe(Some(2 * GIB));
        // Against the idle headroom: 4 - 3 = 1 GiB is left for others, not 2 - 3 < 0.
        assert!(g.fits(GIB as u64 / 2).is_ok());
        assert!(g.fits(2 * GIB as u64).is_err());
        g.give(3 * GIB as u64);
        // Its memory is not back in the sample yet: `now` still holds a 3 GiB prompt.
        assert!(g.fits(3 * GIB as u64).is_err());
        g.observe(Some(4 * GIB));
        assert!(g.fits(3 * GIB as u64).is_ok());
    }

    #[test]
    fn memory_taken_by_something_else_holds_prefills_even_while_the_gateway_runs_none() {
        let mut g = guard(4 * GIB);
        g.observe(Some(GIB / 2));
        assert!(g.fits(GIB as u64).is_err());
        assert!(
            !g.fits_when_idle(GIB as u64),
            "the idle headroom is what the node shows"
        );
    }

    #[test]
    fn each_sample_bounds_the_idle_headroom_from_both_sides() {
        let mut g = guard(4 * GIB);
        g.take(GIB as u64);
        g.observe(Some(4 * GIB)); // the new prefill does not show yet: idle stays
        assert_eq!(g.idle, Some(4 * GIB));
        g.observe(Some(GIB)); // 1 GiB reserved, 3 GiB gone: something else took 2
        assert_eq!(g.idle, Some(2 * GIB));
        g.observe(Some(5 * GIB)); // memory came back: idle is at least what the node shows
        assert_eq!(g.idle, Some(5 * GIB));
        g.give(GIB as u64);
        g.observe(Some(3 * GIB)); // nothing outstanding: taken as it is
        assert_eq!(g.idle, Some(3 * GIB));
        assert!(g.fits_when_idle(3 * GIB as u64) && !g.fits_when_idle(4 * GIB as u64));
        g.observe(None);
        assert!(g.fits(u64::MAX / 2).is_ok(), "no reading: no guard");
    }
}
