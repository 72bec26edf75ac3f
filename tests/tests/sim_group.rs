//! vllm-sim as a tensor-parallel group of processes (two ranks, and three and four): readiness
//! waits for every rank, a lost rank makes rank 0 fail its next step and exit, the other ranks
//! exit without rank 0; and the scheduler and fault injection the gateway and supervisor tests
//! rely on.

use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::harness::{addr_in, Proc, Sim};
use sparkgate_tests::http::{post_json, request, sse_data, try_request, Streaming};
use sparkgate_tests::load::group_rank_args;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn rank_args(rank: u32, master_port: u16) -> Vec<String> {
    group_rank_args(rank, 2, master_port)
}

const FAST: &[(&str, &str)] = &[
    ("SIM_LOAD_SECONDS", "0"),
    ("SIM_CONTROL_PORT", "0"),
    ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1"),
    ("SIM_WATCHDOG_S", "0.1"),
    ("VLLM_ENGINE_READY_TIMEOUT_S", "60"),
];

/// Rank 0 listening for its peer (port 0 → the log tells which), then rank 1 joined.
fn group(env0: &[(&str, &str)]) -> (Proc, Proc, std::net::SocketAddr) {
    let env: Vec<(&str, &str)> = FAST.iter().chain(env0).copied().collect();
    let rank0 = Proc::spawn(SIM, &rank_args(0, 0), &env);
    let master = addr_in(&rank0.wait_for("torch.distributed rendezvous listening on"));
    rank0.wait_for("Loading weights took");
    assert!(
        !rank0.has_line("Starting vLLM server"),
        "rank 0 must not serve before rank 1 joined"
    );
    let rank1 = Proc::spawn(SIM, &rank_args(1, master.port()), FAST);
    let http = addr_in(&rank0.wait_for("Starting vLLM server on http://"));
    rank0.wait_for("Application startup complete.");
    let log = rank0.log();
    let joined = log
        .iter()
        .position(|l| l.contains("Rank 1 joined"))
        .expect("join logged");
    let serving = log
        .iter()
        .position(|l| l.contains("Starting vLLM server"))
        .expect("serving logged");
    assert!(joined < serving, "ready only after rank 1 joined");
    rank1.wait_for("headless multiproc executor");
    (rank0, rank1, http)
}

#[test]
fn two_ranks_serve_together() {
    let (_r0, _r1, http) = group(&[]);
    let b = post_json(http, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "chat_template_kwargs": {"enable_thinking": false}})).json();
    assert_eq!(b["choices"][0]["message"]["content"], "323");
}

#[test]
fn losing_rank_1_is_silent_while_idle_then_fatal_on_the_next_step() {
    let (mut r0, mut r1, http) = group(&[]);
    r1.kill();
    // Idle: nothing notices, as in vLLM (check_health only reads the errored flag).
    assert_eq!(request(http, "GET", "/health", &[], b"").status, 200);
    // The next step hangs until the execute timeout, then the request fails and rank 0 exits.
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 50});
    let r = post_json(http, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "headers were sent before the step hung");
    let events = sse_data(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(
        err["error"]["message"],
        "The server had an error while processing your request."
    );
    assert_eq!(err["error"]["code"], 500);
    r0.wait_for("EngineCore encountered a fatal error.");
    let status = r0.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1));
}

#[test]
fn in_flight_non_streaming_requests_get_500_when_the_group_breaks() {
    let (mut r0, mut r1, http) = group(&[("SIM_SPEED", "1")]);
    let handle = std::thread::spawn(move || {
        post_json(
            http,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "ignore_eos": true}),
        )
    });
    r0.wait_for("Rank 1 joined");
    // Wait until the request is running (its first step has been taken) before cutting rank 1.
    let ctl = addr_in(&r0.wait_for("vllm-sim control endpoint on http://"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while request(ctl, "GET", "/state", &[], b"").json()["running"] != 1 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    r1.kill();
    let r = handle.join().unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["type"], "InternalServerError");
    r0.wait_exit(Duration::from_secs(30));
}

