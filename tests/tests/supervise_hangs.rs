//! Hangs seen in seconds (RUNTIME=process, vllm-sim ranks, STALL_TIMEOUT=10): the engine
//! heartbeat — rank 0's `vllm:iteration_tokens_total` count, which a long chunked prefill keeps
//! moving — tells a long prefill from a hang; a stopped worker (SIGSTOP rank 1) during a prefill
//! and a stopped rank 0 during decoding are each a restart within STALL_TIMEOUT + 5 s, `/ready`
//! says "stalled" meanwhile, and requests that wait are served by the new group.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{post_json, request, Streaming};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const STALL: &[(&str, &str)] = &[("STALL_TIMEOUT", "10"), ("SIM_SPEED", "1")];

fn vllm_addr(gw: &Gateway) -> SocketAddr {
    let port = gw.upstream_port();
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Rank 0's engine step count and running requests, from its own `/metrics`.
fn engine(rank0: SocketAddr) -> (f64, f64) {
    let text = request(rank0, "GET", "/metrics", &[], b"").text();
    let value = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (
        value("vllm:iteration_tokens_total_count"),
        value("vllm:num_requests_running"),
    )
}

/// A prompt whose prefill takes about `seconds` at SIM_SPEED=1 (DeepSeek's simulated 970
/// prompt tokens/s), measured with the gateway's own `/tokenize`.
fn long_prompt(gw: &Gateway, seconds: f64) -> String {
    let unit = "Tensor parallel inference splits every layer across the ranks of a group. ";
    let tokens = |text: &str| {
        let r = post_json(gw.addr, "/tokenize", &json!({"prompt": text}));
        r.json()["count"].as_f64().unwrap_or_else(|| panic!("{}", r.text()))
    };
    let repeat = (seconds * 970.0 / tokens(unit)).ceil() as usize;
    unit.repeat(repeat)
}

fn long_prefill_request(gw: &Gateway, seconds: f64) -> Value {
    json!({"messages": [{"role": "user", "content": long_prompt(gw, seconds)}], "max_tokens": 4,
           "chat_template_kwargs": {"enable_thinking": false}})
}

fn short_request() -> Value {
    json!({"messages": [{"role": "user", "content": "What is 17*19?"}], "max_tokens": 8,
           "chat_template_kwargs": {"enable_thinking": false}})
}

/// Waits until `/ready` says the group is stalled (admission holds from then on).
fn wait_stalled(gw: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = request(gw.addr, "GET", "/ready", &[], b"");
        if ready.json()["state"] == "stalled" {
            assert_eq!(ready.status, 503);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never stalled: {}\n{}",
            ready.text(),
            gw.proc.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for the group's next epoch to be ready.
fn restarted(gw: &Gateway, epoch: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let s = gw.status();
        if s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"].as_u64() > Some(epoch) {
            return s;
        }
        assert!(Instant::now() < deadline, "no restart: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A request sent while the group is stalled: it waits in the gateway's queue.
fn send_while_stalled(gw: &Gateway) -> std::thread::JoinHandle<sparkgate_tests::http::HttpResponse> {
    wait_stalled(gw);
    let addr = gw.addr;
    std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &short_request()))
}

fn assert_detected_within_stall_timeout(status: &Value) {
    let last = &status["supervisor"]["last_restart"];
    let detected = last["detected_in_s"].as_f64().unwrap_or(f64::MAX);
    assert!(
        detected <= 15.0,
        "detected {detected} s after the last sign of life: {status}"
    );
    assert!(
        detected >= 5.0,
        "counted from the last progress, not from noticing: {status}"
    );
}

#[test]
fn a_long_chunked_prefill_is_not_a_stall() {
    let gw = TestGateway::builder(SIM).envs(STALL).start();
    let body = long_prefill_request(&gw, 20.0);
    let r = post_json(gw.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["usage"]["prompt_tokens"].as_u64() > Some(15_000),
        "{}",
        r.text()
    );
    let s = gw.status();
    assert_eq!(
        s["supervisor"]["epoch"], 1,
        "twice STALL_TIMEOUT of prefill is no hang: {s}"
    );
    assert_eq!(s["supervisor"]["restarts"], 0);
}

/// What the stopped rank was doing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Work {
    /// A 30 s prefill (chunked, so rank 0's step count moves until the stop).
    Prefill,
    Decode,
}

/// SIGSTOPs `rank` while a stream does `work`: within STALL_TIMEOUT + 5 s (counted from the last
/// sign of life) the group restarts, `/ready` says stalled meanwhile so a request sent then
/// waits in the queue and is served by the new group, and the stream on the hung group ends
/// with its error event.
fn stopped_rank_is_restarted(rank: u64, work: Work) {
    let gw = TestGateway::builder(SIM).envs(STALL).start();
    let rank0 = vllm_addr(&gw);
    let mut body = match work {
        Work::Prefill => long_prefill_request(&gw, 30.0),
        Work::Decode => json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}],
                               "max_tokens": 4000, "ignore_eos": true,
                               "chat_template_kwargs": {"enable_thinking": false}}),
    };
    body["stream"] = json!(true);
    let (steps, _) = engine(rank0);
    let mut stream = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine(rank0).0 < steps + 2.0 {
        assert!(Instant::now() < deadline, "the engine steps ({work:?})");
        std::thread::sleep(Duration::from_millis(50));
    }
    if work == Work::Prefill {
        assert_eq!(engine(rank0).1, 1.0, "the prefill runs");
    }
    gw.signal_rank(rank, "-STOP");
    let waiting = send_while_stalled(&gw);
    let status = restarted(&gw, 1);
    assert_detected_within_stall_timeout(&status);
    // The stall is logged when it begins (a WARN; then every 10 s while it lasts), not once a
    // second.
    let log = gw.proc.log();
    let lines = sparkgate_tests::logevents::parse(&log);
    let stalled = sparkgate_tests::logevents::named(&lines, "stalled");
    let stall_lines = stalled.len() + sparkgate_tests::logevents::named(&lines, "still_stalled").len();
    assert!(
        stalled.len() == 1 && stalled[0].level == "WARN" && stall_lines <= 2,
        "{stall_lines} lines on the stall:\n{}",
        log.join("\n")
    );
    if rank == 1 {
        let reason = status["supervisor"]["last_restart"]["reason"].as_str().unwrap();
        assert!(
            reason.contains("STALL_TIMEOUT"),
            "rank 0 answers, the heartbeat saw it: {reason}"
        );
    }
    let r = waiting.join().unwrap();
    assert_eq!(
        r.status,
        200,
        "the waiting request is served by the new group: {}",
        r.text()
    );
    let text = String::from_utf8_lossy(&stream.read_all()).into_owned();
    let events = sse::events(text.as_bytes());
    // Cut by the restart, it is continued on the new group (docs/resume.md): it finishes, with
    // no error event and no token id the client did not ask for.
    assert!(
        !events
            .iter()
            .any(|e| e.data.contains("\"error\"") || e.data.contains("token_ids\":["))
            && events.iter().any(|e| e.data.contains("\"finish_reason\":\""))
            && events.last().is_some_and(sse::is_done),
        "the stream on the hung group is continued on the new one: {}",
        &text[text.len().saturating_sub(500)..]
    );
}

#[test]
fn a_stopped_rank0_during_a_prefill_is_restarted_within_stall_timeout() {
    stopped_rank_is_restarted(0, Work::Prefill);
}

#[test]
fn a_stopped_worker_during_a_prefill_is_restarted_within_stall_timeout() {
    stopped_rank_is_restarted(1, Work::Prefill);
}

#[test]
fn a_stopped_rank0_during_decoding_is_restarted_within_stall_timeout() {
    stopped_rank_is_restarted(0, Work::Decode);
}

#[test]
fn a_stopped_worker_during_decoding_is_restarted_within_stall_timeout() {
    stopped_rank_is_restarted(1, Work::Decode);
}
