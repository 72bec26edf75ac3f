//! `sparkgate quarantine [list|release ID]`: the request bodies refused as poisonous, from the
//! gateway's `/admin/quarantine` (the store's record: every gateway sharing it refuses them),
//! and an operator's release of one.

use std::fmt::Write as _;
use std::process::ExitCode;

use bytes::Bytes;
use serde_json::Value;

use crate::admin::{call, get_json, refusal, Endpoint};

/// What `sparkgate quarantine` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Action {
    /// List the quarantined bodies (the default).
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Release a body (its ID from `list`): requests with it run again, on every gateway
    /// sharing the store.
    Release { id: String },
}

pub(super) fn run(ep: &Endpoint, action: Option<Action>) -> anyhow::Result<ExitCode> {
    match action.unwrap_or(Action::List { json: false }) {
        Action::List { json } => {
            let v = get_json(ep, "/admin/quarantine")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", table(&v["quarantine"], now()));
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Release { id } => {
            let (status, body) = call(
                ep,
                "POST",
                &format!("/admin/quarantine/{id}/release"),
                Bytes::new(),
                false,
            )?;
            if status >= 300 {
                eprintln!("sparkgate: {}", refusal(status, &body));
                return Ok(ExitCode::from(1));
            }
            println!("released {id}: requests with this body run again");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The list as a table: id, requests quarantined, whether refused, key, age, expiry, reason.
pub(super) fn table(list: &Value, now: i64) -> String {
    let entries = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if entries.is_empty() {
        return "no request body is quarantined\n".to_owned();
    }
    let mut out = format!(
        "{:<16}  {:>5}  {:<8}  {:<16}  {:>8}  {:>10}  REASON\n",
        "ID", "TIMES", "STATE", "KEY", "LAST", "EXPIRES IN"
    );
    for e in entries {
        let times = e["quarantines"].as_u64().unwrap_or(0);
        let state = if times >= 2 { "refused" } else { "watched" };
        let ago = now - e["last_at"].as_i64().unwrap_or(now);
        let left = e["expires_at"].as_i64().unwrap_or(now) - now;
        let _ = writeln!(
            out,
            "{:<16}  {times:>5}  {state:<8}  {:<16}  {:>8}  {:>10}  {}",
            e["id"].as_str().unwrap_or("?"),
            e["key"].as_str().unwrap_or("-"),
            format!("{}s ago", ago.max(0)),
            format!("{}s", left.max(0)),
            e["reason"].as_str().unwrap_or(""),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_says_which_bodies_are_refused_and_until_when() {
        let list = json!([
            {"id": "00ff00ff00ff00ff", "quarantines": 2, "key": "alice", "last_at": 990, "expires_at": 4590,
             "reason": "the engine crashed within 10 s of its dispatch while it ran alone"},
            {"id": "1234567890abcdef", "quarantines": 1, "key": "bob", "last_at": 900, "expires_at": 4500, "reason": "r"},
        ]);
        let t = table(&list, 1_000);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("ID"), "{t}");
        assert!(
            lines[1].contains("00ff00ff00ff00ff")
                && lines[1].contains("refused")
                && lines[1].contains("10s ago")
                && lines[1].contains("3590s"),
            "{t}"
        );
        assert!(lines[2].contains("watched") && lines[2].contains("bob"), "{t}");
        assert_eq!(table(&json!([]), 0), "no request body is quarantined\n");
    }
}
