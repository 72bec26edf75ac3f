//! The warm-replay scenario (WARM_REPLAY_BYTES, docs/resume.md): a long conversation's first
//! turn, the group restarted, then the conversation's next turn — shared by the test (how much
//! of the next turn's prompt was cached) and the benchmark (its time to first token).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::Gateway;
use crate::http::{post_json, request, Streaming};
use crate::sse;

/// What the next turn after the restart found.
#[derive(Debug, Clone, Copy)]
pub struct NextTurn {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub ttft: Duration,
}

/// The first turn: a system prompt of about `words` words and a question.
fn first_turn(words: usize) -> Value {
    const VOCAB: [&str; 8] = [
        "tensor", "parallel", "decode", "expert", "cache", "prefix", "rank", "group",
    ];
    let system: Vec<&str> = (0..words).map(|i| VOCAB[(i * 7 + i / 8) % VOCAB.len()]).collect();
    json!({"messages": [{"role": "system", "content": system.join(" ")},
                        {"role": "user", "content": "Summarise the notes."}],
           "max_tokens": 8, "temperature": 0, "chat_template_kwargs": {"enable_thinking": false}})
}

/// Runs the scenario on `gw` (a gateway over supervised vllm-sim ranks); `warmed` waits for the
/// warm replay to have run before the next turn is sent.
pub fn next_turn_after_restart(gw: &Gateway, words: usize, warmed: bool) -> NextTurn {
    let mut body = first_turn(words);
    let first = post_json(gw.addr, "/v1/chat/completions", &body);
    assert_eq!(first.status, 200, "{}", first.text());
    let answer = first.json()["choices"][0]["message"]["content"].clone();
    let epoch = gw.status()["supervisor"]["epoch"].clone();
    let restart = request(gw.addr, "POST", "/admin/restart", &[], b"");
    assert!(restart.status < 300, "restart: {}", restart.text());
    gw.wait_status("serving a new epoch", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] != epoch && s["ready"] == true
    });
    if warmed {
        wait_for_metric(gw, "sparkgate_warm_replays_total{outcome=\"warmed\"} 1");
    }
    let messages = body["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "And the next step?"}));
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let sent = Instant::now();
    let mut s = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    let (mut raw, mut ttft) = (Vec::new(), None);
    while let Some(chunk) = s.next_chunk() {
        raw.extend(chunk);
        ttft = ttft.or_else(|| has_token(&raw).then(|| sent.elapsed()));
    }
    let usage = sse::events(&raw)
        .iter()
        .filter(|e| !sse::is_done(e))
        .map(sse::json)
        .find(|c| c["usage"].is_object())
        .map(|c| c["usage"].clone())
        .unwrap_or_else(|| panic!("a usage chunk: {}", String::from_utf8_lossy(&raw)));
    NextTurn {
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        ttft: ttft.expect("a token"),
    }
}

/// Whether a chunk with generated text has arrived.
fn has_token(raw: &[u8]) -> bool {
    sse::events(raw).iter().filter(|e| !sse::is_done(e)).any(|e| {
        let delta = &sse::json(e)["choices"][0]["delta"];
        ["content", "reasoning"]
            .iter()
            .any(|k| delta[*k].as_str().is_some_and(|t| !t.is_empty()))
    })
}

/// Polls `/metrics` until it has the line `line`.
fn wait_for_metric(gw: &Gateway, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = request(gw.addr, "GET", "/metrics", &[], b"").text();
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {line}:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
