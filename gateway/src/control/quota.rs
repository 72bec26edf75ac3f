//! Token quotas per API key (docs/keys.md): tokens per minute and per day (prompt +
//! completion) and sequences at once, each the key's own (API_KEYS_FILE) or the default
//! (KEY_TOKENS_PER_MINUTE, KEY_TOKENS_PER_DAY, KEY_MAX_SEQUENCES). A request reserves its cost
//! (its prompt's estimate + its `max_tokens`) at admission, before it takes a slot, and settles
//! with the real usage when it ends. The windows slide (`Slide`): no 60 s (no 24 h) ever holds
//! more than the quota, whatever the wall clock's minute, and Retry-After is when enough of the
//! window has slid out for the request to fit. At a start they are rebuilt from the store's
//! per-minute usage rows, each minute's tokens counted at the latest second they could have
//! been used. A request that alone exceeds a token quota is let into an empty window (it could
//! never be served otherwise). Under QUOTA_MODE=shadow nothing is refused: the refusal it would
//! have been is reported.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sparkgate_config::{KeyQuota, QuotaMode};

use crate::control::keys::KeyInfo;

/// The two token windows: their span and the width of the buckets they count in (seconds).
const MINUTE: (i64, i64) = (60, 1);
const DAY: (i64, i64) = (86_400, 60);

/// Which quota a request is over.
pub(crate) use crate::observe::QuotaLimit as Limit;

/// A request over its key's quota, and when the quota has room again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) limit: Limit,
    pub(crate) quota: u64,
    pub(crate) retry_after: Duration,
}

/// Tokens counted over a sliding span, in buckets of `step` seconds. A bucket leaves once the
/// span has passed its *end* (`start + step + span <= now`), so two tokens it counts apart are
/// at least a span apart in real time, whatever the second's fraction they came at.
#[derive(Debug)]
struct Slide {
    span: i64,
    step: i64,
    buckets: VecDeque<(i64, u64)>,
    used: u64,
}

impl Slide {
    fn new((span, step): (i64, i64)) -> Slide {
        Slide {
            span,
            step,
            buckets: VecDeque::new(),
            used: 0,
        }
    }

    fn start(&self, at: i64) -> i64 {
        at - at.rem_euclid(self.step)
    }

    /// The second bucket `start` leaves the window.
    fn leaves(&self, start: i64) -> i64 {
        start + self.step + self.span
    }

    /// Drops the buckets the window has slid past at `now`.
    fn roll(&mut self, now: i64) {
        while let Some(&(start, n)) = self.buckets.front() {
            if self.leaves(start) > now {
                break;
            }
            self.buckets.pop_front();
            self.used -= n;
        }
    }

    /// Counts `n` tokens at `at`; the bucket they went to.
    fn add(&mut self, at: i64, n: u64) -> i64 {
        let start = self.start(at);
        match self.buckets.iter_mut().rev().find(|(s, _)| *s == start) {
            Some((_, m)) => *m += n,
            None => {
                let at = self.buckets.iter().rposition(|(s, _)| *s < start).map_or(0, |i| i + 1);
                self.buckets.insert(at, (start, n));
            }
        }
        self.used += n;
        start
    }

    /// Replaces `reserved` tokens counted in bucket `start` by `used` (nothing once it left).
    fn settle(&mut self, start: i64, reserved: u64, used: u64) {
        if let Some((_, n)) = self.buckets.iter_mut().find(|(s, _)| *s == start) {
            let now = (*n + used).saturating_sub(reserved);
            self.used = self.used - *n + now;
            *n = now;
        }
    }

    /// Whether `cost` more tokens would break `quota` (an empty window takes any one request).
    fn over(&self, quota: u64, cost: u64) -> bool {
        quota > 0 && self.used > 0 && self.used + cost > quota
    }

