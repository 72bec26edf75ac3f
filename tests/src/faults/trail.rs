//! What a fault left in the gateway's log and its restart counts (issue #39): the events it
//! logged by level (`logevents`), and the restarts `/admin/status` counted over the fault, by
//! reason and plan — so the matrix holds each fault to one WARN for an unplanned loss, INFO for
//! a planned restart, and the right restart reason.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::logevents::{self, Line};

/// A fault's trail.
#[derive(Debug, Clone, Default)]
pub struct Trail {
    /// `group_lost` lines (each a WARN when the table holds).
    pub group_lost: usize,
    /// `stream_cut` lines.
    pub stream_cuts: usize,
    /// WARN and ERROR lines by event name (`-` for a line outside the table).
    pub loud: BTreeMap<String, usize>,
    /// Loud lines outside the event table, and table lines at another level than the table's.
    pub strays: Vec<String>,
    /// The ERROR lines, whole.
    pub errors: Vec<String>,
    /// Restarts counted over the fault: `reason` (planned ones as `reason (planned)`).
    pub restarts: Vec<String>,
}

impl Trail {
    /// The trail of the log lines a fault added and the restart counts before and after it.
    pub fn of(lines: &[String], before: &Value, after: &Value) -> Trail {
        let lines = logevents::parse(lines);
        let mut t = Trail {
            group_lost: logevents::named(&lines, "group_lost").len(),
            stream_cuts: logevents::named(&lines, "stream_cut").len(),
            restarts: restarted(before, after),
            ..Trail::default()
        };
        for l in lines.iter().filter(|l| l.loud()) {
            *t.loud.entry(l.event.clone().unwrap_or_else(|| "-".into())).or_default() += 1;
        }
        t.strays = lines.iter().filter(|l| stray(l)).map(|l| l.text.clone()).collect();
        t.errors = lines
            .iter()
            .filter(|l| l.level == "ERROR")
            .map(|l| l.text.clone())
            .collect();
        t
    }

    /// The loud lines as the table shows them: `group_lost×1, stream_cut×3`.
    pub fn shown(&self) -> String {
        let words: Vec<String> = self.loud.iter().map(|(e, n)| format!("{e}×{n}")).collect();
        if words.is_empty() {
            "—".into()
        } else {
            words.join(", ")
        }
    }
}

/// A loud line with no event, or an event at another level than the table's.
fn stray(l: &Line) -> bool {
    match &l.event {
        None => l.loud(),
        Some(name) => sparkgate_events::Event::TABLE
            .iter()
            .find(|(n, _)| n == name)
            .is_none_or(|(_, level)| level.label() != l.level),
    }
}

/// The restarts counted between two `/admin/status` answers.
fn restarted(before: &Value, after: &Value) -> Vec<String> {
    let counts = |s: &Value| -> BTreeMap<String, (u64, bool)> {
        s["supervisor"]["restart_counts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let reason = c["reason"].as_str().unwrap_or("?").to_owned();
                (reason, (c["count"].as_u64().unwrap_or(0), c["planned"] == true))
            })
            .collect()
    };
    let (was, now) = (counts(before), counts(after));
    let mut out = Vec::new();
    for (reason, (n, planned)) in now {
        let before = was.get(&reason).map_or(0, |c| c.0);
        for _ in before..n {
            out.push(if planned {
                format!("{reason} (planned)")
            } else {
                reason.clone()
            });
        }
    }
    out
}
