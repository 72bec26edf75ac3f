//! `sparkgate doctor`: every check on every node of a group (workers over the SSH connection
//! the supervisor uses) — the same kernel, driver, image and weights everywhere, the ranks'
//! interface up with one MTU and speed, the peer reachable, the RoCE GID entry populated, the
//! clocks in step, memory, disk and ports — as one table of check, node, result and what to do.
//! `gather` reads (effects, bounded in time), `checks`/`compare` judge (pure, unit-tested),
//! `render` prints. `serve` runs the start's checks before a start and refuses with their words.

mod checks;
mod compare;
mod facts;
mod gather;
mod model;
mod render;

pub use model::{Check, Row, Verdict};

use sparkgate_config::Config;

/// Which checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every check (`sparkgate doctor`).
    All,
    /// Those run before every start (`serve`; `Check::at_start`).
    Start,
}

/// The doctor's findings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    /// The rows that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.verdict == Verdict::Fail)
    }

    /// One row's words: `check on node: found — fix`.
    pub fn words(row: &Row) -> String {
        render::words(row)
    }

    /// The table `sparkgate doctor` prints.
    pub fn table(&self) -> String {
        render::table(&self.rows)
    }
}

/// Runs the checks of `depth` on every node of `config`'s group.
pub async fn examine(config: &Config, depth: Depth) -> Report {
    let limits = gather::limits(config);
    let nodes = gather::nodes(config, depth).await;
    let rows = checks::judge(&limits, &nodes)
        .into_iter()
        .filter(|r| depth == Depth::All || r.check.at_start())
        .collect();
    Report { rows }
}
