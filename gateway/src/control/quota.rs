//! Token quotas per API key (docs/keys.md): tokens per minute and per UTC day (prompt +
//! completion) and sequences at once, each the key's own (API_KEYS_FILE) or the default
//! (KEY_TOKENS_PER_MINUTE, KEY_TOKENS_PER_DAY, KEY_MAX_SEQUENCES). A request reserves its cost
//! (its prompt's estimate + its `max_tokens`) at admission, before it takes a slot, and settles
//! with the real usage when it ends. Windows are the wall clock's minute and day. A request that
//! alone exceeds a token quota is let into an empty window (it could never be served otherwise).
//! Under QUOTA_MODE=shadow nothing is refused: the refusal it would have been is reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sparkgate_config::{KeyQuota, QuotaMode};

use crate::control::keys::KeyInfo;

const DAY: i64 = 86_400;

/// Which quota a request is over.
pub(crate) use crate::observe::QuotaLimit as Limit;

/// A request over its key's quota, and when the quota has room again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) limit: Limit,
    pub(crate) quota: u64,
    pub(crate) retry_after: Duration,
}

/// What one key used in its current windows.
#[derive(Debug, Default)]
struct Window {
    minute: i64,
    minute_used: u64,
    day: i64,
    day_used: u64,
    sequences: u32,
}

impl Window {
    /// Moves the windows to `now`'s minute and day.
    fn roll(&mut self, now: i64) {
        if self.minute != now.div_euclid(60) {
            self.minute = now.div_euclid(60);
            self.minute_used = 0;
        }
        if self.day != now.div_euclid(DAY) {
            self.day = now.div_euclid(DAY);
            self.day_used = 0;
        }
    }
}

/// A request's reservation, settled with `Quotas::settle`.
#[derive(Debug)]
pub(crate) struct Hold {
    key: Arc<str>,
    reserved: u64,
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

    /// Tokens `key` used today before this process started (from the store), counted in its day.
    pub(crate) fn seed(&self, key: &str, used_today: u64, now: i64) {
        let mut keys = self.keys.lock().expect("quota lock");
        let w = keys.entry(key.into()).or_default();
        w.roll(now);
        w.day_used += used_today;
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
        w.minute_used += cost;
        w.day_used += cost;
        w.sequences += seqs;
        let hold = Hold {
            key: key.name.clone(),
            reserved: cost,
            minute: w.minute,
            day: w.day,
            seqs,
        };
        (Some(hold), refusal)
    }

    /// Replaces a reservation by what the request really used; its sequences are free again.
    pub(crate) fn settle(&self, hold: Hold, used: u64) {
        let mut keys = self.keys.lock().expect("quota lock");
        let Some(w) = keys.get_mut(&hold.key) else { return };
        if w.minute == hold.minute {
            w.minute_used = (w.minute_used + used).saturating_sub(hold.reserved);
        }
        if w.day == hold.day {
            w.day_used = (w.day_used + used).saturating_sub(hold.reserved);
        }
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
    if tpm > 0 && w.minute_used > 0 && w.minute_used + cost > tpm {
        return Some(refuse(Limit::TokensPerMinute, tpm, 60 - now.rem_euclid(60)));
    }
    let tpd = limits.tokens_per_day;
    if tpd > 0 && w.day_used > 0 && w.day_used + cost > tpd {
        return Some(refuse(Limit::TokensPerDay, tpd, DAY - now.rem_euclid(DAY)));
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
    fn a_key_over_its_minute_is_refused_until_the_next_minute_and_settling_gives_back_the_rest() {
        let q = Quotas::new(KeyQuota::default(), QuotaMode::Enforce);
        let k = key(Some(1_000));
        let (hold, refused) = q.reserve(&k, 900, 1, T0);
        assert_eq!(refused, None);
        let (none, refused) = q.reserve(&k, 200, 1, T0 + 15);
        assert!(none.is_none());
        let r = refused.unwrap();
        assert_eq!(
            (r.limit, r.quota, r.retry_after),
            (Limit::TokensPerMinute, 1_000, Duration::from_secs(45))
        );
        q.settle(hold.unwrap(), 300);
        assert_eq!(
            q.reserve(&k, 200, 1, T0 + 20).1,
            None,
            "the unused reservation came back"
        );
        assert_eq!(q.reserve(&k, 600, 1, T0 + 60).1, None, "a new minute");
        let big = q.reserve(&KeyInfo::named("bob"), 5_000, 1, T0);
        assert_eq!(big.1, None, "no quota: nothing refused");
        let (alone, refused) = q.reserve(&key(Some(100)), 5_000, 1, T0 + 120);
        assert!(
            alone.is_some() && refused.is_none(),
            "an empty window takes one request of any size"
        );
    }

    #[test]
    fn days_sequences_and_shadow_mode() {
        let defaults = KeyQuota {
            tokens_per_minute: 0,
            tokens_per_day: 10_000,
            max_sequences: 2,
        };
        let q = Quotas::new(defaults, QuotaMode::Enforce);
        let k = KeyInfo::named("ci");
        q.seed("ci", 9_950, T0);
        let r = q.reserve(&k, 100, 1, T0).1.unwrap();
        assert_eq!(
            (r.limit, r.retry_after),
            (Limit::TokensPerDay, Duration::from_secs(23 * 3600))
        );
        assert_eq!(q.reserve(&k, 10, 1, T0).1, None);
        let (h2, _) = q.reserve(&k, 10, 1, T0);
        let r = q.reserve(&k, 10, 1, T0).1.unwrap();
        assert_eq!((r.limit, r.retry_after), (Limit::Sequences, Duration::from_secs(1)));
        q.settle(h2.unwrap(), 10);
        assert_eq!(q.reserve(&k, 10, 1, T0).1, None, "a sequence ended");
        let shadow = Quotas::new(defaults, QuotaMode::Shadow);
        shadow.seed("ci", 10_000, T0);
        let (hold, refused) = shadow.reserve(&k, 100, 1, T0);
        assert!(hold.is_some(), "shadow mode serves it");
        assert_eq!(
            refused.unwrap().limit,
            Limit::TokensPerDay,
            "and says what it would have refused"
        );
    }
}
