//! The `auto` speculation policy as a pure state machine in caller-supplied time: demand width
//! samples in, switch decisions (taken or declined, with their numbers) out. No clock, no I/O, so
//! the same code runs in the supervisor and in the virtual-time evaluation harness.
//!
//! The rule, per sample (about one a second):
//! - Each mode's expected rate is an exponential average (time constant `rate_tau_s`) of its
//!   table at each sampled width (in flight + queued) — the average of the rates, not the rate at
//!   the average width, which would misjudge a load that swings between 1 and 4 streams. The best
//!   mode is the one with the highest expected rate. (The demand level reported with decisions
//!   is the same average of the width itself.)
//! - A regime starts when the best mode changes. Its expected remaining duration is the time it
//!   has lasted so far (a Lindy estimate: a load that has held for an hour is likelier to hold for
//!   another than one that began a minute ago), capped at `max_horizon_s`.
//! - Switching from A to B needs all of: B best for at least `hold_s` (hysteresis), at least
//!   `min_dwell_s` since the last switch, and
//!   `(rate_B − rate_A) × expected ≥ margin × restart_s × rate_A` — the tokens gained over the
//!   expected duration beat the tokens lost while the group restarts.

use serde::Serialize;

/// One mode as the policy sees it: its aggregate tokens/s by width (index 0 = width 1; widths past
/// the end hold the last value, as the mode's MAX_NUM_SEQS caps what it can run at once).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeRates {
    pub name: String,
    pub tokens_per_s: Vec<f64>,
}

impl ModeRates {
    /// Aggregate tokens/s at a (possibly fractional) width, linear between integer widths.
    pub fn at(&self, width: f64) -> f64 {
        if width <= 0.0 || self.tokens_per_s.is_empty() {
            return 0.0;
        }
        let last = self.tokens_per_s.len() as f64;
        let w = width.min(last);
        if w < 1.0 {
            return self.tokens_per_s[0] * w;
        }
        let lo = w.floor() as usize;
        let frac = w - w.floor();
        let a = self.tokens_per_s[lo - 1];
        let b = self.tokens_per_s.get(lo).copied().unwrap_or(a);
        a + frac * (b - a)
    }
}

/// The policy's knobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySettings {
    /// Seconds the group takes to restart into another mode (drain + reload + ready).
    pub restart_s: f64,
    /// Minimum seconds between two switches.
    pub min_dwell_s: f64,
    /// Seconds the other mode must stay best before a switch is considered.
    pub hold_s: f64,
    /// How much the expected gain must exceed the restart loss.
    pub margin: f64,
    /// Time constant of the per-mode rate averages (and of the reported demand level).
    pub rate_tau_s: f64,
    /// Cap on the expected remaining duration of a regime.
    pub max_horizon_s: f64,
}

impl PolicySettings {
    /// Defaults for a restart that costs `restart_s`.
    pub fn for_restart(restart_s: f64) -> Self {
        Self {
            restart_s,
            min_dwell_s: (2.0 * restart_s).max(120.0),
            hold_s: 60.0,
            margin: 1.5,
            rate_tau_s: 300.0,
            max_horizon_s: 4.0 * 3600.0,
        }
    }
}

/// A considered switch, taken or declined, with the numbers behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub at_s: f64,
    pub from: String,
    pub to: String,
    /// The smoothed demand width the decision used.
    pub width: f64,
    /// Tokens gained over the expected duration by running `to` instead of `from`.
    pub gain_tokens: f64,
    /// Tokens lost while restarting (restart_s × the current rate).
    pub cost_tokens: f64,
    pub expected_s: f64,
    pub taken: bool,
    /// Why it was declined (empty when taken).
    pub why: String,
}

