//! Speculative-decoding modes: their `--speculative-config`, capacity and throughput tables.

use serde::Serialize;

use crate::choice::choice;
use crate::profile::ProfileId;

choice! {
    /// A speculation method as `SPEC_METHOD` names it.
    pub enum SpecMethod {
        /// DeepSeek's in-checkpoint DSpark drafter.
        Dspark = "dspark",
        /// GLM's separate DFlash2 draft model.
        Dflash = "dflash",
        /// The checkpoint's multi-token-prediction head.
        Mtp = "mtp",
        /// No speculation.
        None = "none",
    }
}

/// How a throughput figure is known.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "basis", content = "note", rename_all = "lowercase")]
pub enum Basis {
    /// Measured by a reference guide; the note names where.
    Measured(&'static str),
    /// Linear between the nearest measured widths.
    Interpolated,
    /// Held at the widest measured value (wider demand only queues).
    Extrapolated,
    /// No measurement exists; the note says how the figure was derived.
    Estimated(&'static str),
}

/// Aggregate decode tokens/s at one demand width (concurrent streams).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThroughputPoint {
    pub width: u32,
    pub tokens_per_s: f64,
    #[serde(flatten)]
    pub basis: Basis,
}

/// Aggregate tokens/s by width 1..=N for one mode, every width filled.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ThroughputTable {
    points: Vec<ThroughputPoint>,
}

impl ThroughputTable {
    /// Fills widths 1..=`max_width` from the known points: known widths keep their basis, gaps
    /// between two known widths are interpolated linearly, widths past the last known one are
    /// held at its value.
    fn fill(known: &[ThroughputPoint], max_width: u32) -> Self {
        let mut points = Vec::with_capacity(max_width as usize);
        for width in 1..=max_width {
            let below = known.iter().rev().find(|p| p.width <= width);
            let above = known.iter().find(|p| p.width >= width);
            let point = match (below, above) {
                (Some(b), _) if b.width == width => b.clone(),
                (Some(b), Some(a)) => {
                    let t = f64::from(width - b.width) / f64::from(a.width - b.width);
                    let tps = b.tokens_per_s + t * (a.tokens_per_s - b.tokens_per_s);
                    ThroughputPoint {
                        width,
                        tokens_per_s: round1(tps),
                        basis: Basis::Interpolated,
                    }
                }
                (Some(b), None) => ThroughputPoint {
                    width,
                    tokens_per_s: b.tokens_per_s,
                    basis: Basis::Extrapolated,
                },
                (None, Some(a)) => ThroughputPoint {
                    width,
                    tokens_per_s: round1(a.tokens_per_s * f64::from(width) / f64::from(a.width)),
                    basis: Basis::Extrapolated,
                },
                (None, None) => unreachable!("every mode table has at least one known point"),
            };
            points.push(point);
        }
        Self { points }
    }

    pub fn points(&self) -> &[ThroughputPoint] {
        &self.points
    }

    /// Aggregate tokens/s at `width`; widths past the table hold its last value.
    pub fn at(&self, width: u32) -> f64 {
        let index = (width.max(1) as usize).min(self.points.len()) - 1;
        self.points[index].tokens_per_s
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// One mode as configured: what it passes to vLLM and what it can serve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpecMode {
    pub method: SpecMethod,
    /// `num_speculative_tokens`; 0 for `none`.
    pub num_speculative_tokens: u32,
    /// The concurrency limit this mode runs with (its `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// `--cudagraph-capture-sizes` used with this mode unless eager or overridden.
    pub cudagraph_capture_sizes: Vec<u32>,
    pub throughput: ThroughputTable,
}

/// Static definition of a mode in a profile.
#[derive(Debug)]
pub(crate) struct ModeDef {
    pub(crate) method: SpecMethod,
    /// The knob carrying `num_speculative_tokens` (`None` for `none`).
    pub(crate) tokens_knob: Option<&'static str>,
    pub(crate) max_num_seqs: u32,
    pub(crate) capture_sizes: &'static [u32],
    pub(crate) known: &'static [ThroughputPoint],
}

/// Widest demand the seeded tables describe (the largest MAX_NUM_SEQS of any mode).
pub(crate) const TABLE_WIDTH: u32 = 4;

const DS_README: &str = "DeepSeek README performance table";
const GLM_SPARKDASH: &str = "GLM README sparkDash decode, structured, k=7";

static DEEPSEEK_MODES: [ModeDef; 2] = [
    ModeDef {
        method: SpecMethod::Dspark,
        tokens_knob: Some("DSPARK_TOKENS"),
        max_num_seqs: 2,
        capture_sizes: &[1, 2, 3, 4, 6, 8, 12, 18, 24],
        known: &[
            ThroughputPoint {
                width: 1,
                tokens_per_s: 31.6,
                basis: Basis::Measured(DS_README),
            },
            ThroughputPoint {
                width: 2,
                tokens_per_s: 42.5,
                basis: Basis::Measured(DS_README),
            },
            ThroughputPoint {
                width: 4,
                tokens_per_s: 42.8,
                basis: Basis::Measured(DS_README),
            },
        ],
    },
    ModeDef {
        method: SpecMethod::None,
        tokens_knob: None,
        max_num_seqs: 4,
        capture_sizes: &[1, 2, 3, 4, 6, 8, 12, 18, 24],
        known: &[
            ThroughputPoint {
                width: 1,
                tokens_per_s: 23.0,
                basis: Basis::Measured(DS_README),
            },
            ThroughputPoint {
                width: 4,
                tokens_per_s: 53.7,
                basis: Basis::Measured(DS_README),
            },
        ],
    },
];

const GLM_NONE_NOTE: &str =
    "no GLM measurement; MTP k=2 x1 less a 1.2x speculation gain, widened like DeepSeek's none mode (x4 = 2.33 x1)";

static GLM_MODES: [ModeDef; 3] = [
    ModeDef {
        method: SpecMethod::Dflash,
        tokens_knob: Some("DFLASH_TOKENS"),
        max_num_seqs: 4,
        capture_sizes: &[1, 2, 4, 8, 16, 24, 32],
        known: &[
            ThroughputPoint {
                width: 1,
                tokens_per_s: 62.9,
                basis: Basis::Measured(GLM_SPARKDASH),
            },
            ThroughputPoint {
                width: 2,
                tokens_per_s: 103.3,
                basis: Basis::Measured(GLM_SPARKDASH),
            },
            ThroughputPoint {
                width: 4,
                tokens_per_s: 146.5,
                basis: Basis::Measured(GLM_SPARKDASH),
            },
        ],
    },
    ModeDef {
        method: SpecMethod::Mtp,
        tokens_knob: Some("MTP_TOKENS"),
        max_num_seqs: 4,
        capture_sizes: &[1, 2, 3, 4, 6, 8, 12],
        known: &[
            ThroughputPoint {
                width: 1,
                tokens_per_s: 24.6,
                basis: Basis::Measured("GLM README, MTP k=2 baseline"),
            },
            ThroughputPoint {
                width: 4,
                tokens_per_s: 50.0,
                basis: Basis::Estimated("no measurement; DeepSeek none-mode widening less MTP verification cost"),
            },
        ],
    },
    ModeDef {
        method: SpecMethod::None,
        tokens_knob: None,
        max_num_seqs: 4,
        capture_sizes: &[1, 2, 3, 4, 6, 8, 12],
        known: &[
            ThroughputPoint {
                width: 1,
                tokens_per_s: 20.5,
                basis: Basis::Estimated(GLM_NONE_NOTE),
            },
            ThroughputPoint {
                width: 4,
                tokens_per_s: 47.8,
                basis: Basis::Estimated(GLM_NONE_NOTE),
            },
        ],
    },
];

pub(crate) fn mode_defs(profile: ProfileId) -> &'static [ModeDef] {
    match profile {
        ProfileId::DeepSeekV41Flash => &DEEPSEEK_MODES,
        ProfileId::Glm53Flash => &GLM_MODES,
    }
}

