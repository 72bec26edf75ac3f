//! The wedge watch's GPU samples (issue #35): `nvidia-smi --query-gpu=… --format=csv,noheader,
//! nounits` read on each node (the head locally, a worker over SSH) and parsed in its real
//! format — one line per GPU, `, `-separated, `[N/A]` or `[Not Supported]` for a field the GPU
//! does not report — and the judgement a two-node TP group stuck in a collective shows: busy
//! (utilisation at or above `BUSY_PCT`) at low power (under `LOW_POWER_SHARE` of its limit, or
//! `LOW_POWER_W` when the limit is not reported, as on a GB10).

use serde::{Deserialize, Serialize};

/// The query: its fields in this order.
pub(crate) const QUERY: &str =
    "nvidia-smi --query-gpu=index,utilization.gpu,power.draw,power.limit,temperature.gpu --format=csv,noheader,nounits";

/// Utilisation from which a GPU counts as busy (%).
const BUSY_PCT: f64 = 90.0;
/// Power under this share of the limit is low for a busy GPU.
const LOW_POWER_SHARE: f64 = 0.35;
/// Low power when the limit is not reported (W).
const LOW_POWER_W: f64 = 40.0;

/// One GPU as one sample saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub utilization_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub temperature_c: Option<f64>,
}

/// A node's GPUs at the last sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeGpus {
    pub node: String,
    pub gpus: Vec<GpuSample>,
}

fn field(s: &str) -> Option<f64> {
    s.trim().parse().ok()
}

/// The query's output: one GPU per line; a line that is not one (an error text) is skipped.
pub(crate) fn parse(csv: &str) -> Vec<GpuSample> {
    csv.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != 5 {
                return None;
            }
            Some(GpuSample {
                index: f[0].trim().parse().ok()?,
                utilization_pct: field(f[1]),
                power_w: field(f[2]),
                power_limit_w: field(f[3]),
                temperature_c: field(f[4]),
            })
        })
        .collect()
}

impl GpuSample {
    /// Busy at low power: spinning in a collective, not computing.
    pub(crate) fn spinning(&self) -> bool {
        let (Some(util), Some(power)) = (self.utilization_pct, self.power_w) else {
            return false;
        };
        let low = match self.power_limit_w {
            Some(limit) if limit > 0.0 => power < limit * LOW_POWER_SHARE,
            _ => power < LOW_POWER_W,
        };
        util >= BUSY_PCT && low
    }
}

/// Every node's GPUs spin (and there are some): a stall is a collective hang.
pub(crate) fn collective_hang(nodes: &[NodeGpus]) -> bool {
    let all: Vec<&GpuSample> = nodes.iter().flat_map(|n| &n.gpus).collect();
    !all.is_empty() && all.iter().all(|g| g.spinning())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_format_is_read_with_its_unreported_fields() {
        let gpus = parse("0, 98, 41.52, 150.00, 63\n1, 3, [N/A], [N/A], [Not Supported]\nNVIDIA-SMI has failed\n");
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].utilization_pct, Some(98.0));
        assert_eq!(gpus[0].power_limit_w, Some(150.0));
        assert_eq!((gpus[1].power_w, gpus[1].temperature_c), (None, None));
    }

    #[test]
    fn busy_at_low_power_is_a_collective_hang_and_busy_at_full_power_is_work() {
        let node = |csv: &str| NodeGpus {
            node: "n".into(),
            gpus: parse(csv),
        };
        assert!(collective_hang(&[
            node("0, 100, 30.0, 150.00, 55"),
            node("0, 97, 28.1, [N/A], 54")
        ]));
        assert!(!collective_hang(&[
            node("0, 100, 30.0, 150.00, 55"),
            node("0, 99, 120.0, 150.00, 70")
        ]));
        assert!(
            !collective_hang(&[node("0, 2, 20.0, 150.00, 40")]),
            "idle is not a hang"
        );
        assert!(!collective_hang(&[]), "no GPU says nothing");
    }
}
