//! The shutdown contract (DESIGN.md) from outside: on SIGTERM queued requests are answered 503
//! with Retry-After at once; in-flight requests get DRAIN_TIMEOUT; past it every open stream
//! ends with its route's in-stream error (OpenAI: error chunk + `[DONE]`; Anthropic:
//! `event: error`) and every unanswered request with 503 — each logged as what it was.

use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::http::{post_json, request, Streaming};
use sparkgate_tests::sse;

mod common;
use common::ds_pair;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn long_chat(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}],
           "max_tokens": 4000, "ignore_eos": true, "stream": stream,
           "chat_template_kwargs": {"enable_thinking": false}})
}

fn open_stream(addr: std::net::SocketAddr, path: &str, body: &Value) -> Streaming {
    let mut s = Streaming::post_json(addr, path, body);
    assert!(s.next_chunk().is_some(), "{path} streams");
    s
}

#[test]
fn sigterm_answers_the_queue_at_once_and_ends_what_outlives_the_drain_with_an_error() {
    let (sim, mut gw) = ds_pair(
        &[("SIM_SPEED", "1")],
        &[("DRAIN_TIMEOUT", "3"), ("MAX_NUM_SEQS", "3"), ("QUEUE_TIMEOUT", "300")],
    );
    let mut chat = open_stream(gw.addr, "/v1/chat/completions", &long_chat(true));
    let messages = json!({"model": MODEL, "max_tokens": 4000, "stream": true,
                          "messages": [{"role": "user", "content": "Explain tensor parallel inference."}]});
    let mut anthropic = open_stream(gw.addr, "/v1/messages", &messages);
    let addr = gw.addr;
    let running = std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &long_chat(false)));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while request(gw.addr, "GET", "/admin/status", &[], b"").json()["admission"]["in_flight"] != 3 {
        assert!(std::time::Instant::now() < deadline, "three requests run");
        std::thread::sleep(Duration::from_millis(10));
    }
    let queued: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &long_chat(false))))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while request(gw.addr, "GET", "/admin/status", &[], b"").json()["admission"]["queued"] != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "two requests queue behind three running"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        sim.state()["running"].as_u64().unwrap() + sim.state()["waiting"].as_u64().unwrap(),
        3
    );

    gw.proc.terminate();
    // The queued requests are answered while the streams still run (not after the drain).
    for q in queued {
        let r = q.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.header("retry-after").is_some(), "503 with Retry-After");
        assert!(
            r.json()["error"]["message"].as_str().unwrap().contains("shutting down"),
            "{}",
            r.text()
        );
    }
    assert!(chat.next_chunk().is_some(), "the stream still runs during the drain");

    // Past DRAIN_TIMEOUT: each open request ends with its route's explicit error.
    let text = String::from_utf8(chat.read_all()).unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
    let events = sse::events(text.as_bytes());
    let last = events.iter().rev().nth(1).map_or("", |e| e.data.as_str());
    assert!(last.contains("\"error\"") && last.contains("DRAIN_TIMEOUT"), "{last}");
    let events = sse::events(&anthropic.read_all());
    let last = events.last().expect("an event");
    assert_eq!(last.event, "error", "{last:?}");
    let e: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "overloaded_error", "{e}");
    let r = running.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.json()["error"]["message"].as_str().unwrap().contains("DRAIN_TIMEOUT"),
        "{}",
        r.text()
    );

    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
    let log = gw.proc.log().join("\n");
    assert_eq!(
        log.matches("outcome=\"drain_timeout\"").count() + log.matches("outcome=drain_timeout").count(),
        3,
        "{log}"
    );
    assert!(
        !log.contains("client_disconnected"),
        "a cut stream is logged as what it was:\n{log}"
    );
}
