//! The generations sent to a group and not finished yet, as a diagnostics bundle lists them
//! (`in-flight.tsv`) and `/admin/requests` shows them (the console): request id, the key's name,
//! route, group, the prompt's estimate, the events streamed so far, how often the stream was
//! continued after a cut, and for how long — never a body or a key. An entry is made when the
//! request is sent and leaves when its account closes (or is dropped).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

/// One request in flight.
#[derive(Debug)]
pub(crate) struct Entry {
    request_id: String,
    key: String,
    route: &'static str,
    group: String,
    /// The model the request named (after aliases).
    model: String,
    prompt_estimate: u64,
    streamed: AtomicU32,
    /// Continued after a cut (RESUME_TIMEOUT).
    resumed: AtomicU32,
    since: Instant,
}

/// Every request in flight.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    next: AtomicU64,
    entries: Mutex<HashMap<u64, Arc<Entry>>>,
}

/// What a request sent to a group is listed as.
pub(crate) struct Sending<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) key: &'a str,
    pub(crate) route: &'static str,
    pub(crate) group: &'a str,
    pub(crate) model: &'a str,
    pub(crate) prompt_estimate: u64,
}

/// A request's place in the list; it leaves when this is dropped.
#[derive(Debug)]
pub(crate) struct Listed {
    board: Arc<InFlight>,
    id: u64,
    entry: Arc<Entry>,
}

impl Listed {
    /// One more streamed event.
    pub(crate) fn streamed(&self) {
        self.entry.streamed.fetch_add(1, Ordering::Relaxed);
    }

    /// Its stream was cut and is being continued.
    pub(crate) fn resumed(&self) {
        self.entry.resumed.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.board.entries.lock().expect("in-flight lock").remove(&self.id);
    }
}

impl InFlight {
    pub(crate) fn enter(self: &Arc<Self>, s: Sending<'_>) -> Listed {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            request_id: s.request_id.to_owned(),
            key: s.key.to_owned(),
            route: s.route,
            group: s.group.to_owned(),
            model: s.model.to_owned(),
            prompt_estimate: s.prompt_estimate,
            streamed: AtomicU32::new(0),
            resumed: AtomicU32::new(0),
            since: Instant::now(),
        });
        self.entries.lock().expect("in-flight lock").insert(id, entry.clone());
        Listed {
            board: self.clone(),
            id,
            entry,
        }
    }

    fn oldest_first(&self) -> Vec<Arc<Entry>> {
        let mut entries: Vec<Arc<Entry>> = self.entries.lock().expect("in-flight lock").values().cloned().collect();
        entries.sort_by_key(|e| e.since);
        entries
    }

    /// The list as JSON objects, oldest first (`/admin/requests`).
    pub(crate) fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .oldest_first()
            .iter()
            .map(|e| {
                json!({
                    "request_id": e.request_id,
                    "key": e.key,
                    "route": e.route,
                    "group": e.group,
                    "model": e.model,
                    "prompt_tokens_estimate": e.prompt_estimate,
                    "streamed_events": e.streamed.load(Ordering::Relaxed),
                    "resumed": e.resumed.load(Ordering::Relaxed),
                    "elapsed_s": (e.since.elapsed().as_secs_f64() * 10.0).round() / 10.0,
                })
            })
            .collect();
        Value::Array(rows)
    }

    /// The list as a tab-separated table, oldest first.
    pub(crate) fn report(&self) -> String {
        let entries = self.oldest_first();
        let mut out = String::from("request_id\tkey\troute\tgroup\tprompt_tokens_estimate\tstreamed_events\tage_s\n");
        for e in entries {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{:.1}",
                e.request_id,
                e.key,
                e.route,
                e.group,
                e.prompt_estimate,
                e.streamed.load(Ordering::Relaxed),
                e.since.elapsed().as_secs_f64()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_listed_until_its_place_is_dropped() {
        let board = Arc::new(InFlight::default());
        let listed = board.enter(Sending {
            request_id: "chatcmpl-1",
            key: "alice",
            route: "chat",
            group: "main",
            model: "m",
            prompt_estimate: 12,
        });
        listed.streamed();
        listed.streamed();
        listed.resumed();
        let rows = board.json();
        assert_eq!(rows[0]["key"], "alice");
        assert_eq!(
            (rows[0]["streamed_events"].as_u64(), rows[0]["resumed"].as_u64()),
            (Some(2), Some(1))
        );
        let report = board.report();
        let row = report.lines().nth(1).expect("one row");
        assert!(row.starts_with("chatcmpl-1\talice\tchat\tmain\t12\t2\t"), "{report}");
        drop(listed);
        assert_eq!(board.report().lines().count(), 1, "only the header is left");
    }
}