#[test]
fn three_and_four_rank_groups_serve_only_once_every_rank_joined_and_break_on_any_loss() {
    for nnodes in [3u32, 4] {
        let mut rank0 = Proc::spawn(SIM, &group_rank_args(0, nnodes, 0), FAST);
        let master = addr_in(&rank0.wait_for("torch.distributed rendezvous listening on"));
        let mut others: Vec<Proc> = (1..nnodes - 1)
            .map(|r| Proc::spawn(SIM, &group_rank_args(r, nnodes, master.port()), FAST))
            .collect();
        for r in 1..nnodes - 1 {
            rank0.wait_for(&format!("Rank {r} joined"));
        }
        assert!(
            !rank0.has_line("Starting vLLM server"),
            "{nnodes} ranks: not ready while rank {} is missing",
            nnodes - 1
        );
        others.push(Proc::spawn(
            SIM,
            &group_rank_args(nnodes - 1, nnodes, master.port()),
            FAST,
        ));
        let http = addr_in(&rank0.wait_for("Starting vLLM server on http://"));
        rank0.wait_for("Application startup complete.");
        let b = post_json(http, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "chat_template_kwargs": {"enable_thinking": false}})).json();
        assert_eq!(b["choices"][0]["message"]["content"], "323", "{nnodes} ranks serve");
        // A middle rank lost: the next step fails and rank 0 exits; the rest follow rank 0.
        others[0].kill();
        let r = post_json(
            http,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}),
        );
        assert_eq!(r.status, 500, "{nnodes} ranks: a lost rank fails the step");
        assert_eq!(rank0.wait_exit(Duration::from_secs(30)).code(), Some(1));
        for rank in others.iter_mut().skip(1) {
            assert_eq!(rank.wait_exit(Duration::from_secs(30)).code(), Some(1));
            assert!(rank.has_line("Head node connection lost"));
        }
    }
}

#[test]
fn rank_1_exits_when_rank_0_goes_away() {
    let (mut r0, mut r1, _) = group(&[]);
    r0.kill();
    let status = r1.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1));
    assert!(r1.has_line("Head node connection lost"));
}

#[test]
fn a_rank_that_never_joins_times_the_start_out() {
    let env: Vec<(&str, &str)> = FAST
        .iter()
        .copied()
        .chain([("VLLM_ENGINE_READY_TIMEOUT_S", "0.3")])
        .collect();
    let mut r0 = Proc::spawn(SIM, &rank_args(0, 0), &env);
    r0.wait_for("Timed out after");
    assert_eq!(r0.wait_exit(Duration::from_secs(30)).code(), Some(1));
    assert!(!r0.has_line("Starting vLLM server"));
}

#[test]
fn scheduler_runs_at_most_max_num_seqs_and_queues_the_rest() {
    let sim = Sim::start(
        SIM,
        &["/m", "--served-model-name", "M", "--max-num-seqs", "2"],
        &[("SIM_SPEED", "1")],
    );
    let addr = sim.addr();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "ignore_eos": true, "chat_template_kwargs": {"enable_thinking": false}});
    let workers: Vec<_> = (0..5)
        .map(|_| {
            let b = body.clone();
            std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &b))
        })
        .collect();
    let s = sim.wait_state("2 running, 3 waiting", |s| s["running"] == 2 && s["waiting"] == 3);
    assert_eq!(s["running"], 2);
    let metrics = request(addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("vllm:num_requests_running{model_name=\"M\",engine=\"0\"} 2.0"),
        "{metrics}"
    );
    assert!(metrics.contains("vllm:num_requests_waiting{model_name=\"M\",engine=\"0\"} 3.0"));
    for w in workers {
        assert_eq!(w.join().unwrap().json()["usage"]["completion_tokens"], 40);
    }
    let metrics = request(addr, "GET", "/metrics", &[], b"").text();
    assert!(metrics.contains("vllm:generation_tokens_total{model_name=\"M\",engine=\"0\"} 200.0"));
    assert!(
        !metrics.contains("spec_decode"),
        "no speculative config, no spec-decode counters"
    );
}

