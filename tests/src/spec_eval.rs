//! Virtual-time evaluation of speculation policies: demand traces replayed second by second
//! through the real `auto` policy (`sparkgate_supervisor::spec_policy`), fixed modes and an
//! oracle that knows the whole trace, with the profile's throughput tables and a restart cost.
//!
//! Model (fluid, per second): the trace gives the demand width (streams that want tokens); a mode
//! delivers its table's aggregate tokens/s at that width (a mode whose MAX_NUM_SEQS is below the
//! width queues the rest, so its table holds its last value); a restart delivers nothing for
//! `restart_s`. Request latency is not modelled here.

use sparkgate_config::{seeded_throughput, ProfileId, SpecMethod};
use sparkgate_supervisor::spec_policy::{AutoPolicy, ModeRates, PolicySettings};

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

/// A profile's modes as the policy sees them, in the profile's order (the default mode first).
pub fn modes(profile: ProfileId) -> Vec<ModeRates> {
    let methods: &[SpecMethod] = match profile {
        ProfileId::DeepSeekV41Flash => &[SpecMethod::Dspark, SpecMethod::None],
        ProfileId::Glm53Flash => &[SpecMethod::Dflash, SpecMethod::Mtp, SpecMethod::None],
    };
    methods
        .iter()
        .filter_map(|&m| {
            let table = seeded_throughput(profile, m)?;
            Some(ModeRates {
                name: m.as_str().to_owned(),
                tokens_per_s: table.points().iter().map(|p| p.tokens_per_s).collect(),
            })
        })
        .collect()
}

/// What one policy delivered on one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: f64,
    pub restarts: u32,
    /// Seconds between consecutive switches (empty with fewer than two).
    pub min_gap_s: Option<f64>,
}

fn rate(modes: &[ModeRates], mode: usize, width: u8) -> f64 {
    modes[mode].at(f64::from(width))
}

/// One mode all the time.
pub fn fixed(modes: &[ModeRates], mode: usize, trace: &Trace) -> Outcome {
    Outcome {
        tokens: trace.widths.iter().map(|&w| rate(modes, mode, w)).sum(),
        restarts: 0,
        min_gap_s: None,
    }
}

/// The `auto` policy, starting in mode 0; a switch it takes costs `restart_s` without tokens.
pub fn auto(modes: &[ModeRates], settings: &PolicySettings, trace: &Trace) -> Outcome {
    let mut policy = AutoPolicy::new(modes.to_vec(), 0, settings.clone(), 0.0);
    let restart = settings.restart_s.round() as usize;
    let (mut tokens, mut restarts, mut last_switch, mut min_gap) = (0.0, 0, None::<usize>, None::<f64>);
    let mut t = 0;
    while t < trace.widths.len() {
        let width = trace.widths[t];
        let decision = policy.observe(t as f64, f64::from(width));
        match decision {
            Some(d) if d.taken => {
                let to = modes.iter().position(|m| m.name == d.to).expect("a known mode");
                if let Some(prev) = last_switch {
                    let gap = (t - prev) as f64;
                    min_gap = Some(min_gap.map_or(gap, |g: f64| g.min(gap)));
                }
                last_switch = Some(t);
                restarts += 1;
                t += restart;
                policy.set_current(to, t as f64);
            }
            _ => {
                tokens += rate(modes, policy.current(), width);
                t += 1;
            }
        }
    }
    Outcome {
        tokens,
        restarts,
        min_gap_s: min_gap,
    }
}

/// The best any schedule could do knowing the whole trace (dynamic programming over seconds,
/// starting in mode 0, each switch costing `restart_s` without tokens).
pub fn oracle(modes: &[ModeRates], restart_s: f64, trace: &Trace) -> Outcome {
    let n = trace.widths.len();
    let k = modes.len();
    let restart = restart_s.round() as usize;
    // best[t][m]: (tokens from second t on, running mode m at t; restarts on that path).
    let mut best = vec![vec![(0.0f64, 0u32); k]; n + 1];
    for t in (0..n).rev() {
        for m in 0..k {
            let stay = rate(modes, m, trace.widths[t]) + best[t + 1][m].0;
            let mut choice = (stay, best[t + 1][m].1);
            for other in (0..k).filter(|&o| o != m) {
                let resume = (t + restart).min(n);
                let switched = best[resume][other];
                if switched.0 > choice.0 {
                    choice = (switched.0, switched.1 + 1);
                }
            }
            best[t][m] = choice;
        }
    }
    Outcome {
        tokens: best[0][0].0,
        restarts: best[0][0].1,
        min_gap_s: None,
    }
}
