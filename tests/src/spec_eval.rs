//! Virtual-time evaluation of speculation policies: demand traces replayed second by second
//! through the real `auto` policy (`sparkgate_spec::policy`), fixed modes and an
//! oracle that knows the whole trace, with the profile's throughput tables and a restart cost.
//!
//! Model (requests in 0.1 s steps): the trace gives the demand width each second — that many
//! closed-loop clients, each sending a request of [`REQUEST_TOKENS`] output tokens as soon as its
//! previous one finished (a client beyond a narrowing width sends no next request). Up to the
//! mode's MAX_NUM_SEQS requests run at once, the rest queue in arrival order; the running ones
//! share the mode's table rate at their count. A switch drains (no admission; running requests
//! finish at the old mode's rate), then delivers nothing for `restart_s`, then admits with the new
//! mode's capacity. Latency is completion minus arrival, queueing and switch waits included.
//! The oracle's schedule comes from a per-second fluid model (dynamic programming over the
//! trace) and is replayed through the same request model.

use std::collections::VecDeque;

use sparkgate_config::{default_max_num_seqs, seeded_throughput, ProfileId, SpecMethod};
use sparkgate_spec::policy::{AutoPolicy, ModeRates, PolicySettings};

/// Demand width for each second.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: &'static str,
    pub widths: Vec<u8>,
}

const HOUR: usize = 3600;

fn segments(name: &'static str, parts: &[(usize, u8)]) -> Trace {
    let mut widths = Vec::new();
    for &(seconds, width) in parts {
        widths.extend(std::iter::repeat_n(width, seconds));
    }
    Trace { name, widths }
}

/// The four traces of the evaluation: steady 1, steady 4, a working day of agents, flap bait.
pub fn traces() -> Vec<Trace> {
    // A deterministic stand-in for "1–2 interactive streams": width alternates 1 and 2 with
    // stretches of 7 and 4 minutes.
    let interactive = |hours: usize| -> Vec<(usize, u8)> {
        let mut parts = Vec::new();
        let mut left = hours * HOUR;
        let mut two = false;
        while left > 0 {
            let len = if two { 240 } else { 420 }.min(left);
            parts.push((len, if two { 2 } else { 1 }));
            left -= len;
            two = !two;
        }
        parts
    };
    let mut day = Vec::new();
    day.push((HOUR, 0));
    day.extend(interactive(3));
    day.push((3 * HOUR, 4));
    day.extend(interactive(2));
    day.push((4 * HOUR, 4));
    day.extend(interactive(3));
    day.push((2 * HOUR, 4));
    day.extend(interactive(2));
    day.push((4 * HOUR, 0));
    let oscillating: Vec<(usize, u8)> = (0..8 * HOUR / 120)
        .map(|i| (120, if i % 2 == 0 { 1 } else { 4 }))
        .collect();
    vec![
        segments("steady 1 stream (8 h)", &[(8 * HOUR, 1)]),
        segments("steady 4 streams (8 h)", &[(8 * HOUR, 4)]),
        segments("working day of agents (24 h)", &day),
        segments("rapid oscillation 1↔4 every 2 min (8 h)", &oscillating),
    ]
}

/// A profile's modes as the policy sees them, in the profile's order (the default mode first),
/// with how many requests each runs at once (its default MAX_NUM_SEQS).
#[derive(Debug, Clone)]
pub struct Modes {
    pub rates: Vec<ModeRates>,
    pub caps: Vec<usize>,
}

pub fn modes(profile: ProfileId) -> Modes {
    let methods: &[SpecMethod] = match profile {
        ProfileId::DeepSeekV41Flash => &[SpecMethod::Dspark, SpecMethod::None],
        ProfileId::Glm53Flash => &[SpecMethod::Dflash, SpecMethod::Mtp, SpecMethod::None],
    };
    let (mut rates, mut caps) = (Vec::new(), Vec::new());
    for &m in methods {
        let (Some(table), Some(cap)) = (seeded_throughput(profile, m), default_max_num_seqs(profile, m)) else {
            continue;
        };
        rates.push(ModeRates {
            name: m,
            tokens_per_s: table.points().iter().map(|p| p.tokens_per_s).collect(),
        });
        caps.push(cap as usize);
    }
    Modes { rates, caps }
}