/// The seeded throughput table of `method` in `profile` (what the simulator paces by), if the
/// profile has that mode.
pub fn seeded_throughput(profile: ProfileId, method: SpecMethod) -> Option<ThroughputTable> {
    mode_def(profile, method).map(|d| ThroughputTable::fill(d.known, TABLE_WIDTH))
}

/// The MAX_NUM_SEQS `method` runs with by default in `profile`, if the profile has that mode.
pub fn default_max_num_seqs(profile: ProfileId, method: SpecMethod) -> Option<u32> {
    mode_def(profile, method).map(|d| d.max_num_seqs)
}

pub(crate) fn mode_def(profile: ProfileId, method: SpecMethod) -> Option<&'static ModeDef> {
    mode_defs(profile).iter().find(|m| m.method == method)
}

impl ModeDef {
    pub(crate) fn build(&self, num_speculative_tokens: u32, max_num_seqs: u32) -> SpecMode {
        SpecMode {
            method: self.method,
            num_speculative_tokens,
            max_num_seqs,
            cudagraph_capture_sizes: self.capture_sizes.to_vec(),
            throughput: ThroughputTable::fill(self.known, TABLE_WIDTH),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_keep_measurements_and_mark_the_rest() {
        let ds = mode_def(ProfileId::DeepSeekV41Flash, SpecMethod::None)
            .unwrap()
            .build(0, 4);
        let t = &ds.throughput;
        assert_eq!(t.points().len(), 4);
        assert_eq!(t.at(1), 23.0);
        assert_eq!(t.at(4), 53.7);
        assert_eq!(t.points()[1].basis, Basis::Interpolated);
        assert_eq!(t.at(2), 33.2);
        assert_eq!(t.at(9), 53.7, "widths past the table hold the last value");

        let spark = mode_def(ProfileId::DeepSeekV41Flash, SpecMethod::Dspark)
            .unwrap()
            .build(3, 2);
        assert_eq!(spark.throughput.at(1), 31.6);
        assert_eq!(spark.throughput.at(2), 42.5);
        assert!(matches!(spark.throughput.points()[0].basis, Basis::Measured(_)));

        let glm = mode_def(ProfileId::Glm53Flash, SpecMethod::Dflash).unwrap().build(7, 4);
        assert_eq!(
            glm.throughput
                .points()
                .iter()
                .map(|p| p.tokens_per_s)
                .collect::<Vec<_>>(),
            vec![62.9, 103.3, 124.9, 146.5]
        );
    }

    #[test]
    fn deepseek_crossover_matches_the_guide() {
        // The guide's advice: DSpark for <= 2 streams, speculation off for 4.
        let spark = mode_def(ProfileId::DeepSeekV41Flash, SpecMethod::Dspark)
            .unwrap()
            .build(3, 2);
        let none = mode_def(ProfileId::DeepSeekV41Flash, SpecMethod::None)
            .unwrap()
            .build(0, 4);
        assert!(spark.throughput.at(1) > none.throughput.at(1));
        assert!(spark.throughput.at(2) > none.throughput.at(2));
        assert!(none.throughput.at(4) > spark.throughput.at(4));
    }
}