#[test]
fn queued_admission_limit_answers_503() {
    let sim = Sim::start(
        SIM,
        &[
            "/m",
            "--served-model-name",
            "M",
            "--max-num-seqs",
            "1",
            "--max-num-queued-reqs",
            "1",
        ],
        &[("SIM_SPEED", "1")],
    );
    let addr = sim.addr();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "ignore_eos": true});
    let b = body.clone();
    let first = std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &b));
    sim.wait_state("1 running", |s| s["running"] == 1);
    let r = post_json(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "Service Unavailable");
    // End the first request quickly: it fails at its next token.
    sim.fault("/fault/stream-error?after_tokens=1");
    assert_eq!(first.join().unwrap().status, 500);
}

#[test]
fn mid_stream_error_fault_ends_with_an_error_event_and_done() {
    let sim = Sim::start(SIM, &["/m", "--served-model-name", "M"], &[]);
    sim.fault("/fault/stream-error?after_tokens=3");
    let r = post_json(
        sim.addr(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 50}),
    );
    let events = sse_data(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(
        err,
        json!({"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}})
    );
    let r = post_json(
        sim.addr(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}),
    );
    assert_eq!(r.status, 500);
    sim.fault("/fault/clear");
    assert_eq!(
        post_json(
            sim.addr(),
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        )
        .status,
        200
    );
}

#[test]
fn hang_fault_stops_tokens_and_logs_but_health_stays_up() {
    let sim = Sim::start(
        SIM,
        &["/m", "--served-model-name", "M"],
        &[("SIM_SPEED", "1"), ("VLLM_LOG_STATS_INTERVAL", "0.1")],
    );
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 1000, "ignore_eos": true});
    let mut s = Streaming::post_json(sim.addr(), "/v1/chat/completions", &body);
    s.next_chunk().unwrap();
    sim.proc.wait_for("Avg generation throughput");
    sim.fault("/fault/hang");
    let tokens = sim.state()["generation_tokens"].clone();
    let lines = sim.proc.log().len();
    assert_eq!(
        request(sim.addr(), "GET", "/health", &[], b"").status,
        200,
        "a hung engine still answers /health"
    );
    // The engine produced nothing more while hung.
    assert_eq!(sim.state()["generation_tokens"], tokens);
    assert_eq!(sim.state()["hung"], true);
    sim.fault("/fault/clear");
    assert!(s.next_chunk().is_some(), "the stream resumes when the hang clears");
    assert!(sim.proc.log().len() >= lines);
}

#[test]
fn crash_fault_exits_abruptly() {
    let mut sim = Sim::start(
        SIM,
        &["/m", "--served-model-name", "M"],
        &[("SIM_FAULT_CRASH_AFTER_REQUESTS", "2")],
    );
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    assert_eq!(post_json(sim.addr(), "/v1/chat/completions", &body).status, 200);
    let second = try_request(
        sim.addr(),
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert!(second.is_none(), "the process died before answering: {second:?}");
    assert_eq!(sim.proc.wait_exit(Duration::from_secs(30)).code(), Some(1));
}

#[test]
fn hang_at_start_stalls_the_log_before_ready() {
    let p = Proc::spawn(
        SIM,
        &["serve", "/m", "--host", "127.0.0.1", "--port", "0"].map(String::from),
        &[("SIM_FAULT_HANG_AT_START", "1"), ("SIM_LOAD_SECONDS", "0")],
    );
    p.wait_for("Loading safetensors checkpoint shards:  20%");
    // Ready would follow within milliseconds; the hang keeps it (and every log line) away.
    let lines = p.log().len();
    assert_eq!(p.try_wait_for("Starting vLLM server", Duration::from_millis(500)), None);
    assert_eq!(p.log().len(), lines, "no log line while hung");
}

#[test]
fn refuse_connections_fault_closes_the_port() {
    let sim = Sim::start(SIM, &["/m", "--served-model-name", "M"], &[]);
    sim.fault("/fault/refuse-connections");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(sim.addr()).is_ok() {
        assert!(std::time::Instant::now() < deadline, "port still accepting");
        std::thread::sleep(Duration::from_millis(10));
    }
    sim.fault("/fault/clear");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(sim.addr()).is_err() {
        assert!(std::time::Instant::now() < deadline, "port never reopened");
        std::thread::sleep(Duration::from_millis(10));
    }
}
