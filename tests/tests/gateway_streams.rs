//! The gateway's streaming relay against vllm-sim: byte-for-byte fidelity over 1000 random
//! streams, a killed rank, a hung upstream, and upstream error events.

use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{post_json, request, sse_data, Streaming};

mod common;
use common::{chat, ds_pair, SIM};
use sparkgate_tests::test_gateway::TestGateway;

/// Masks the `"created":<seconds>` field, the one value that differs between two identical runs.
fn mask_created(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("\"created\":") {
        out.push_str(&rest[..i + 10]);
        rest = &rest[i + 10..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        out.push('T');
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

#[test]
fn streams_are_byte_faithful_to_what_vllm_would_send() {
    let sim = Sim::start(
        SIM,
        &[
            "/model",
            "--served-model-name",
            "M",
            "--reasoning-parser",
            "deepseek_v41",
            "--max-num-seqs",
            "8",
        ],
        &[],
    );
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .envs(&[("SERVED_MODEL_NAME", "M"), ("MAX_NUM_SEQS", "8")])
        .start();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut injected = 0;
    for i in 0..1000 {
        let mut body = json!({"model": "M", "messages": [{"role": "user", "content": format!("question {} about {}", next(1000), i)}],
                              "max_tokens": 1 + next(60), "stream": true});
        match next(4) {
            0 => body["stream_options"] = json!({"include_usage": true}),
            1 => body["chat_template_kwargs"] = json!({"enable_thinking": false}),
            2 => body["reasoning_effort"] = json!("low"),
            _ => {}
        }
        if next(10) == 0 {
            body["n"] = json!(2);
        }
        let id = format!("faithful-{i}");
        let headers = [("Content-Type", "application/json"), ("X-Request-Id", id.as_str())];
        let direct = request(
            sim.addr(),
            "POST",
            "/v1/chat/completions",
            &headers,
            body.to_string().as_bytes(),
        );
        let via = request(
            gw.addr,
            "POST",
            "/v1/chat/completions",
            &headers,
            body.to_string().as_bytes(),
        );
        assert_eq!(via.status, 200);
        assert_eq!(via.header("content-type"), direct.header("content-type"));
        assert_eq!(
            mask_created(&via.text()),
            mask_created(&direct.text()),
            "request {i}: {body}"
        );
        if body.get("stream_options").is_none() {
            injected += 1;
        }
    }
    assert!(
        injected > 600,
        "most requests exercised the injected usage chunk ({injected})"
    );
}

#[test]
fn a_rank_killed_mid_stream_ends_the_stream_with_an_error_event() {
    // Nothing restarts an upstream the gateway only fronts: with resuming off (RESUME_TIMEOUT=0)
    // the cut ends the stream at once, instead of a wait for the upstream's return.
    let (mut sim, gw) = ds_pair(&[("SIM_SPEED", "1")], &[("RESUME_TIMEOUT", "0")]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut s = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    let mut got = s.next_chunk().unwrap();
    got.extend(s.next_chunk().unwrap());
    sim.proc.kill();
    got.extend(s.read_all());
    let events = sse_data(&got);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], 502, "{err}");
    // The gateway now answers 502 (upstream gone, nobody restarting it) and /ready says why.
    let r = chat(&gw, json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 502);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ready = request(gw.addr, "GET", "/ready", &[], b"");
        if ready.status == 503 {
            assert_eq!(ready.json()["state"], "unreachable");
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hung_upstream_ends_the_stream_after_the_idle_timeout() {
    let (sim, gw) = ds_pair(
        &[("SIM_SPEED", "1")],
        &[("STREAM_IDLE_TIMEOUT", "1"), ("FIRST_TOKEN_TIMEOUT", "1")],
    );
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut s = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    let mut got = s.next_chunk().unwrap();
    sim.fault("/fault/hang");
    got.extend(s.read_all());
    let events = sse_data(&got);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], 504);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("STREAM_IDLE_TIMEOUT"),
        "{err}"
    );
    // The gateway dropped the upstream request: vLLM sees the abort once it steps again.
    sim.fault("/fault/clear");
    sim.wait_state("aborted", |s| s["aborted"] == 1);
    // A hang before the first token hits FIRST_TOKEN_TIMEOUT.
    sim.fault("/fault/hang");
    let r = post_json(gw.addr, "/v1/chat/completions", &body);
    let events = sse_data(&r.body);
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("FIRST_TOKEN_TIMEOUT"),
        "{err}"
    );
    sim.fault("/fault/clear");
}

#[test]
fn upstream_error_events_pass_through_unchanged() {
    let (sim, gw) = ds_pair(&[], &[]);
    sim.fault("/fault/stream-error?after_tokens=2");
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 20}),
    );
    let events = sse_data(&r.body);
    assert_eq!(
        events[events.len() - 2],
        r#"{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}"#
    );
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}),
    );
    assert_eq!(r.status, 500, "upstream errors pass through with their status");
    assert_eq!(r.json()["error"]["type"], "InternalServerError");
}