/// The `auto` policy's state.
#[derive(Debug, Clone)]
pub struct AutoPolicy {
    modes: Vec<ModeRates>,
    settings: PolicySettings,
    current: usize,
    level: Option<f64>,
    /// Expected tokens/s of each mode under the recent demand.
    rates: Vec<f64>,
    last_at: Option<f64>,
    best: usize,
    regime_since: f64,
    switched_at: f64,
    /// The last declined candidate, so a decline is reported once per regime, not every second.
    declined: Option<(usize, &'static str)>,
}

impl AutoPolicy {
    /// `current` indexes `modes`; `now_s` is when that mode started.
    pub fn new(modes: Vec<ModeRates>, current: usize, settings: PolicySettings, now_s: f64) -> Self {
        assert!(current < modes.len(), "current mode out of range");
        Self {
            modes,
            settings,
            current,
            level: None,
            rates: Vec::new(),
            last_at: None,
            best: current,
            regime_since: now_s,
            switched_at: now_s,
            declined: None,
        }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    pub fn modes(&self) -> &[ModeRates] {
        &self.modes
    }

    pub fn settings(&self) -> &PolicySettings {
        &self.settings
    }

    /// The smoothed demand width, once a sample arrived.
    pub fn level(&self) -> Option<f64> {
        self.level
    }

    /// The mode was changed from outside (an operator pin, or a switch this policy asked for
    /// having completed): dwell counts from `now_s`.
    pub fn set_current(&mut self, mode: usize, now_s: f64) {
        self.current = mode;
        self.switched_at = now_s;
        self.declined = None;
    }

    /// Feeds one demand-width sample. Returns a decision when a switch was considered: taken
    /// (the caller switches and then calls [`AutoPolicy::set_current`]) or declined.
    pub fn observe(&mut self, now_s: f64, width: f64) -> Option<Decision> {
        let alpha = match self.last_at {
            Some(t) => 1.0 - (-(now_s - t).max(0.0) / self.settings.rate_tau_s).exp(),
            None => 1.0,
        };
        let level = self.level.map_or(width, |l| l + alpha * (width - l));
        self.level = Some(level);
        self.last_at = Some(now_s);
        if self.rates.is_empty() {
            self.rates = self.modes.iter().map(|m| m.at(width)).collect();
        } else {
            for (r, m) in self.rates.iter_mut().zip(&self.modes) {
                *r += alpha * (m.at(width) - *r);
            }
        }
        let best = self.best();
        if best != self.best {
            self.best = best;
            self.regime_since = now_s;
        }
        if best == self.current {
            self.declined = None;
            return None;
        }
        let s = &self.settings;
        let (from, to) = (&self.modes[self.current], &self.modes[best]);
        let expected_s = (now_s - self.regime_since).min(s.max_horizon_s);
        let rate_now = self.rates[self.current];
        let gain_tokens = (self.rates[best] - rate_now) * expected_s;
        let cost_tokens = s.restart_s * rate_now;
        let why: &'static str = if now_s - self.regime_since < s.hold_s {
            "hold: the other mode has not been best for long enough"
        } else if now_s - self.switched_at < s.min_dwell_s {
            "dwell: too soon after the last switch"
        } else if gain_tokens < s.margin * cost_tokens {
            "cost: the expected gain does not yet outweigh the restart"
        } else {
            ""
        };
        let decision = Decision {
            at_s: now_s,
            from: from.name.clone(),
            to: to.name.clone(),
            width: level,
            gain_tokens,
            cost_tokens,
            expected_s,
            taken: why.is_empty(),
            why: why.to_owned(),
        };
        if decision.taken {
            self.declined = None;
            return Some(decision);
        }
        // Report a decline when its reason changes, not every second.
        if self.declined == Some((best, why)) {
            return None;
        }
        self.declined = Some((best, why));
        Some(decision)
    }

    fn best(&self) -> usize {
        let mut best = self.current;
        for (i, r) in self.rates.iter().enumerate() {
            if *r > self.rates[best] + 1e-9 {
                best = i;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deepseek() -> Vec<ModeRates> {
        vec![
            ModeRates {
                name: "dspark".into(),
                tokens_per_s: vec![31.6, 42.5],
            },
            ModeRates {
                name: "none".into(),
                tokens_per_s: vec![23.0, 33.2, 43.5, 53.7],
            },
        ]
    }

    #[test]
    fn rates_interpolate_and_hold_past_the_cap() {
        let m = &deepseek()[0];
        assert_eq!(m.at(1.0), 31.6);
        assert!((m.at(1.5) - 37.05).abs() < 1e-9);
        assert_eq!(m.at(4.0), 42.5, "dspark runs at most 2 at once");
        assert_eq!(m.at(0.0), 0.0);
    }

    #[test]
    fn sustained_wide_load_switches_once_the_gain_beats_the_restart() {
        let mut p = AutoPolicy::new(deepseek(), 0, PolicySettings::for_restart(300.0), 0.0);
        let mut taken = None;
        for t in 1..20_000 {
            if let Some(d) = p.observe(f64::from(t), 4.0) {
                if d.taken {
                    taken = Some(d);
                    break;
                }
            }
        }
        let d = taken.expect("a switch to none under sustained 4-wide load");
        assert_eq!((d.from.as_str(), d.to.as_str()), ("dspark", "none"));
        assert!(d.gain_tokens >= 1.5 * d.cost_tokens);
        // Gain rate 11.2 tok/s against 300 s × 42.5: about 1700 s of evidence are needed.
        assert!(d.at_s > 1500.0 && d.at_s < 2000.0, "{}", d.at_s);
    }

    #[test]
    fn a_flapping_load_never_switches_faster_than_the_dwell() {
        let settings = PolicySettings::for_restart(300.0);
        let mut p = AutoPolicy::new(deepseek(), 0, settings.clone(), 0.0);
        let mut last_switch: Option<f64> = None;
        for t in 1..50_000 {
            let width = if (t / 120) % 2 == 0 { 1.0 } else { 4.0 };
            let now = f64::from(t);
            if let Some(d) = p.observe(now, width) {
                if d.taken {
                    if let Some(prev) = last_switch {
                        assert!(now - prev >= settings.min_dwell_s, "{d:?}");
                    }
                    last_switch = Some(now);
                    let to = p.modes().iter().position(|m| m.name == d.to).unwrap();
                    p.set_current(to, now);
                }
            }
        }
    }

    #[test]
    fn declines_are_reported_once_per_reason() {
        let mut p = AutoPolicy::new(deepseek(), 0, PolicySettings::for_restart(300.0), 0.0);
        let reported: Vec<Decision> = (1..200).filter_map(|t| p.observe(f64::from(t), 4.0)).collect();
        assert!(!reported.is_empty());
        assert!(reported.iter().all(|d| !d.taken));
        let mut reasons: Vec<&str> = reported.iter().map(|d| d.why.as_str()).collect();
        reasons.dedup();
        assert_eq!(reasons.len(), reported.len(), "{reasons:?}");
    }
}
