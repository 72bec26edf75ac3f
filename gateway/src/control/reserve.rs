//! The interactive reserve (INTERACTIVE_RESERVE, docs/keys.md): long requests — a prompt whose
//! estimate is above LONG_PROMPT_TOKENS, or a key of `class=batch` — hold at most the capacity
//! less the reserved slots while another client has been active (a request of its that is not
//! long arrived or ended) in the last INTERACTIVE_ACTIVE_S, so the next chat finds a slot
//! instead of waiting for a whole long prefill. Nobody else around, long requests take every
//! slot; a long request held past LONG_MAX_WAIT_S takes a reserved one (nothing starves). The cap
//! itself is admission's: the reserve only says which waiters may take a free slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// The rule, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) slots: u32,
    pub(crate) active: Duration,
    pub(crate) max_wait: Duration,
}

/// Where the reserve reads the time when it records activity: the runtime's clock (tests in
/// virtual time), or a coarse clock a thread advances every 50 ms — every arrival and release
/// records activity, and an atomic load costs it nothing where two clock reads cost a third of
/// an uncontended permit (BENCHMARKS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Clock {
    #[cfg_attr(not(test), allow(dead_code))]
    Runtime,
    #[default]
    Coarse,
}

/// The coarse clock: its start and the milliseconds since, advanced by its thread.
static COARSE: OnceLock<(std::time::Instant, AtomicU64)> = OnceLock::new();
const COARSE_TICK: Duration = Duration::from_millis(50);

/// The coarse clock's start and its milliseconds since, started with its thread.
fn coarse() -> &'static (std::time::Instant, AtomicU64) {
    COARSE.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("sparkgate-clock".into())
            .spawn(|| loop {
                std::thread::sleep(COARSE_TICK);
                if let Some((start, ms)) = COARSE.get() {
                    ms.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            });
        (std::time::Instant::now(), AtomicU64::new(0))
    })
}

impl Clock {
    /// Where its milliseconds count from.
    fn base(self) -> Instant {
        match self {
            Clock::Runtime => Instant::now(),
            Clock::Coarse => Instant::from_std(coarse().0),
        }
    }

    /// Milliseconds since `base`.
    fn ms(self, base: Instant) -> u64 {
        match self {
            Clock::Runtime => base.elapsed().as_millis() as u64,
            Clock::Coarse => coarse().1.load(Ordering::Relaxed),
        }
    }
}

/// The two latest clients active (not long), each with when (ms since the clock's base): the
/// latest, and the latest other than it — all "is anyone but C active?" needs.
#[derive(Debug, Default, Clone, Copy)]
struct Recent {
    latest: Option<(u64, u64)>,
    other: Option<(u64, u64)>,
}

impl Recent {
    fn saw(&mut self, client: u64, at: u64) {
        match self.latest {
            Some((c, _)) if c == client => {}
            previous => self.other = previous,
        }
        self.latest = Some((client, at));
    }

    /// When the latest client other than `client` was active.
    fn besides(&self, client: u64) -> Option<u64> {
        match self.latest {
            Some((c, at)) if c != client => Some(at),
            _ => self.other.map(|(_, at)| at),
        }
    }
}

/// The reserve's state: the slots long requests hold and who was recently active.
#[derive(Debug, Default)]
pub(crate) struct Reserve {
    rule: Option<Rule>,
    clock: Clock,
    /// Where the clock's milliseconds count from.
    base: Option<Instant>,
    /// Slots held by long requests.
    long_in_use: u32,
    recent: Recent,
}

impl Reserve {
    /// Holds `rule.slots` back from long requests (0 slots: off), reading `clock`.
    pub(crate) fn set(&mut self, rule: Rule, clock: Clock) {
        self.rule = (rule.slots > 0).then_some(rule);
        self.clock = clock;
        self.base = Some(clock.base());
    }

    /// Whether the reserve is on at all (the only question an uncontended short request asks).
    pub(crate) fn on(&self) -> bool {
        self.rule.is_some()
    }

    /// A request of `client` that is not long arrived or ended now.
    pub(crate) fn saw(&mut self, client: u64) {
        if let (Some(_), Some(base)) = (self.rule, self.base) {
            self.recent.saw(client, self.clock.ms(base));
        }
    }

    /// Until when another client than `client` counts as active (`None`: none does at `now`).
    fn others_active_until(&self, client: u64, now: Instant) -> Option<Instant> {
        let at = self.base? + Duration::from_millis(self.recent.besides(client)?);
        let until = at + self.rule?.active;
        (until > now).then_some(until)
    }

