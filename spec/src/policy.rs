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
//! - A regime starts when the best mode changes. Its expected remaining duration is the longer of
//!   the time it has lasted so far (a Lindy estimate: a load that has held for an hour is likelier
//!   to hold for another than one that began a minute ago) and the median length of the last
//!   [`REMEMBERED_REGIMES`] regimes in which the same mode was best (loads recur: the second
//!   nightly batch is priced by the first), capped at `max_horizon_s`. Short blips enter that
//!   history too, so a load that keeps flipping keeps its expected duration short.
//! - Switching from A to B needs all of: B best for at least `hold_s` (hysteresis), at least
//!   `min_dwell_s` since the last switch, and
//!   `(rate_B − rate_A) × expected ≥ margin × restart_s × rate_A` — the tokens gained over the
//!   expected duration beat the tokens lost while the group restarts.
//!
//! Learning the machine ([`AutoPolicy::learn`], [`AutoPolicy::restart_measured`]):
//! - The caller reports, per second, the tokens the group delivered, the mode, and the width
//!   that ran (demand capped at the mode's MAX_NUM_SEQS). Each (mode, width) cell keeps its
//!   delivered tokens and observed seconds; past [`MEASURE_WINDOW_S`] seconds both are scaled
//!   down so the cell follows a machine that changes.
//! - A machine-wide speed factor F = all measured tokens / what the seeded tables predicted for
//!   the same cells and seconds (1 until [`MIN_MEASURED_S`] was seen). It scales every
//!   cell, measured or not, so a machine uniformly faster or slower than the guides' (or a
//!   simulator at any speed) does not bias the comparison toward the mode that was measured.
//! - A cell's rate = (seed × F × [`PRIOR_WEIGHT_S`] + tokens) / ([`PRIOR_WEIGHT_S`] + seconds):
//!   the seed counts as that many seconds of evidence, so measurements take over as they grow.
//! - Measured restarts (switch asked → ready in the new mode) replace the configured restart
//!   cost: the policy prices a switch at the mean of the last [`REMEMBERED_RESTARTS`].

use std::collections::VecDeque;

use serde::Serialize;
use sparkgate_config::SpecMethod;

/// How many finished regimes per mode the expected-duration estimate remembers.
pub const REMEMBERED_REGIMES: usize = 5;
/// How many seconds of evidence a seeded table cell is worth against measurements.
pub const PRIOR_WEIGHT_S: f64 = 300.0;
/// Observed seconds a cell keeps before older evidence is scaled down.
pub const MEASURE_WINDOW_S: f64 = 3600.0;
/// Measured seconds (all cells) before the machine-wide speed factor departs from 1. Short on
/// purpose: with one cell measured, every table is that cell's seed × F, so comparisons between
/// modes stay the seeds' however noisy F is; waiting longer would let the measured mode's cell
/// outgrow the unscaled others.
pub const MIN_MEASURED_S: f64 = 1.0;
/// How many measured restarts price a switch.
pub const REMEMBERED_RESTARTS: usize = 5;

/// What was measured for one (mode, width).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Measured {
    pub tokens: f64,
    pub seconds: f64,
}

/// One mode's table as seeded, as measured and as the policy now uses it (index 0 = width 1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LearnedTable {
    pub name: SpecMethod,
    pub seeded: Vec<f64>,
    pub measured: Vec<Measured>,
    pub used: Vec<f64>,
}

/// One mode as the policy sees it: its aggregate tokens/s by width (index 0 = width 1; widths past
/// the end hold the last value, as the mode's MAX_NUM_SEQS caps what it can run at once).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeRates {
    pub name: SpecMethod,
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
            margin: 1.0,
            rate_tau_s: 300.0,
            max_horizon_s: 4.0 * 3600.0,
        }
    }
}

/// A considered switch, taken or declined, with the numbers behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub at_s: f64,
    pub from: SpecMethod,
    pub to: SpecMethod,
    /// `to`'s index in the policy's modes (two modes may share a name: a split across groups).
    pub to_index: usize,
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
    /// The tables decisions use: the seeds blended with measurements.
    modes: Vec<ModeRates>,
    seeded: Vec<ModeRates>,
    measured: Vec<Vec<Measured>>,
    speed_factor: f64,
    configured_restart_s: f64,
    restarts: VecDeque<f64>,
    settings: PolicySettings,
    current: usize,
    level: Option<f64>,
    /// Expected tokens/s of each mode under the recent demand.
    rates: Vec<f64>,
    last_at: Option<f64>,
    best: usize,
    regime_since: f64,
    /// Lengths of finished regimes, per mode that was best in them.
    past_regimes: Vec<VecDeque<f64>>,
    switched_at: f64,
    /// The last declined candidate, so a decline is reported once per regime, not every second.
    declined: Option<(usize, &'static str)>,
    /// `[from][to]`: the share of the current rate a switch loses while it restarts (1: all of
    /// it, as when the whole group restarts; less when only some groups of a split restart).
    lost_share: Option<Vec<Vec<f64>>>,
}

