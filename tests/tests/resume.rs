//! Generations that lose their rank group (docs/resume.md), in front of supervised vllm-sim
//! ranks: a non-streaming request in flight when rank 0 is SIGKILLed is sent again once the
//! group is Ready and answered 200 — the same answer as without the fault, since nothing of
//! it had reached the client.

use serde_json::{json, Value};
use sparkgate_tests::http::request;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0})
}

fn rank0_pid(status: &Value) -> u32 {
    status["supervisor"]["ranks"]
        .as_array()
        .and_then(|ranks| ranks.iter().find(|r| r["rank"] == 0).or(ranks.first()))
        .and_then(|r| r["pid"].as_u64())
        .expect("rank 0's pid in /admin/status") as u32
}

/// The answer's text, without what differs between two runs (ids, times).
fn text_of(body: &Value) -> (Value, Value, Value) {
    let message = &body["choices"][0]["message"];
    (
        message["content"].clone(),
        message["reasoning"].clone(),
        body["choices"][0]["finish_reason"].clone(),
    )
}

#[test]
fn a_non_streaming_request_in_flight_at_sigkill_of_rank_0_answers_200() {
    // Slow decoding: the request is still inside vLLM when its rank dies.
    let gw = TestGateway::builder(SIM).envs(&[("SIM_SPEED", "1")]).start();
    let body = chat("explain tensor parallelism", 200);
    let addr = gw.addr;
    let post = move |b: &Value| {
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", "application/json")],
            b.to_string().as_bytes(),
        )
    };
    let clean = post(&body);
    assert_eq!(clean.status, 200, "{}", clean.text());

    let status = gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let pid = rank0_pid(&status);
    let in_flight = {
        let body = body.clone();
        std::thread::spawn(move || post(&body))
    };
    gw.wait_status("the request running", |s| s["admission"]["in_flight"] == 1);
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let r = in_flight.join().unwrap();
    assert_eq!(
        r.status,
        200,
        "re-run after the restart: {}\n{}",
        r.text(),
        gw.proc.log().join("\n")
    );
    assert_eq!(
        text_of(&r.json()),
        text_of(&clean.json()),
        "the same answer as without the fault"
    );
    let s = gw.wait_status("serving again", |s| s["supervisor"]["state"] == "ready");
    assert_eq!(s["supervisor"]["restarts"], 1, "one restart: {s}");
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.lines().any(|l| l == "sparkgate_poison_suspects_total 1"),
        "vLLM held the request when its rank died (a suspect, then answered):\n{metrics}"
    );
}