    /// The slots long requests leave free now: the configured ones, at most all but one.
    fn held(&self, capacity: u32) -> u32 {
        self.rule.map_or(0, |r| r.slots.min(capacity.saturating_sub(1)))
    }

    /// Whether a long request of `client` for `n` slots, waiting since `arrived`, may take a
    /// free slot of `capacity` at `now`.
    pub(crate) fn admits(&self, (client, n): (u64, u32), capacity: u32, arrived: Instant, now: Instant) -> bool {
        let Some(rule) = self.rule else { return true };
        self.long_in_use + n + self.held(capacity) <= capacity
            || now >= arrived + rule.max_wait
            || self.others_active_until(client, now).is_none()
    }

    /// When a long request held by the reserve may be let in without a release: its wait's
    /// end, or the moment nobody else counts as active.
    pub(crate) fn recheck_at(&self, client: u64, arrived: Instant, now: Instant) -> Option<Instant> {
        let rule = self.rule?;
        let patience = arrived + rule.max_wait;
        Some(
            self.others_active_until(client, now)
                .map_or(patience, |u| u.min(patience)),
        )
    }

    /// A long request took `n` slots.
    pub(crate) fn take(&mut self, n: u32) {
        self.long_in_use += n;
    }

    /// A long request gave back `n` slots.
    pub(crate) fn give(&mut self, n: u32) {
        self.long_in_use -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAVY: u64 = 1;
    const CHAT: u64 = 2;

    fn reserve(slots: u32) -> Reserve {
        let mut r = Reserve::default();
        let rule = Rule {
            slots,
            active: Duration::from_secs(10),
            max_wait: Duration::from_secs(30),
        };
        r.set(rule, Clock::Runtime);
        r
    }

    /// The runtime's clock, paused: the tests move it.
    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    #[test]
    fn long_requests_leave_a_slot_while_another_client_is_active() {
        paused().block_on(async {
            let t0 = Instant::now();
            let mut r = reserve(1);
            assert!(r.admits((HEAVY, 1), 2, t0, t0), "nobody else around");
            r.take(1);
            assert!(
                r.admits((HEAVY, 1), 2, t0, t0),
                "alone, a long request takes every slot"
            );
            r.saw(CHAT);
            assert!(
                !r.admits((HEAVY, 1), 2, t0, t0),
                "a chat was active: the last slot is held"
            );
            r.saw(HEAVY);
            assert!(
                !r.admits((HEAVY, 1), 2, t0, t0),
                "its own short requests do not lift it"
            );
            assert_eq!(r.recheck_at(HEAVY, t0, t0), Some(t0 + Duration::from_secs(10)));
            let later = t0 + Duration::from_secs(10);
            assert!(r.admits((HEAVY, 1), 2, t0, later), "the chat client went quiet");
            tokio::time::sleep(Duration::from_secs(25)).await;
            r.saw(CHAT);
            let patience = t0 + Duration::from_secs(30);
            assert_eq!(r.recheck_at(HEAVY, t0, t0 + Duration::from_secs(26)), Some(patience));
            assert!(!r.admits((HEAVY, 1), 2, t0, patience - Duration::from_millis(1)));
            assert!(
                r.admits((HEAVY, 1), 2, t0, patience),
                "held past LONG_MAX_WAIT_S it goes"
            );
            r.give(1);
            assert!(r.admits((HEAVY, 1), 2, t0, t0), "one long request in one of two slots");
        });
    }

    #[test]
    fn one_slot_is_never_held_and_zero_is_off() {
        paused().block_on(async {
            let t0 = Instant::now();
            let mut r = reserve(4);
            r.saw(CHAT);
            assert!(r.admits((HEAVY, 1), 1, t0, t0), "with one slot nothing is held");
            assert_eq!(r.held(4), 3, "at most all but one");
            assert!(r.admits((HEAVY, 1), 4, t0, t0));
            r.take(1);
            assert!(!r.admits((HEAVY, 1), 4, t0, t0), "long requests keep one slot of four");
            let mut off = reserve(0);
            off.saw(CHAT);
            assert!(!off.on() && off.admits((HEAVY, 2), 2, t0, t0));
        });
    }

    #[test]
    fn the_coarse_clock_moves() {
        let base = Clock::Coarse.base();
        let first = Clock::Coarse.ms(base);
        std::thread::sleep(Duration::from_millis(120));
        assert!(Clock::Coarse.ms(base) > first, "its thread advances it");
    }
}
