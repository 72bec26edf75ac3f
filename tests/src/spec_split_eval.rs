//! Virtual-time evaluation of speculation across several groups (`spec-eval --groups N`): the
//! same request model as [`crate::spec_eval`], stepped by the same loop (closed-loop clients,
//! 0.1 s steps, drain then `restart_s` without tokens), with one shared queue in front of N
//! identical groups. Each admission goes to the group
//! [`allocate`](sparkgate_spec::split::allocate) says is short of its share (a lone stream to a
//! speculating group, a wide load to a non-speculating one), else to the least loaded group with
//! room. A switch drains and restarts only the groups whose mode changes; the others serve on.
//!
//! Policies: fixed splits, `auto` over splits ([`SplitPolicy`]), the single-group policy (`auto`
//! over the uniform splits only: every group in one mode, switched together) and two oracles
//! from the per-second fluid model — over every split, and over the uniform splits only (the
//! single-group oracle).

use sparkgate_spec::policy::{ModeRates, PolicySettings};
use sparkgate_spec::split::{changes, split_table, splits, SplitPolicy};

use crate::spec_replay::{replay, Choose, Modes, Outcome, Trace};

/// The trace with every width multiplied by `factor` (N groups' worth of the same demand).
pub fn scaled(trace: &Trace, factor: u8) -> Trace {
    Trace {
        name: trace.name,
        widths: trace.widths.iter().map(|w| w.saturating_mul(factor)).collect(),
    }
}

/// Who decides the splits during a replay.
enum Chooser<'a> {
    Fixed,
    Policy(Box<SplitPolicy>),
    /// Switch to the split at the given second.
    Schedule(&'a [(usize, Vec<usize>)]),
}

impl Choose for Chooser<'_> {
    fn choose(&mut self, now: f64, second: usize, demand: f64) -> Option<Vec<usize>> {
        match self {
            Chooser::Fixed => None,
            Chooser::Policy(p) => p.observe(now, demand).filter(|d| d.taken).map(|d| d.to),
            // The split the schedule wants by now: a switch due while groups still restart waits.
            Chooser::Schedule(s) => s.iter().rev().find(|(at, _)| *at <= second).map(|(_, to)| to.clone()),
        }
    }

    fn switched(&mut self, split: &[usize], t: f64) {
        if let Chooser::Policy(p) = self {
            p.set_current(split, t);
        }
    }
}

/// The uniform splits of `groups` groups (every group in one mode), in mode order.
pub fn uniform(modes: &Modes, groups: usize) -> Vec<Vec<usize>> {
    (0..modes.rates.len()).map(|m| vec![m; groups]).collect()
}

/// A split held all the time.
pub fn fixed(modes: &Modes, split: &[usize], trace: &Trace) -> Outcome {
    replay(modes, split, 0.0, trace, &mut Chooser::Fixed)
}

/// `auto` over `candidates` (every split, or the uniform ones for the single-group policy),
/// starting with every group in mode 0.
pub fn policy(
    modes: &Modes,
    groups: usize,
    candidates: Vec<Vec<usize>>,
    settings: &PolicySettings,
    trace: &Trace,
) -> Outcome {
    let start = vec![0; groups];
    let p = SplitPolicy::new(&modes.rates, &modes.caps, candidates, &start, settings.clone(), 0.0);
    replay(
        modes,
        &start,
        settings.restart_s,
        trace,
        &mut Chooser::Policy(Box::new(p)),
    )
}

/// Every split of `groups` groups over the profile's modes.
pub fn all_splits(modes: &Modes, groups: usize) -> Vec<Vec<usize>> {
    splits(modes.rates.len(), groups)
}

/// The fluid-model optimum over `candidates`, starting with every group in mode 0, replayed.
pub fn oracle(modes: &Modes, groups: usize, candidates: &[Vec<usize>], restart_s: f64, trace: &Trace) -> Outcome {
    let schedule = oracle_schedule(&modes.rates, &modes.caps, candidates, restart_s, trace);
    replay(
        modes,
        &vec![0; groups],
        restart_s,
        trace,
        &mut Chooser::Schedule(&schedule),
    )
}

/// (second, split) switches of the fluid optimum: a switch delivers only what the groups that
/// keep their mode deliver for `restart_s`.
fn oracle_schedule(
    rates: &[ModeRates],
    caps: &[usize],
    candidates: &[Vec<usize>],
    restart_s: f64,
    trace: &Trace,
) -> Vec<(usize, Vec<usize>)> {
    let (n, k, restart) = (trace.widths.len(), candidates.len(), restart_s.round() as usize);
    let table = |split: &[usize]| -> ModeRates {
        ModeRates {
            name: rates[0].name,
            tokens_per_s: split_table(rates, caps, split),
        }
    };
    let full: Vec<ModeRates> = candidates.iter().map(|s| table(s)).collect();
    // kept[a][b]: what a's groups that b keeps deliver while the others restart.
    let kept: Vec<Vec<ModeRates>> = candidates
        .iter()
        .map(|a| {
            candidates
                .iter()
                .map(|b| {
                    let moving: Vec<usize> = changes(a, b).iter().map(|&(g, _)| g).collect();
                    let stay: Vec<usize> = (0..a.len()).filter(|g| !moving.contains(g)).map(|g| a[g]).collect();
                    table(&stay)
                })
                .collect()
        })
        .collect();
    let at = |r: &ModeRates, t: usize| r.at(f64::from(trace.widths[t]));
    // sums[a][b][t]: kept[a][b]'s tokens over seconds 0..t, so a restart window is one difference.
    let sums: Vec<Vec<Vec<f64>>> = kept
        .iter()
        .map(|row| {
            row.iter()
                .map(|r| {
                    let mut acc = vec![0.0; n + 1];
                    for t in 0..n {
                        acc[t + 1] = acc[t] + at(r, t);
                    }
                    acc
                })
                .collect()
        })
        .collect();
    let mut best = vec![vec![0.0f64; k]; n + 1];
    let mut next = vec![vec![None::<usize>; k]; n];
    for t in (0..n).rev() {
        for a in 0..k {
            best[t][a] = at(&full[a], t) + best[t + 1][a];
            for b in (0..k).filter(|&b| b != a) {
                let end = (t + restart).min(n);
                let during = sums[a][b][end] - sums[a][b][t];
                let switched = during + best[end][b];
                if switched > best[t][a] {
                    best[t][a] = switched;
                    next[t][a] = Some(b);
                }
            }
        }
    }
    let start = candidates
        .iter()
        .position(|s| s.iter().all(|&m| m == 0))
        .expect("all in mode 0");
    let (mut t, mut a, mut out) = (0, start, Vec::new());
    while t < n {
        match next[t][a] {
            Some(b) => {
                out.push((t, candidates[b].clone()));
                a = b;
                t += restart.max(1);
            }
            None => t += 1,
        }
    }
    out
}