    /// Seconds from `now` until `cost` more fits under `quota`: until the oldest buckets that
    /// free enough have left (all of them, for a cost above the quota).
    fn fits_in(&self, quota: u64, cost: u64, now: i64) -> i64 {
        let excess = (self.used + cost).saturating_sub(quota);
        let mut freed = 0;
        for &(start, n) in &self.buckets {
            freed += n;
            if freed >= excess {
                return self.leaves(start) - now;
            }
        }
        self.buckets.back().map_or(0, |&(start, _)| self.leaves(start) - now)
    }
}

/// What one key used in its windows.
#[derive(Debug)]
struct Window {
    minute: Slide,
    day: Slide,
    sequences: u32,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            minute: Slide::new(MINUTE),
            day: Slide::new(DAY),
            sequences: 0,
        }
    }
}

impl Window {
    fn roll(&mut self, now: i64) {
        self.minute.roll(now);
        self.day.roll(now);
    }
}

/// A request's reservation, settled with `Quotas::settle`.
#[derive(Debug)]
pub(crate) struct Hold {
    key: Arc<str>,
    reserved: u64,
    /// The buckets it was counted in.
    minute: i64,
    day: i64,
    seqs: u32,
}

#[derive(Debug)]
pub(crate) struct Quotas {
    defaults: KeyQuota,
    pub(crate) mode: QuotaMode,
    keys: Mutex<HashMap<Arc<str>, Window>>,
}

impl Quotas {
    pub(crate) fn new(defaults: KeyQuota, mode: QuotaMode) -> Quotas {
        Quotas {
            defaults,
            mode,
            keys: Mutex::default(),
        }
    }

    /// The quotas `key` is under: its own, else the defaults (0: none).
    fn limits(&self, key: &KeyInfo) -> KeyQuota {
        let s = &key.settings;
        KeyQuota {
            tokens_per_minute: s.tokens_per_minute.unwrap_or(self.defaults.tokens_per_minute),
            tokens_per_day: s.tokens_per_day.unwrap_or(self.defaults.tokens_per_day),
            max_sequences: s.max_sequences.unwrap_or(self.defaults.max_sequences),
        }
    }

    /// Tokens `key` used in the minute starting at `minute` before this process started (a
    /// store row), counted at the latest second of it that is not after `now`.
    pub(crate) fn seed(&self, key: &str, minute: i64, tokens: u64, now: i64) {
        let mut keys = self.keys.lock().expect("quota lock");
        let w = keys.entry(key.into()).or_default();
        let at = (minute + 59).min(now);
        w.minute.add(at, tokens);
        w.day.add(at, tokens);
        w.roll(now);
    }

    /// Reserves `cost` tokens and `seqs` sequences for a request of `key` at `now` (seconds).
    /// Enforced, a refusal reserves nothing; in shadow mode the request is reserved and its
    /// refusal reported all the same.
    pub(crate) fn reserve(&self, key: &KeyInfo, cost: u64, seqs: u32, now: i64) -> (Option<Hold>, Option<Refusal>) {
        let limits = self.limits(key);
        let mut keys = self.keys.lock().expect("quota lock");
        let w = keys.entry(key.name.clone()).or_default();
        w.roll(now);
        let refusal = over(&limits, w, cost, seqs, now);
        if refusal.is_some() && self.mode == QuotaMode::Enforce {
            return (None, refusal);
        }
        w.sequences += seqs;
        let hold = Hold {
            key: key.name.clone(),
            reserved: cost,
            minute: w.minute.add(now, cost),
            day: w.day.add(now, cost),
            seqs,
        };
        (Some(hold), refusal)
    }

