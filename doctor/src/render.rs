//! The doctor's table: one line per check and node — check, node, result, what was found, and
//! under a failed row what to do.

use crate::model::{Row, Verdict};

fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "ok",
        Verdict::Fail => "FAIL",
        Verdict::Skip => "skip",
    }
}

pub(crate) fn words(r: &Row) -> String {
    format!("{} on {}: {} — {}", r.check.name(), r.node, r.found, r.fix)
}

pub(crate) fn table(rows: &[Row]) -> String {
    let mut out = format!("{:<15} {:<10} {:<6} found\n", "check", "node", "result");
    for r in rows {
        out.push_str(&format!(
            "{:<15} {:<10} {:<6} {}\n",
            r.check.name(),
            r.node,
            verdict(r.verdict),
            r.found
        ));
        if r.verdict == Verdict::Fail {
            out.push_str(&format!("{:<33} fix: {}\n", "", r.fix));
        }
    }
    let failed = rows.iter().filter(|r| r.verdict == Verdict::Fail).count();
    out.push_str(&match failed {
        0 => format!("{} checks passed or do not apply here\n", rows.len()),
        n => format!("{n} of {} checks failed\n", rows.len()),
    });
    out
}
