//! Per-key usage in front of the real vLLM 0.33.0 frontend (the reference fixture): the counts are
//! vLLM's own usage — a chat stream whose client did not ask for usage is counted from the usage
//! the gateway asked vLLM for and kept from the client, equal to what the same request answered
//! whole reports — and Messages and Responses streams are counted as their clients received them.

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const HEADERS: [(&str, &str); 2] = [
    ("Content-Type", "application/json"),
    ("Authorization", "Bearer sk-real-1"),
];

fn counts(u: &Value) -> (u64, u64) {
    let n = |a: &str, b: &str| u[a].as_u64().or_else(|| u[b].as_u64());
    (
        n("prompt_tokens", "input_tokens").unwrap_or(0),
        n("completion_tokens", "output_tokens").unwrap_or(0),
    )
}

/// What a stream's client received: its events' last counts (none: zeros).
fn streamed(gw: &Gateway, path: &str, body: &Value) -> ((u64, u64), bool) {
    let mut s = Streaming::open(gw.addr, "POST", path, &HEADERS, body.to_string().as_bytes());
    assert_eq!(s.status, 200);
    let (mut p, mut c, mut any) = (0, 0, false);
    for e in sparkgate_tests::sse::events(&s.read_all()) {
        let v = sparkgate_tests::sse::json(&e);
        for u in [&v["usage"], &v["response"]["usage"], &v["message"]["usage"]] {
            if u.is_object() {
                any = true;
                let (up, uc) = counts(u);
                p = if u.get("prompt_tokens").or(u.get("input_tokens")).is_some() {
                    up
                } else {
                    p
                };
                c = if u.get("completion_tokens").or(u.get("output_tokens")).is_some() {
                    uc
                } else {
                    c
                };
            }
        }
    }
    ((p, c), any)
}

#[test]
fn usage_is_vllms_own_and_equals_what_the_clients_received() {
    let real = RealVllm::start(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash);
    let state = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream(real.addr)
        .env("API_KEYS", "real=sk-real-1")
        .env("STORE_URL", &state.path().join("state.sqlite").display().to_string())
        .start();
    let chat =
        json!({"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 24, "temperature": 0});
    let whole = request(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &HEADERS,
        chat.to_string().as_bytes(),
    );
    assert_eq!(whole.status, 200, "{}", whole.text());
    let one = counts(&whole.json()["usage"]);
    let mut asked_none = chat.clone();
    asked_none["stream"] = json!(true);
    let (got, any) = streamed(&gw, "/v1/chat/completions", &asked_none);
    assert!(!any, "a client that did not ask gets no usage: {got:?}");
    let messages =
        json!({"max_tokens": 24, "stream": true, "messages": [{"role": "user", "content": "Name two lakes."}]});
    let (m, _) = streamed(&gw, "/v1/messages", &messages);
    let responses = json!({"input": "Name a sea.", "max_output_tokens": 200, "stream": true});
    let (r, _) = streamed(&gw, "/v1/responses", &responses);
    assert!(m.1 > 0 && r.1 > 0, "{m:?} {r:?}");
    let u = request(gw.addr, "GET", "/admin/usage?window=all&key=real", &[], b"").json();
    let total = &u["total"];
    // The unasked stream is the same request as the whole one: vLLM reports the same usage.
    let expected = (one.0 * 2 + m.0 + r.0, one.1 * 2 + m.1 + r.1);
    assert_eq!(
        (total["prompt"].as_u64().unwrap(), total["completion"].as_u64().unwrap()),
        expected,
        "{u:#}"
    );
    assert_eq!(total["requests"], 4);
    assert_eq!(total["errors"], 0);
}
