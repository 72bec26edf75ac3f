//! Warm caches after a restart (WARM_REPLAY_BYTES, opt-in): the last request of each recent
//! conversation is kept (by its prefix key, within a byte budget), and once a group serves a new
//! epoch the most recent ones are sent to it with one token to generate — one at a time, only
//! while nothing waits in the queue and nothing runs on the group — so the next turn of a long
//! conversation finds its prefix in the new engine's cache instead of prefilling it again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use metrics::counter;
use serde_json::{json, Map, Value};

use super::group::Group;
use super::prefix::prefix_key;
use crate::control::admission::Admission;
use crate::observe;

/// How long a replay waits for its group to be idle before the rest are given up.
const IDLE_WAIT: Duration = Duration::from_secs(60);
/// How often an idle check is made while the group is busy.
const POLL: Duration = Duration::from_millis(50);
/// A replay's answer must come within this.
const ANSWER_WITHIN: Duration = Duration::from_secs(600);

/// One conversation's last request, as its replay sends it.
#[derive(Debug, Clone)]
struct Entry {
    key: u64,
    path: &'static str,
    body: Bytes,
}

/// The recent conversations, the most recent last.
#[derive(Debug)]
pub(crate) struct Warm {
    budget: usize,
    entries: Mutex<(VecDeque<Entry>, usize)>,
}

impl Warm {
    /// `None` when the budget is 0 (the knob's off).
    pub(crate) fn new(budget: usize) -> Option<Arc<Warm>> {
        (budget > 0).then(|| {
            Arc::new(Warm {
                budget,
                entries: Mutex::new((VecDeque::new(), 0)),
            })
        })
    }

    /// Keeps `forward` (a request answered on `path`) as its conversation's latest, dropping the
    /// oldest conversations past the budget.
    pub(crate) fn remember(&self, path: &'static str, forward: &[u8]) {
        let (Some(key), Some(body)) = (prefix_key(forward), one_token(path, forward)) else {
            return;
        };
        if body.len() > self.budget {
            return;
        }
        let mut guard = self.entries.lock().expect("warm lock");
        let (entries, bytes) = &mut *guard;
        if let Some(at) = entries.iter().position(|e| e.key == key) {
            let old = entries.remove(at).expect("found");
            *bytes -= old.body.len();
        }
        *bytes += body.len();
        entries.push_back(Entry { key, path, body });
        while *bytes > self.budget {
            let Some(old) = entries.pop_front() else { break };
            *bytes -= old.body.len();
        }
    }

    /// The kept requests, the most recent first.
    fn hottest(&self) -> Vec<Entry> {
        let guard = self.entries.lock().expect("warm lock");
        guard.0.iter().rev().cloned().collect()
    }

    /// Sends the kept requests to `group` while it serves `epoch` and is idle.
    async fn replay(&self, group: &Arc<Group>, admission: &Arc<Admission>, epoch: u64) {
        let entries = self.hottest();
        let deadline = tokio::time::Instant::now() + IDLE_WAIT;
        for (n, entry) in entries.iter().enumerate() {
            let slots = loop {
                if group.epoch() != Some(epoch) || tokio::time::Instant::now() >= deadline {
                    return;
                }
                if let Some(slots) = idle_slots(group, admission, entry.body.len()) {
                    break slots;
                }
                tokio::time::sleep(POLL).await;
            };
            let request_id = format!("warm-{epoch}-{n}");
            let outcome = match send(group, entry, &request_id).await {
                Ok(()) => "warmed",
                Err(why) => {
                    tracing::warn!(%request_id, %why, "warm replay failed");
                    "failed"
                }
            };
            drop(slots);
            counter!(observe::WARM_REPLAYS, "outcome" => outcome).increment(1);
        }
    }
}

/// Sends one kept request and reads its answer.
async fn send(group: &Group, entry: &Entry, request_id: &str) -> Result<(), String> {
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let sent = group
        .upstream
        .send(Method::POST, entry.path, &headers, request_id, entry.body.clone());
    let answer = async {
        let resp = sent.await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
        }
    };
    tokio::time::timeout(ANSWER_WITHIN, answer)
        .await
        .map_err(|_| format!("no answer within {}s", ANSWER_WITHIN.as_secs()))?
}

