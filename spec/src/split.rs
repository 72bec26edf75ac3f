//! Speculation split across groups: with several identical groups the fleet may keep groups in
//! different modes — one speculating for narrow demand, one not for wide demand — and route
//! each stream to the group where it adds the most tokens/s. Pure, in caller-supplied time,
//! like [`crate::policy`], whose rule it reuses.
//!
//! - A *split* gives each group a mode, as sorted mode indices (groups are alike, so `[0, 1]`
//!   and `[1, 0]` are the same split).
//! - [`allocate`] is the routing rule: for a total demand it says how many streams each group
//!   should run for the most tokens/s under each group's MAX_NUM_SEQS (a lone stream goes to a
//!   speculating group, a wide load fills the non-speculating one first). Its rate at each width
//!   is the split's aggregate table.
//! - [`SplitPolicy`] is the `auto` rule over splits: every split is a "mode" whose table is its
//!   aggregate one, and a switch is priced at the share of the rate the restarting groups carry,
//!   since the groups that keep their mode keep serving. So the fleet changes a group's mode
//!   only when the split itself should change, never to follow each burst.

use crate::policy::{AutoPolicy, Decision, ModeRates, PolicySettings};

/// Every split of `groups` groups over `modes` modes, each as sorted mode indices; the uniform
/// splits (every group in one mode) come in mode order among them.
pub fn splits(modes: usize, groups: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    for _ in 0..groups {
        let mut next = Vec::new();
        for split in &out {
            let from = split.last().copied().unwrap_or(0);
            for m in from..modes {
                let mut s = split.clone();
                s.push(m);
                next.push(s);
            }
        }
        out = next;
    }
    out
}

/// How many of `width` streams each group of `split` should run (same order as `split`) for the
/// most aggregate tokens/s, each group at most its mode's cap, and that rate. Streams beyond
/// the split's total capacity are not placed.
pub fn allocate(rates: &[ModeRates], caps: &[usize], split: &[usize], width: usize) -> (Vec<usize>, f64) {
    // best[g][w]: the most tokens/s groups g.. give to w streams; pick[g][w]: how many group g runs.
    let n = split.len();
    let mut best = vec![vec![f64::NEG_INFINITY; width + 1]; n + 1];
    let mut pick = vec![vec![0usize; width + 1]; n];
    best[n][0] = 0.0;
    for g in (0..n).rev() {
        let mode = split[g];
        for w in 0..=width {
            for k in 0..=w.min(caps[mode]) {
                let rest = best[g + 1][w - k];
                let total = rates[mode].at(k as f64) + rest;
                if rest.is_finite() && total > best[g][w] + 1e-9 {
                    best[g][w] = total;
                    pick[g][w] = k;
                }
            }
        }
    }
    let placed = (0..=width).rev().find(|&w| best[0][w].is_finite()).unwrap_or(0);
    let (mut out, mut left) = (Vec::with_capacity(n), placed);
    for row in &pick {
        out.push(row[left]);
        left -= row[left];
    }
    (out, best[0][placed].max(0.0))
}

/// A split's aggregate tokens/s by total width (index 0 = width 1), up to its total capacity.
pub fn split_table(rates: &[ModeRates], caps: &[usize], split: &[usize]) -> Vec<f64> {
    let total: usize = split.iter().map(|&m| caps[m]).sum();
    (1..=total).map(|w| allocate(rates, caps, split, w).1).collect()
}

/// Which groups of `from` restart to reach `to`: those whose mode `to` does not keep, paired
/// with their new modes (groups keep their mode wherever they can).
pub fn changes(from: &[usize], to: &[usize]) -> Vec<(usize, usize)> {
    let mut wanted: Vec<usize> = to.to_vec();
    let mut kept = vec![false; from.len()];
    for (g, m) in from.iter().enumerate() {
        if let Some(i) = wanted.iter().position(|w| w == m) {
            wanted.remove(i);
            kept[g] = true;
        }
    }
    let moving = (0..from.len()).filter(|&g| !kept[g]);
    moving.zip(wanted).collect()
}

/// A switch the split policy considered, taken or declined.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitDecision {
    pub at_s: f64,
    pub to: Vec<usize>,
    pub taken: bool,
    /// The policy's numbers (its `from`/`to` names are each split's first group's mode).
    pub detail: Decision,
}

/// The `auto` rule over splits.
#[derive(Debug, Clone)]
pub struct SplitPolicy {
    auto: AutoPolicy,
    splits: Vec<Vec<usize>>,
}