/// Output tokens per request in the replay (an agent turn).
pub const REQUEST_TOKENS: f64 = 500.0;
const STEP_S: f64 = 0.1;

/// What one policy delivered on one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: f64,
    pub restarts: u32,
    /// Shortest time between two consecutive switches (none with fewer than two).
    pub min_gap_s: Option<f64>,
    /// Request latency percentiles, seconds (0 when no request completed).
    pub p50_s: f64,
    pub p95_s: f64,
    pub requests: usize,
}

/// A replay's running totals: tokens, switches (and the shortest gap between two), latencies.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) tokens: f64,
    pub(crate) latencies: Vec<f64>,
    restarts: u32,
    last_switch: Option<f64>,
    min_gap: Option<f64>,
}

impl Tally {
    /// A switch begins at `now`.
    pub(crate) fn switch(&mut self, now: f64) {
        if let Some(prev) = self.last_switch {
            self.min_gap = Some(self.min_gap.map_or(now - prev, |g: f64| g.min(now - prev)));
        }
        self.last_switch = Some(now);
        self.restarts += 1;
    }

    pub(crate) fn outcome(mut self) -> Outcome {
        self.latencies.sort_by(f64::total_cmp);
        let l = &self.latencies;
        let pct = |q: f64| {
            if l.is_empty() {
                0.0
            } else {
                l[((l.len() - 1) as f64 * q).round() as usize]
            }
        };
        Outcome {
            tokens: self.tokens,
            restarts: self.restarts,
            min_gap_s: self.min_gap,
            p50_s: pct(0.5),
            p95_s: pct(0.95),
            requests: l.len(),
        }
    }
}

/// Who decides the switches during a replay.
enum Chooser<'a> {
    Fixed,
    Auto(Box<AutoPolicy>),
    /// Switch to the mode at the given second.
    Schedule(&'a [(usize, usize)]),
}

enum Phase {
    Serving,
    Draining { to: usize },
    Restarting { to: usize, until: f64 },
}

fn rate(modes: &[ModeRates], mode: usize, width: f64) -> f64 {
    modes[mode].at(width)
}