    /// Each quota `key` is under (not 0) with what its window holds at `now`: (the limit's
    /// name, the quota, tokens or sequences used) — the console's quota table.
    pub(crate) fn standing(&self, key: &KeyInfo, now: i64) -> Vec<(&'static str, u64, u64)> {
        let limits = self.limits(key);
        let mut keys = self.keys.lock().expect("quota lock");
        let (minute, day, seqs) = match keys.get_mut(&key.name) {
            Some(w) => {
                w.roll(now);
                (w.minute.used, w.day.used, u64::from(w.sequences))
            }
            None => (0, 0, 0),
        };
        [
            ("tokens_per_minute", limits.tokens_per_minute, minute),
            ("tokens_per_day", limits.tokens_per_day, day),
            ("max_sequences", u64::from(limits.max_sequences), seqs),
        ]
        .into_iter()
        .filter(|(_, quota, _)| *quota > 0)
        .collect()
    }

    /// Replaces a reservation by what the request really used; its sequences are free again.
    pub(crate) fn settle(&self, hold: Hold, used: u64) {
        let mut keys = self.keys.lock().expect("quota lock");
        let Some(w) = keys.get_mut(&hold.key) else { return };
        w.minute.settle(hold.minute, hold.reserved, used);
        w.day.settle(hold.day, hold.reserved, used);
        w.sequences = w.sequences.saturating_sub(hold.seqs);
    }
}