impl SplitPolicy {
    /// The policy over `splits` (each a split of the same groups), starting in `start` at `now_s`.
    pub fn new(
        rates: &[ModeRates],
        caps: &[usize],
        splits: Vec<Vec<usize>>,
        start: &[usize],
        settings: PolicySettings,
        now_s: f64,
    ) -> Self {
        let current = splits
            .iter()
            .position(|s| s == start)
            .expect("start is one of the splits");
        let tables: Vec<ModeRates> = splits
            .iter()
            .map(|s| ModeRates {
                name: rates[s[0]].name,
                tokens_per_s: split_table(rates, caps, s),
            })
            .collect();
        // The restarting groups' share of the split's rate at its full width.
        let share: Vec<Vec<f64>> = splits
            .iter()
            .map(|from| {
                let full: usize = from.iter().map(|&m| caps[m]).sum();
                let (alloc, total) = allocate(rates, caps, from, full);
                splits
                    .iter()
                    .map(|to| {
                        let lost: f64 = changes(from, to)
                            .iter()
                            .map(|&(g, _)| rates[from[g]].at(alloc[g] as f64))
                            .sum();
                        if total > 0.0 {
                            lost / total
                        } else {
                            1.0
                        }
                    })
                    .collect()
            })
            .collect();
        let auto = AutoPolicy::new(tables, current, settings, now_s).with_lost_share(share);
        SplitPolicy { auto, splits }
    }

    pub fn current(&self) -> &[usize] {
        &self.splits[self.auto.current()]
    }

    /// Feeds one demand-width sample (streams in flight plus queued, over all groups).
    pub fn observe(&mut self, now_s: f64, width: f64) -> Option<SplitDecision> {
        let d = self.auto.observe(now_s, width)?;
        Some(SplitDecision {
            at_s: d.at_s,
            to: self.splits[d.to_index].clone(),
            taken: d.taken,
            detail: d,
        })
    }

    /// The fleet now runs `split` (every restarting group is ready again).
    pub fn set_current(&mut self, split: &[usize], now_s: f64) {
        let i = self.splits.iter().position(|s| s == split).expect("a known split");
        self.auto.set_current(i, now_s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparkgate_config::SpecMethod;

    /// DeepSeek's seeded shape: dspark (cap 2) wins at one stream, none (cap 4) when wide.
    fn two_modes() -> (Vec<ModeRates>, Vec<usize>) {
        let rates = vec![
            ModeRates {
                name: SpecMethod::Dspark,
                tokens_per_s: vec![31.4, 42.3],
            },
            ModeRates {
                name: SpecMethod::None,
                tokens_per_s: vec![22.9, 35.0, 45.0, 53.6],
            },
        ];
        (rates, vec![2, 4])
    }

    #[test]
    fn splits_are_multisets_of_modes() {
        assert_eq!(splits(2, 2), [vec![0, 0], vec![0, 1], vec![1, 1]]);
        assert_eq!(splits(3, 2).len(), 6);
        assert_eq!(splits(2, 3).len(), 4);
    }

    #[test]
    fn a_lone_stream_goes_to_the_speculating_group_and_a_wide_load_fills_the_other() {
        let (rates, caps) = two_modes();
        let mixed = [0, 1];
        assert_eq!(allocate(&rates, &caps, &mixed, 1).0, [1, 0]);
        let (alloc, rate) = allocate(&rates, &caps, &mixed, 6);
        assert_eq!(alloc, [2, 4]);
        assert!((rate - (42.3 + 53.6)).abs() < 1e-9);
        // Beyond the split's capacity nothing more is placed.
        assert_eq!(allocate(&rates, &caps, &mixed, 9).0, [2, 4]);
        assert_eq!(split_table(&rates, &caps, &mixed).len(), 6);
    }

    #[test]
    fn a_switch_restarts_only_the_groups_whose_mode_changes() {
        assert_eq!(changes(&[0, 0], &[0, 1]), [(1, 1)]);
        assert_eq!(changes(&[0, 1], &[1, 1]), [(0, 1)]);
        assert_eq!(changes(&[0, 1], &[0, 1]), []);
        assert_eq!(changes(&[0, 0], &[1, 1]), [(0, 1), (1, 1)]);
    }

    #[test]
    fn sustained_wide_demand_moves_one_group_and_keeps_the_other_speculating() {
        let (rates, caps) = two_modes();
        let settings = PolicySettings::for_restart(300.0);
        let mut p = SplitPolicy::new(&rates, &caps, splits(2, 2), &[0, 0], settings, 0.0);
        let mut taken = None;
        for t in 0..7200 {
            if let Some(d) = p.observe(f64::from(t), 5.0).filter(|d| d.taken) {
                taken = Some(d);
                break;
            }
        }
        let d = taken.expect("five streams for two hours move a group");
        assert_eq!(d.to, [0, 1], "one group speculates on, the other serves the width");
        // Priced at the restarting group's half of the rate (2 × 42.3 tok/s), not all of it.
        assert!((d.detail.cost_tokens - 300.0 * 42.3).abs() < 1.0, "{:?}", d.detail);
        p.set_current(&d.to, d.at_s + 300.0);
        assert_eq!(p.current(), [0, 1]);
    }
}
