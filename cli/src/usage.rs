//! `sparkgate usage`: per-key usage from the gateway's `/admin/usage` (docs/keys.md) as a table
//! — one line per key, model and route, then the total — or its JSON (`--json`).

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::Value;

use crate::admin::Endpoint;

/// The table's columns: heading, the JSON field, its width.
const COLUMNS: [(&str, &str, usize); 9] = [
    ("REQUESTS", "requests", 9),
    ("ERRORS", "errors", 7),
    ("CUT", "disconnects", 5),
    ("REFUSED", "refusals", 8),
    ("PROMPT", "prompt", 11),
    ("CACHED", "cached", 11),
    ("COMPLETION", "completion", 11),
    ("REASONING", "reasoning", 10),
    ("WAIT P95", "queue_wait_ms", 9),
];

pub(super) fn run(ep: &Endpoint, window: &str, key: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let mut path = format!("/admin/usage?window={window}");
    if let Some(k) = key {
        path.push_str("&key=");
        path.push_str(k);
    }
    let v = ep.get(&path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", table(&v));
    }
    Ok(ExitCode::SUCCESS)
}

/// `/admin/usage` as the table `sparkgate usage` prints.
pub(super) fn table(v: &Value) -> String {
    let mut out = format!(
        "usage, {} (since {})\n",
        v["window"].as_str().unwrap_or("?"),
        v["since"]
    );
    let _ = write!(out, "{:<16} {:<28} {:<12}", "KEY", "MODEL", "ROUTE");
    for (head, _, width) in COLUMNS {
        let _ = write!(out, " {head:>width$}");
    }
    out.push('\n');
    for row in v["rows"].as_array().into_iter().flatten() {
        line(
            &mut out,
            [&row["key"], &row["model"], &row["route"]].map(|s| s.as_str().unwrap_or("-")),
            row,
        );
    }
    line(&mut out, ["total", "", ""], &v["total"]);
    out
}

fn line(out: &mut String, names: [&str; 3], counts: &Value) {
    let _ = write!(out, "{:<16} {:<28} {:<12}", names[0], names[1], names[2]);
    for (_, field, width) in COLUMNS {
        let cell = match field {
            "queue_wait_ms" => counts[field]["p95"]
                .as_u64()
                .map_or("-".into(), |ms| format!("{ms} ms")),
            _ => counts[field].as_u64().unwrap_or(0).to_string(),
        };
        let _ = write!(out, " {cell:>width$}");
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_usage_answer_is_one_line_per_row_and_a_total() {
        let v = serde_json::json!({
            "window": "today", "since": 60,
            "rows": [{"key": "alice", "model": "m", "route": "chat", "requests": 3, "prompt": 30, "completion": 12,
                      "queue_wait_ms": {"p95": 50}}],
            "total": {"requests": 3, "prompt": 30, "completion": 12, "queue_wait_ms": {"p95": null}},
        });
        let t = super::table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[2].starts_with("alice") && lines[2].contains("50 ms"), "{t}");
        assert!(
            lines[3].starts_with("total") && lines[3].trim_end().ends_with('-'),
            "{t}"
        );
    }
}