/// Replays `trace` through the request model, starting in `start`.
fn replay(setup: &Modes, start: usize, restart_s: f64, trace: &Trace, mut chooser: Chooser) -> Outcome {
    let (modes, caps) = (&setup.rates, &setup.caps);
    let mut mode = start;
    let mut phase = Phase::Serving;
    // Arrival times of queued requests; (arrival, tokens left) of running ones.
    let mut queued: VecDeque<f64> = VecDeque::new();
    let mut running: Vec<(f64, f64)> = Vec::new();
    let mut tally = Tally::default();
    let steps_per_s = (1.0 / STEP_S).round() as usize;
    for (second, &width) in trace.widths.iter().enumerate() {
        let now = second as f64;
        // Open clients follow the demand width: new ones arrive, surplus ones send nothing next.
        while queued.len() + running.len() < usize::from(width) {
            queued.push_back(now);
        }
        if matches!(phase, Phase::Serving) {
            let to = match &mut chooser {
                Chooser::Fixed => None,
                // The policy sees what the gateway would: requests in flight plus queued.
                Chooser::Auto(policy) => policy
                    .observe(now, (queued.len() + running.len()) as f64)
                    .filter(|d| d.taken)
                    .map(|d| modes.iter().position(|m| m.name == d.to).expect("a known mode")),
                Chooser::Schedule(switches) => switches.iter().find(|(at, _)| *at == second).map(|(_, to)| *to),
            };
            if let Some(to) = to.filter(|&to| to != mode) {
                tally.switch(now);
                phase = Phase::Draining { to };
            }
        }
        for step in 0..steps_per_s {
            let t = now + step as f64 * STEP_S;
            match phase {
                Phase::Draining { to } if running.is_empty() => {
                    phase = Phase::Restarting {
                        to,
                        until: t + restart_s,
                    };
                }
                Phase::Restarting { to, until } if t >= until - 1e-9 => {
                    mode = to;
                    phase = Phase::Serving;
                    if let Chooser::Auto(policy) = &mut chooser {
                        policy.set_current(to, t);
                    }
                }
                _ => {}
            }
            if matches!(phase, Phase::Restarting { .. }) {
                continue;
            }
            if matches!(phase, Phase::Serving) {
                while running.len() < caps[mode] {
                    let Some(arrival) = queued.pop_front() else { break };
                    running.push((arrival, REQUEST_TOKENS));
                }
            }
            if running.is_empty() {
                continue;
            }
            let per_request = rate(modes, mode, running.len() as f64) / running.len() as f64 * STEP_S;
            let mut finished = 0;
            running.retain_mut(|(arrival, left)| {
                let done = left.min(per_request);
                tally.tokens += done;
                *left -= done;
                if *left <= 1e-9 {
                    tally.latencies.push(t + STEP_S - *arrival);
                    finished += 1;
                    false
                } else {
                    true
                }
            });
            // A finishing client sends its next request at once while the width still wants it.
            for _ in 0..finished {
                if queued.len() + running.len() < usize::from(width) {
                    queued.push_back(t + STEP_S);
                }
            }
        }
    }
    tally.outcome()
}

/// One mode all the time.
pub fn fixed(modes: &Modes, mode: usize, trace: &Trace) -> Outcome {
    replay(modes, mode, 0.0, trace, Chooser::Fixed)
}

/// The `auto` policy, starting in mode 0.
pub fn auto(modes: &Modes, settings: &PolicySettings, trace: &Trace) -> Outcome {
    let policy = AutoPolicy::new(modes.rates.clone(), 0, settings.clone(), 0.0);
    replay(modes, 0, settings.restart_s, trace, Chooser::Auto(Box::new(policy)))
}

/// The best schedule knowing the whole trace, starting in mode 0: chosen by dynamic programming
/// over seconds in the fluid model (each switch costs `restart_s` without tokens), then replayed.
pub fn oracle(modes: &Modes, restart_s: f64, trace: &Trace) -> Outcome {
    let schedule = oracle_schedule(&modes.rates, restart_s, trace);
    replay(modes, 0, restart_s, trace, Chooser::Schedule(&schedule))
}

/// (second, mode) switches of the fluid-model optimum.
fn oracle_schedule(modes: &[ModeRates], restart_s: f64, trace: &Trace) -> Vec<(usize, usize)> {
    let n = trace.widths.len();
    let k = modes.len();
    let restart = restart_s.round() as usize;
    // best[t][m]: tokens from second t on when running mode m at t; next[t][m]: the mode switched
    // to at t, if the optimum switches there.
    let mut best = vec![vec![0.0f64; k]; n + 1];
    let mut next = vec![vec![None::<usize>; k]; n];
    for t in (0..n).rev() {
        for m in 0..k {
            best[t][m] = rate(modes, m, f64::from(trace.widths[t])) + best[t + 1][m];
            for other in (0..k).filter(|&o| o != m) {
                let switched = best[(t + restart).min(n)][other];
                if switched > best[t][m] {
                    best[t][m] = switched;
                    next[t][m] = Some(other);
                }
            }
        }
    }
    let (mut t, mut m, mut switches) = (0, 0, Vec::new());
    while t < n {
        match next[t][m] {
            Some(other) => {
                switches.push((t, other));
                m = other;
                t += restart.max(1);
            }
            None => t += 1,
        }
    }
    switches
}
