//! The request model both speculation evaluations replay in virtual time (`spec_eval`
//! for one group, `spec_split_eval` for several), stepped in one loop: the trace gives
//! the demand width each second — that many closed-loop clients, each sending a request of
//! [`REQUEST_TOKENS`] output tokens as soon as its previous one finished. One queue in arrival
//! order sits in front of the groups; each group runs up to its mode's MAX_NUM_SEQS requests at
//! once, sharing the mode's table rate at their count, in 0.1 s steps. A switch drains the groups
//! whose mode changes (no admission; running requests finish at the old rate), then they deliver
//! nothing for `restart_s`; what decides the switches is the caller's [`Choose`].

use std::collections::VecDeque;

use sparkgate_spec::policy::ModeRates;
use sparkgate_spec::split::{allocate, changes};

/// Demand width for each second.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: &'static str,
    pub widths: Vec<u8>,
}

/// A profile's modes as the policy sees them, in the profile's order (the default mode first),
/// with how many requests each runs at once (its default MAX_NUM_SEQS).
#[derive(Debug, Clone)]
pub struct Modes {
    pub rates: Vec<ModeRates>,
    pub caps: Vec<usize>,
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
pub(crate) trait Choose {
    /// At second `second` (time `now`, `demand` requests in flight or queued), while no switch
    /// is under way: the split to switch to (one mode per group), if any.
    fn choose(&mut self, now: f64, second: usize, demand: f64) -> Option<Vec<usize>>;

    /// Every group serves `split` again from `t` on, after a switch.
    fn switched(&mut self, split: &[usize], t: f64);
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

/// Replays `trace` through one group per mode of `start`, switching as `chooser` says.
pub(crate) fn replay(
    setup: &Modes,
    start: &[usize],
    restart_s: f64,
    trace: &Trace,
    chooser: &mut dyn Choose,
) -> Outcome {
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
            if let Some(to) = chooser.choose(now, second, demand) {
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
                chooser.switched(&split, t);
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