impl AutoPolicy {
    /// `current` indexes `modes`; `now_s` is when that mode started.
    pub fn new(modes: Vec<ModeRates>, current: usize, settings: PolicySettings, now_s: f64) -> Self {
        assert!(current < modes.len(), "current mode out of range");
        let modes_len = modes.len();
        Self {
            measured: modes
                .iter()
                .map(|m| vec![Measured::default(); m.tokens_per_s.len()])
                .collect(),
            seeded: modes.clone(),
            modes,
            speed_factor: 1.0,
            configured_restart_s: settings.restart_s,
            restarts: VecDeque::new(),
            settings,
            current,
            level: None,
            rates: Vec::new(),
            last_at: None,
            best: current,
            regime_since: now_s,
            past_regimes: vec![VecDeque::new(); modes_len],
            switched_at: now_s,
            declined: None,
            lost_share: None,
        }
    }

    /// Prices each switch at `share[from][to]` of the current rate for the restart's length
    /// instead of all of it.
    pub fn with_lost_share(mut self, share: Vec<Vec<f64>>) -> Self {
        assert!(share.len() == self.modes.len() && share.iter().all(|row| row.len() == self.modes.len()));
        self.lost_share = Some(share);
        self
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

    /// Reports `tokens` delivered over `seconds` while `mode` ran `width` requests at once
    /// (widths past the mode's table count as its last). Idle seconds (width 0) teach nothing.
    pub fn learn(&mut self, mode: usize, width: f64, tokens: f64, seconds: f64) {
        let Some(cells) = self.measured.get_mut(mode) else {
            return;
        };
        let w = width.round();
        if w < 1.0 || seconds <= 0.0 || cells.is_empty() {
            return;
        }
        let index = (w as usize).min(cells.len()) - 1;
        let cell = &mut cells[index];
        cell.tokens += tokens;
        cell.seconds += seconds;
        if cell.seconds > MEASURE_WINDOW_S {
            let keep = MEASURE_WINDOW_S / cell.seconds;
            cell.tokens *= keep;
            cell.seconds *= keep;
        }
        let (mut delivered, mut predicted, mut observed) = (0.0, 0.0, 0.0);
        for (cells, seed) in self.measured.iter().zip(&self.seeded) {
            for (cell, rate) in cells.iter().zip(&seed.tokens_per_s) {
                delivered += cell.tokens;
                predicted += cell.seconds * rate;
                observed += cell.seconds;
            }
        }
        if observed >= MIN_MEASURED_S && predicted > 0.0 {
            self.speed_factor = delivered / predicted;
        }
        for ((used, seed), cells) in self.modes.iter_mut().zip(&self.seeded).zip(&self.measured) {
            for ((u, s), c) in used.tokens_per_s.iter_mut().zip(&seed.tokens_per_s).zip(cells) {
                *u = (s * self.speed_factor * PRIOR_WEIGHT_S + c.tokens) / (PRIOR_WEIGHT_S + c.seconds);
            }
        }
    }

    /// Reports how long a switch took (asked → ready in the new mode).
    pub fn restart_measured(&mut self, seconds: f64) {
        if self.restarts.len() == REMEMBERED_RESTARTS {
            self.restarts.pop_front();
        }
        self.restarts.push_back(seconds.max(0.0));
        self.settings.restart_s = self.restarts.iter().sum::<f64>() / self.restarts.len() as f64;
    }

    /// The restart cost as configured, before any restart was measured.
    pub fn configured_restart_s(&self) -> f64 {
        self.configured_restart_s
    }

    /// The machine-wide speed factor learned so far (1 until measured).
    pub fn speed_factor(&self) -> f64 {
        self.speed_factor
    }

    /// Each mode's seeded, measured and used table.
    pub fn tables(&self) -> Vec<LearnedTable> {
        self.seeded
            .iter()
            .zip(&self.measured)
            .zip(&self.modes)
            .map(|((seed, measured), used)| LearnedTable {
                name: seed.name,
                seeded: seed.tokens_per_s.clone(),
                measured: measured.clone(),
                used: used.tokens_per_s.clone(),
            })
            .collect()
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
        // A regime is a stretch in which the current mode is beaten; with three or more modes
        // two near-equal challengers may trade the lead without ending it (with two it cannot
        // happen: there is one challenger).
        let challenger_swap = best != self.current && self.best != self.current;
        if best != self.best && !challenger_swap {
            let past = &mut self.past_regimes[self.best];
            if past.len() == REMEMBERED_REGIMES {
                past.pop_front();
            }
            past.push_back(now_s - self.regime_since);
            self.regime_since = now_s;
        }
        self.best = best;
        if best == self.current {
            self.declined = None;
            return None;
        }
        let s = &self.settings;
        let (from, to) = (&self.modes[self.current], &self.modes[best]);
        let lasted_s = now_s - self.regime_since;
        let expected_s = lasted_s.max(median(&self.past_regimes[best])).min(s.max_horizon_s);
        let rate_now = self.rates[self.current];
        let gain_tokens = (self.rates[best] - rate_now) * expected_s;
        let share = self.lost_share.as_ref().map_or(1.0, |m| m[self.current][best]);
        let cost_tokens = s.restart_s * rate_now * share;
        let why: &'static str = if lasted_s < s.hold_s {
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
            from: from.name,
            to: to.name,
            to_index: best,
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

/// The median of some durations (0 for none).
fn median(durations: &VecDeque<f64>) -> f64 {
    let mut sorted: Vec<f64> = durations.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deepseek() -> Vec<ModeRates> {
        vec![
            ModeRates {
                name: SpecMethod::Dspark,
                tokens_per_s: vec![31.6, 42.5],
            },
            ModeRates {
                name: SpecMethod::None,
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
        assert!(d.gain_tokens >= d.cost_tokens);
        // Gain rate 11.2 tok/s against 300 s × 42.5 at margin 1: about 1140 s of evidence.
        assert!(d.at_s > 1000.0 && d.at_s < 1400.0, "{}", d.at_s);
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
    fn a_uniformly_faster_machine_scales_every_table_alike() {
        let mut p = AutoPolicy::new(deepseek(), 0, PolicySettings::for_restart(300.0), 0.0);
        for _ in 0..600 {
            p.learn(0, 1.0, 31.6 * 10.0, 1.0);
        }
        assert!((p.speed_factor() - 10.0).abs() < 1e-9);
        let tables = p.tables();
        // The measured cell is the machine's; unmeasured ones, the seed at the machine's speed.
        assert!((tables[0].used[0] - 316.0).abs() < 1e-6, "{:?}", tables[0]);
        assert!((tables[1].used[3] - 537.0).abs() < 1e-6, "{:?}", tables[1]);
        assert_eq!(tables[0].measured[0].seconds, 600.0);
        // Sustained 4-wide load still prefers none, as with the seeds.
        let switched = (1..20_000).any(|t| p.observe(f64::from(t), 4.0).is_some_and(|d| d.taken));
        assert!(switched);
    }

    #[test]
    fn a_cell_slower_than_seeded_changes_the_decision() {
        let mut p = AutoPolicy::new(deepseek(), 0, PolicySettings::for_restart(300.0), 0.0);
        // none at width 4 measures like dspark at 2: no reason left to switch.
        for _ in 0..3600 {
            p.learn(1, 4.0, 40.0, 1.0);
            p.learn(0, 2.0, 42.5, 1.0);
        }
        let used = &p.tables()[1].used;
        assert!(used[3] < 42.5, "{used:?}");
        let switched = (1..20_000).any(|t| p.observe(f64::from(t), 4.0).is_some_and(|d| d.taken));
        assert!(!switched);
    }

    #[test]
    fn measured_restarts_replace_the_configured_cost() {
        let mut p = AutoPolicy::new(deepseek(), 0, PolicySettings::for_restart(300.0), 0.0);
        p.restart_measured(100.0);
        p.restart_measured(140.0);
        assert_eq!(p.settings().restart_s, 120.0);
        assert_eq!(p.configured_restart_s(), 300.0);
    }

    #[test]
    fn a_recurring_load_is_priced_by_its_past_length() {
        let mut p = AutoPolicy::new(deepseek(), 0, PolicySettings::for_restart(300.0), 0.0);
        // Runs `seconds` of one width from `from`; returns when the first switch was taken.
        fn run(p: &mut AutoPolicy, from: f64, seconds: u32, width: f64) -> Option<f64> {
            let mut switched_at = None;
            for s in 1..=seconds {
                let t = from + f64::from(s);
                if let Some(d) = p.observe(t, width).filter(|d| d.taken) {
                    let to = p.modes().iter().position(|m| m.name == d.to).unwrap();
                    p.set_current(to, t);
                    switched_at.get_or_insert(t);
                }
            }
            switched_at
        }
        let batch = 3 * 3600;
        let first = run(&mut p, 0.0, batch, 4.0).expect("the first batch switches");
        run(&mut p, f64::from(batch), batch, 1.0).expect("interactive switches back");
        let second_start = f64::from(2 * batch);
        let second = run(&mut p, second_start, batch, 4.0).expect("the second batch switches") - second_start;
        assert!(second < first / 2.0, "first after {first} s, second after {second} s");
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
