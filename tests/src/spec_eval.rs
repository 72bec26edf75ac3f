//! Virtual-time evaluation of speculation policies: demand traces replayed second by second
//! through the real `auto` policy (`sparkgate_spec::policy`), fixed modes and an
//! oracle that knows the whole trace, with the profile's throughput tables and a restart cost.
//!
//! Model (requests in 0.1 s steps, stepped by `spec_replay`, which the several-group evaluation
//! shares): the trace gives the demand width each second — that many
//! closed-loop clients, each sending a request of [`REQUEST_TOKENS`] output tokens as soon as its
//! previous one finished (a client beyond a narrowing width sends no next request). Up to the
//! mode's MAX_NUM_SEQS requests run at once, the rest queue in arrival order; the running ones
//! share the mode's table rate at their count. A switch drains (no admission; running requests
//! finish at the old mode's rate), then delivers nothing for `restart_s`, then admits with the new
//! mode's capacity. Latency is completion minus arrival, queueing and switch waits included.
//! The oracle's schedule comes from a per-second fluid model (dynamic programming over the
//! trace) and is replayed through the same request model.

use sparkgate_config::{default_max_num_seqs, seeded_throughput, ProfileId, SpecMethod};
use sparkgate_spec::policy::{AutoPolicy, ModeRates, PolicySettings};

use crate::spec_replay::{replay, Choose};
pub use crate::spec_replay::{Modes, Outcome, Trace, REQUEST_TOKENS};

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

/// Who decides the switches of the one group.
enum Chooser<'a> {
    Fixed,
    /// The policy, and the modes its decisions name.
    Auto(Box<AutoPolicy>, &'a [ModeRates]),
    /// Switch to the mode at the given second (a switch due while the group restarts is dropped).
    Schedule(&'a [(usize, usize)]),
}

impl Choose for Chooser<'_> {
    fn choose(&mut self, now: f64, second: usize, demand: f64) -> Option<Vec<usize>> {
        let to = match self {
            Chooser::Fixed => None,
            // The policy sees what the gateway would: requests in flight plus queued.
            Chooser::Auto(policy, modes) => policy
                .observe(now, demand)
                .filter(|d| d.taken)
                .map(|d| modes.iter().position(|m| m.name == d.to).expect("a known mode")),
            Chooser::Schedule(switches) => switches.iter().find(|(at, _)| *at == second).map(|(_, to)| *to),
        };
        to.map(|mode| vec![mode])
    }

    fn switched(&mut self, split: &[usize], t: f64) {
        if let Chooser::Auto(policy, _) = self {
            policy.set_current(split[0], t);
        }
    }
}

/// One mode all the time.
pub fn fixed(modes: &Modes, mode: usize, trace: &Trace) -> Outcome {
    replay(modes, &[mode], 0.0, trace, &mut Chooser::Fixed)
}

/// The `auto` policy, starting in mode 0.
pub fn auto(modes: &Modes, settings: &PolicySettings, trace: &Trace) -> Outcome {
    let policy = AutoPolicy::new(modes.rates.clone(), 0, settings.clone(), 0.0);
    let mut chooser = Chooser::Auto(Box::new(policy), &modes.rates);
    replay(modes, &[0], settings.restart_s, trace, &mut chooser)
}

/// The best schedule knowing the whole trace, starting in mode 0: chosen by dynamic programming
/// over seconds in the fluid model (each switch costs `restart_s` without tokens), then replayed.
pub fn oracle(modes: &Modes, restart_s: f64, trace: &Trace) -> Outcome {
    let schedule = oracle_schedule(&modes.rates, restart_s, trace);
    replay(modes, &[0], restart_s, trace, &mut Chooser::Schedule(&schedule))
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
            best[t][m] = modes[m].at(f64::from(trace.widths[t])) + best[t + 1][m];
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