/// A slot on `group` for a replay, when nothing waits in the queue and nothing runs on the
/// group: the lowest priority there is.
fn idle_slots(group: &Arc<Group>, admission: &Arc<Admission>, bytes: usize) -> Option<impl Send> {
    let snap = admission.snapshot();
    if snap.queued > 0 || group.in_use() > 0 {
        return None;
    }
    // Granted at once or not at all: a replay never waits in the queue.
    let permit = admission.try_now(1, bytes, group.model)?;
    let lease = group.try_lease(1)?;
    Some((permit, lease))
}

/// The request as a replay sends it: one token to generate, not streamed.
fn one_token(path: &str, forward: &[u8]) -> Option<Bytes> {
    let mut body: Map<String, Value> = serde_json::from_slice(forward).ok()?;
    for key in ["stream", "stream_options", "max_completion_tokens", "return_token_ids"] {
        body.remove(key);
    }
    let max = if path == "/v1/responses" {
        "max_output_tokens"
    } else {
        "max_tokens"
    };
    body.insert(max.into(), json!(1));
    serde_json::to_vec(&body).ok().map(Bytes::from)
}

/// Follows `group`'s supervisor: each epoch it serves after the first is warmed.
pub(crate) fn keep_warm(warm: Arc<Warm>, group: Arc<Group>, admission: Arc<Admission>) {
    let Some(sup) = group.supervisor.clone() else { return };
    sparkgate_task::spawn("warm-replay", async move {
        let mut rx = sup.subscribe();
        let mut served: Option<u64> = None;
        loop {
            let serving = {
                let s = rx.borrow_and_update();
                s.is_serving().then_some(s.epoch)
            };
            if let Some(epoch) = serving.filter(|e| served != Some(*e)) {
                if served.is_some() {
                    warm.replay(&group, &admission, epoch).await;
                }
                served = Some(epoch);
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(first: &str, turn: usize) -> Vec<u8> {
        let mut messages = vec![json!({"role": "user", "content": first})];
        for t in 0..turn {
            messages.push(json!({"role": "assistant", "content": format!("a{t}")}));
            messages.push(json!({"role": "user", "content": format!("u{t}")}));
        }
        json!({"model": "m", "messages": messages, "stream": true, "max_tokens": 900})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn each_conversation_keeps_its_latest_turn_and_the_oldest_go_past_the_budget() {
        let one = one_token("/v1/chat/completions", &chat("x", 0)).unwrap().len();
        let warm = Warm::new(one * 3 + 40).unwrap();
        warm.remember("/v1/chat/completions", &chat("a", 0));
        warm.remember("/v1/chat/completions", &chat("b", 0));
        warm.remember("/v1/chat/completions", &chat("a", 1));
        let hot = warm.hottest();
        assert_eq!(hot.len(), 2, "one entry per conversation");
        let first: Value = serde_json::from_slice(&hot[0].body).unwrap();
        assert_eq!(first["messages"].as_array().unwrap().len(), 3, "a's latest turn, first");
        assert_eq!(first["max_tokens"], 1);
        assert!(first.get("stream").is_none());
        warm.remember("/v1/chat/completions", &chat("c", 0));
        warm.remember("/v1/chat/completions", &chat("d", 0));
        let keys: Vec<u64> = warm.hottest().iter().map(|e| e.key).collect();
        assert!(keys.len() <= 3, "{keys:?}");
        assert!(
            !keys.contains(&prefix_key(&chat("b", 0)).unwrap()),
            "the oldest went first"
        );
    }

    #[test]
    fn a_responses_replay_asks_for_one_output_token() {
        let body = json!({"model": "m", "input": "hi", "stream": true}).to_string();
        let out: Value = serde_json::from_slice(&one_token("/v1/responses", body.as_bytes()).unwrap()).unwrap();
        assert_eq!(out["max_output_tokens"], 1);
        assert!(Warm::new(0).is_none(), "0 keeps none");
    }
}
