//! The interactive reserve against vllm-sim behind the gateway (MAX_NUM_SEQS 2, one slot held):
//! long requests alone take both slots; once a chat client is active a second long request
//! waits while the chats get the held slot, and goes at LONG_MAX_WAIT_S; rank 0 never holds more
//! than the cap (vllm-sim's own count of the most requests it held at once).

use std::thread;

use serde_json::{json, Value};
use sparkgate_tests::harness::{Gateway, Sim};
use sparkgate_tests::http::{request, HttpResponse};
use sparkgate_tests::test_gateway::TestGateway;

mod common;
use common::{DS, SIM};

/// A prompt of about 2 000 estimated tokens (its bytes / 4): long above LONG_PROMPT_TOKENS=500.
fn long_body() -> Value {
    json!({"messages": [{"role": "user", "content": "the ".repeat(2_000)}], "max_tokens": 200, "ignore_eos": true,
           "chat_template_kwargs": {"enable_thinking": false}})
}

fn chat_body() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
           "chat_template_kwargs": {"enable_thinking": false}})
}

/// A paced rank (each long request runs a few seconds) and a gateway holding one slot back.
fn pair(max_wait_s: &str) -> (Sim, Gateway) {
    let sim = Sim::start(SIM, DS, &[("SIM_SPEED", "1")]);
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .envs(&[
            ("MAX_NUM_SEQS", "2"),
            ("INTERACTIVE_RESERVE", "1"),
            ("LONG_PROMPT_TOKENS", "500"),
            ("INTERACTIVE_ACTIVE_S", "600"),
            ("LONG_MAX_WAIT_S", max_wait_s),
        ])
        .start();
    (sim, gw)
}

/// A chat completion sent as client `who` (`x-sparkgate-client`).
fn post_as(addr: std::net::SocketAddr, who: &str, body: &Value) -> HttpResponse {
    let headers = [("Content-Type", "application/json"), ("x-sparkgate-client", who)];
    request(
        addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    )
}

fn long_in_background(gw: &Gateway) -> thread::JoinHandle<u16> {
    let addr = gw.addr;
    thread::spawn(move || post_as(addr, "heavy", &long_body()).status)
}

fn admission(gw: &Gateway) -> (u64, u64) {
    let s = gw.status();
    let a = &s["admission"];
    (a["in_flight"].as_u64().unwrap(), a["queued"].as_u64().unwrap())
}

#[test]
fn long_requests_alone_take_every_slot() {
    let (sim, gw) = pair("600");
    let longs = [long_in_background(&gw), long_in_background(&gw)];
    gw.wait_status("both long requests running", |s| s["admission"]["in_flight"] == 2);
    for l in longs {
        assert_eq!(l.join().unwrap(), 200);
    }
    assert_eq!(sim.state()["peak_in_flight"], 2, "nobody else around: both slots");
}

#[test]
fn a_chat_gets_the_held_slot_while_a_long_request_waits_and_the_long_request_goes_at_its_max_wait() {
    let (sim, gw) = pair("4");
    // A chat client is active: long requests now leave one slot free.
    assert_eq!(post_as(gw.addr, "chat", &chat_body()).status, 200);
    let first = long_in_background(&gw);
    gw.wait_status("the first long request running", |s| s["admission"]["in_flight"] == 1);
    let second = long_in_background(&gw);
    gw.wait_status("the second held back", |s| s["admission"]["queued"] == 1);
    assert_eq!(admission(&gw), (1, 1), "one slot free, held for the chats");
    let chat = post_as(gw.addr, "chat", &chat_body());
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert_eq!(admission(&gw).1, 1, "answered while the long request still waits");
    // Nothing starves: at LONG_MAX_WAIT_S the held long request takes the reserved slot.
    gw.wait_status("the second long request running", |s| s["admission"]["in_flight"] == 2);
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(second.join().unwrap(), 200);
    let peak = sim.state()["peak_in_flight"].as_u64().unwrap();
    assert!(peak <= 2, "rank 0 held {peak} requests at once, over the cap");
}
