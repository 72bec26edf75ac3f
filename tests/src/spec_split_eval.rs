//! Virtual-time evaluation of speculation across several groups (`spec-eval --groups N`): the
//! same request model as [`crate::spec_eval`] (closed-loop clients, 0.1 s steps, drain then
//! `restart_s` without tokens) with one shared queue in front of N identical groups. Each
//! admission goes to the group [`allocate`] says is short of its share (a lone stream to a
//! speculating group, a wide load to a non-speculating one), else to the least loaded group with
//! room. A switch drains and restarts only the groups whose mode changes; the others serve on.
//!
//! Policies: fixed splits, `auto` over splits ([`SplitPolicy`]), the single-group policy (`auto`
//! over the uniform splits only: every group in one mode, switched together) and two oracles
//! from the per-second fluid model — over every split, and over the uniform splits only (the
//! single-group oracle).

use std::collections::VecDeque;

use sparkgate_spec::policy::{ModeRates, PolicySettings};
use sparkgate_spec::split::{allocate, changes, split_table, splits, SplitPolicy};

use crate::spec_eval::{Modes, Outcome, Tally, Trace, REQUEST_TOKENS};

const STEP_S: f64 = 0.1;

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

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Serving,
    Draining { to: usize },
    Restarting { to: usize, until: f64 },
}

struct Group {
    mode: usize,
    phase: Phase,
    /// (arrival, tokens left) of its running requests.
    running: Vec<(f64, f64)>,
}

/// Replays `trace` through N groups starting in `start` (one mode per group).
fn replay(setup: &Modes, start: &[usize], restart_s: f64, trace: &Trace, mut chooser: Chooser) -> Outcome {
    let mut groups: Vec<Group> = start
        .iter()
        .map(|&mode| Group {
            mode,
            phase: Phase::Serving,
            running: Vec::new(),
        })
        .collect();
    let mut queued: VecDeque<f64> = VecDeque::new();
    let mut tally = Tally::default();
    let mut pending: Option<Vec<usize>> = None;
    for (second, &width) in trace.widths.iter().enumerate() {
        let now = second as f64;
        let in_flight = |g: &[Group]| g.iter().map(|g| g.running.len()).sum::<usize>();
        while queued.len() + in_flight(&groups) < usize::from(width) {
            queued.push_back(now);
        }
        if pending.is_none() {
            let demand = (queued.len() + in_flight(&groups)) as f64;
            if let Some(to) = choose(&mut chooser, now, second, demand) {
                let from = current_split(&groups);
                if to != from {
                    tally.switch(now);
                    for (g, mode) in changes(&modes_of(&groups), &to) {
                        groups[g].phase = Phase::Draining { to: mode };
                    }
                    pending = Some(to);
                }
            }
        }
        for step in 0..(1.0 / STEP_S).round() as usize {
            let t = now + step as f64 * STEP_S;
            advance_phases(&mut groups, t, restart_s);
            if pending.is_some() && groups.iter().all(|g| g.phase == Phase::Serving) {
                let split = pending.take().expect("pending");
                if let Chooser::Policy(p) = &mut chooser {
                    p.set_current(&split, t);
                }
            }
            admit(setup, &mut groups, &mut queued);
            let finished = run_step(setup, &mut groups, t, &mut tally);
            for _ in 0..finished {
                if queued.len() + in_flight(&groups) < usize::from(width) {
                    queued.push_back(t + STEP_S);
                }
            }
        }
    }
    tally.outcome()
}

fn modes_of(groups: &[Group]) -> Vec<usize> {
    groups.iter().map(|g| g.mode).collect()
}

fn current_split(groups: &[Group]) -> Vec<usize> {
    let mut s = modes_of(groups);
    s.sort_unstable();
    s
}