/// The first quota a request of `cost` tokens and `seqs` sequences would break.
fn over(limits: &KeyQuota, w: &Window, cost: u64, seqs: u32, now: i64) -> Option<Refusal> {
    let refuse = |limit, quota, secs: i64| Refusal {
        limit,
        quota,
        retry_after: Duration::from_secs(secs.max(1) as u64),
    };
    let max = limits.max_sequences;
    if max > 0 && w.sequences > 0 && w.sequences + seqs > max {
        return Some(refuse(Limit::Sequences, u64::from(max), 1));
    }
    let tpm = limits.tokens_per_minute;
    if w.minute.over(tpm, cost) {
        return Some(refuse(Limit::TokensPerMinute, tpm, w.minute.fits_in(tpm, cost, now)));
    }
    let tpd = limits.tokens_per_day;
    if w.day.over(tpd, cost) {
        return Some(refuse(Limit::TokensPerDay, tpd, w.day.fits_in(tpd, cost, now)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tpm: Option<u64>) -> KeyInfo {
        let mut k = KeyInfo::named("alice");
        k.settings.tokens_per_minute = tpm;
        k
    }

    const T0: i64 = 1_800_000_000 - 1_800_000_000 % 86_400 + 3_600; // 01:00 UTC, minute start

    #[test]
    fn a_key_over_its_minute_waits_until_enough_has_slid_out_and_settling_gives_back_the_rest() {
        let q = Quotas::new(KeyQuota::default(), QuotaMode::Enforce);
        let k = key(Some(1_000));
        let (hold, refused) = q.reserve(&k, 900, 1, T0);
        assert_eq!(refused, None);
        let (none, refused) = q.reserve(&k, 200, 1, T0 + 15);
        assert!(none.is_none());
        let r = refused.unwrap();
        assert_eq!(
            (r.limit, r.quota, r.retry_after),
            (Limit::TokensPerMinute, 1_000, Duration::from_secs(46)),
            "the 900 leave 61 s after the second they came in"
        );
        q.settle(hold.unwrap(), 300);
        assert_eq!(
            q.reserve(&k, 200, 1, T0 + 20).1,
            None,
            "the unused reservation came back"
        );
        assert!(
            q.reserve(&k, 600, 1, T0 + 60).1.is_some(),
            "a new wall-clock minute is no new window"
        );
        assert_eq!(q.reserve(&k, 600, 1, T0 + 61).1, None, "the first 300 slid out");
        let big = q.reserve(&KeyInfo::named("bob"), 5_000, 1, T0);
        assert_eq!(big.1, None, "no quota: nothing refused");
        let mut dave = KeyInfo::named("dave");
        dave.settings.tokens_per_minute = Some(100);
        let (alone, refused) = q.reserve(&dave, 5_000, 1, T0 + 120);
        assert!(
            alone.is_some() && refused.is_none(),
            "an empty window takes one request of any size"
        );
    }

    #[test]
    fn no_sixty_seconds_hold_more_than_the_quota_across_a_minute_boundary() {
        let q = Quotas::new(KeyQuota::default(), QuotaMode::Enforce);
        let k = key(Some(1_000));
        // Five requests of 200 at the minute's last second, then one every second after it.
        let mut granted = Vec::new();
        for _ in 0..5 {
            let (hold, refused) = q.reserve(&k, 200, 1, T0 + 59);
            assert_eq!(refused, None);
            q.settle(hold.unwrap(), 200);
            granted.push(T0 + 59);
        }
        let mut first_after = None;
        for t in T0 + 60..T0 + 200 {
            let (hold, refused) = q.reserve(&k, 200, 1, t);
            match (hold, refused) {
                (Some(h), None) => {
                    q.settle(h, 200);
                    granted.push(t);
                    first_after.get_or_insert(t);
                }
                (None, Some(r)) if first_after.is_none() => {
                    assert_eq!(r.retry_after, Duration::from_secs((T0 + 120 - t) as u64), "at {t}");
                }
                _ => {}
            }
        }
        assert_eq!(
            first_after,
            Some(T0 + 120),
            "the boundary's tokens leave 61 s after their second"
        );
        for (i, a) in granted.iter().enumerate() {
            // Whole seconds: a request at second s ran at s + a fraction, so "within 60 s" of a
            // later one is any at second < a + 61.
            let within = granted[i..].iter().filter(|b| **b < a + 61).count();
            assert!(within * 200 <= 1_000, "{within} requests within 60 s of second {a}");
        }
    }

    #[test]
    fn days_slide_are_rebuilt_from_the_store_and_shadow_mode_serves() {
        let defaults = KeyQuota {
            tokens_per_minute: 0,
            tokens_per_day: 10_000,
            max_sequences: 2,
        };
        let q = Quotas::new(defaults, QuotaMode::Enforce);
        let k = KeyInfo::named("ci");
        // The store's rows: 9 000 tokens 23 h ago, 950 in the minute before now.
        q.seed("ci", T0 - 23 * 3_600, 9_000, T0);
        q.seed("ci", T0 - 60, 950, T0);
        let r = q.reserve(&k, 100, 1, T0).1.unwrap();
        assert_eq!(
            (r.limit, r.retry_after),
            (Limit::TokensPerDay, Duration::from_secs(3_600 + 60)),
            "the 9 000 slide out 24 h (and a bucket) after their minute"
        );
        assert_eq!(q.reserve(&k, 10, 1, T0).1, None);
        let (h2, _) = q.reserve(&k, 10, 1, T0);
        let r = q.reserve(&k, 10, 1, T0).1.unwrap();
        assert_eq!((r.limit, r.retry_after), (Limit::Sequences, Duration::from_secs(1)));
        q.settle(h2.unwrap(), 10);
        assert_eq!(q.reserve(&k, 10, 1, T0).1, None, "a sequence ended");
        let shadow = Quotas::new(defaults, QuotaMode::Shadow);
        shadow.seed("ci", T0 - 60, 10_000, T0);
        let (hold, refused) = shadow.reserve(&k, 100, 1, T0);
        assert!(hold.is_some(), "shadow mode serves it");
        assert_eq!(
            refused.unwrap().limit,
            Limit::TokensPerDay,
            "and says what it would have refused"
        );
    }

    #[test]
    fn a_minute_row_from_the_store_counts_in_the_minute_window_until_it_could_have_left() {
        let q = Quotas::new(KeyQuota::default(), QuotaMode::Enforce);
        let k = key(Some(1_000));
        q.seed("alice", T0, 900, T0 + 30);
        let r = q.reserve(&k, 200, 1, T0 + 30).1.unwrap();
        assert_eq!(
            r.retry_after,
            Duration::from_secs(61),
            "counted at now (T0+30), its latest second"
        );
    }
}