fn choose(chooser: &mut Chooser, now: f64, second: usize, demand: f64) -> Option<Vec<usize>> {
    match chooser {
        Chooser::Fixed => None,
        Chooser::Policy(p) => p.observe(now, demand).filter(|d| d.taken).map(|d| d.to),
        // The split the schedule wants by now: a switch due while groups still restart waits.
        Chooser::Schedule(s) => s.iter().rev().find(|(at, _)| *at <= second).map(|(_, to)| to.clone()),
    }
}

/// A draining group with nothing running starts restarting; a restarted one serves its new mode.
fn advance_phases(groups: &mut [Group], t: f64, restart_s: f64) {
    for g in groups {
        match g.phase {
            Phase::Draining { to } if g.running.is_empty() => {
                g.phase = Phase::Restarting {
                    to,
                    until: t + restart_s,
                };
            }
            Phase::Restarting { to, until } if t >= until - 1e-9 => {
                g.mode = to;
                g.phase = Phase::Serving;
            }
            _ => {}
        }
    }
}

/// Queued requests to serving groups: first where [`allocate`] wants more streams for the
/// current demand, then to the least loaded group with room.
fn admit(setup: &Modes, groups: &mut [Group], queued: &mut VecDeque<f64>) {
    let serving: Vec<usize> = (0..groups.len())
        .filter(|&g| groups[g].phase == Phase::Serving)
        .collect();
    if serving.is_empty() || queued.is_empty() {
        return;
    }
    let split: Vec<usize> = serving.iter().map(|&g| groups[g].mode).collect();
    let demand = queued.len() + serving.iter().map(|&g| groups[g].running.len()).sum::<usize>();
    let (want, _) = allocate(&setup.rates, &setup.caps, &split, demand);
    while let Some(&arrival) = queued.front() {
        let room = |i: usize| groups[serving[i]].running.len() < setup.caps[split[i]];
        let short = (0..serving.len())
            .filter(|&i| room(i) && groups[serving[i]].running.len() < want[i])
            .max_by_key(|&i| want[i] - groups[serving[i]].running.len());
        let least = (0..serving.len())
            .filter(|&i| room(i))
            .min_by_key(|&i| groups[serving[i]].running.len());
        let Some(i) = short.or(least) else { break };
        queued.pop_front();
        groups[serving[i]].running.push((arrival, REQUEST_TOKENS));
    }
}

/// One step of every group at its mode's rate for its width; returns the requests finished.
fn run_step(setup: &Modes, groups: &mut [Group], t: f64, tally: &mut Tally) -> usize {
    let mut finished = 0;
    for g in groups.iter_mut().filter(|g| !g.running.is_empty()) {
        let n = g.running.len() as f64;
        let per_request = setup.rates[g.mode].at(n) / n * STEP_S;
        g.running.retain_mut(|(arrival, left)| {
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
    }
    finished
}

/// The uniform splits of `groups` groups (every group in one mode), in mode order.
pub fn uniform(modes: &Modes, groups: usize) -> Vec<Vec<usize>> {
    (0..modes.rates.len()).map(|m| vec![m; groups]).collect()
}

/// A split held all the time.
pub fn fixed(modes: &Modes, split: &[usize], trace: &Trace) -> Outcome {
    replay(modes, split, 0.0, trace, Chooser::Fixed)
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
    replay(modes, &start, settings.restart_s, trace, Chooser::Policy(Box::new(p)))
}

/// Every split of `groups` groups over the profile's modes.
pub fn all_splits(modes: &Modes, groups: usize) -> Vec<Vec<usize>> {
    splits(modes.rates.len(), groups)
}

/// The fluid-model optimum over `candidates`, starting with every group in mode 0, replayed.
pub fn oracle(modes: &Modes, groups: usize, candidates: &[Vec<usize>], restart_s: f64, trace: &Trace) -> Outcome {
    let schedule = oracle_schedule(&modes.rates, &modes.caps, candidates, restart_s, trace);
    replay(modes, &vec![0; groups], restart_s, trace, Chooser::Schedule(&schedule))
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
