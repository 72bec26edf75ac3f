//! Traces end to end (docs/observability.md): with OTEL_EXPORTER_OTLP_ENDPOINT set, a generation's
//! spans reach a real OTLP/HTTP receiver (decoded with the opentelemetry-proto messages): the
//! client's trace continued, a child span per stage under the request's span in the order the
//! stages ran, the GenAI attributes and the key's name (never the key), and rank 0 sent a
//! `traceparent` naming the upstream stage's span, under which vLLM's own spans go; a stream cut
//! by its rank 0's SIGKILL and continued has its resume span.

use std::time::Duration;

use serde_json::json;
use sparkgate_tests::cutproxy::CutProxy;
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::otlp::{attribute, hex, Received, Receiver};
use sparkgate_tests::test_gateway::TestGateway;

mod common;
use common::{DS, SIM};

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn spans_of(all: &[Received], trace: &str) -> Vec<Received> {
    all.iter().filter(|r| hex(&r.span.trace_id) == trace).cloned().collect()
}

#[test]
fn a_generations_stages_reach_the_collector_under_the_clients_trace_and_rank_0_gets_its_traceparent() {
    let receiver = Receiver::start();
    let sim = Sim::start(SIM, DS, &[]);
    let proxy = CutProxy::start(sim.addr());
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream(proxy.addr)
        .env("API_KEYS", "alice=sk-trace-secret")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{}", receiver.addr))
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("STORE_URL", &dir.path().join("state.sqlite").display().to_string())
        .start();
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "stream": true});
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-trace-secret"),
        ("traceparent", traceparent.as_str()),
    ];
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200);
    s.read_all();
    let all = receiver.wait_for(Duration::from_secs(30), |spans| {
        spans_of(spans, CLIENT_TRACE).iter().any(|r| r.span.name == "chat")
    });
    let spans = spans_of(&all, CLIENT_TRACE);
    let root = spans.iter().find(|r| r.span.name == "chat").unwrap();
    assert_eq!(root.service, "sparkgate");
    assert_eq!(
        hex(&root.span.parent_span_id),
        CLIENT_SPAN,
        "the client's span is the parent"
    );
    assert_eq!(attribute(&root.span, "sparkgate.key").as_deref(), Some("alice"));
    assert_eq!(attribute(&root.span, "gen_ai.request.model").as_deref(), Some(MODEL));
    assert_eq!(attribute(&root.span, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(
        attribute(&root.span, "gen_ai.response.finish_reasons").as_deref(),
        Some("length")
    );
    let output: u64 = attribute(&root.span, "gen_ai.usage.output_tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(output, 8);
    assert!(
        attribute(&root.span, "gen_ai.usage.input_tokens")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    let stage = |name: &str| {
        spans
            .iter()
            .find(|r| r.span.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:#?}"))
            .span
            .clone()
    };
    let order = ["normalize", "queue_wait", "lease", "upstream", "streaming"];
    let mut last_start = root.span.start_time_unix_nano;
    for name in order {
        let span = stage(name);
        assert_eq!(span.parent_span_id, root.span.span_id, "{name} is the request's child");
        assert!(
            span.start_time_unix_nano >= last_start,
            "{name} starts after the stage before it"
        );
        assert!(
            span.end_time_unix_nano <= root.span.end_time_unix_nano,
            "{name} ends within the request"
        );
        last_start = span.start_time_unix_nano;
    }
    assert_eq!(stage("admission").parent_span_id, root.span.span_id);
    assert!(stage("upstream").end_time_unix_nano <= stage("streaming").start_time_unix_nano);
    // Rank 0 was sent the trace with the upstream stage's span as its parent.
    let upstream = hex(&stage("upstream").span_id);
    let sent = proxy.sent();
    assert!(
        sent.contains(&format!("traceparent: 00-{CLIENT_TRACE}-{upstream}-01")),
        "the upstream request's traceparent: {sent}"
    );
    assert!(!format!("{all:?}").contains("sk-trace-secret"), "no key in a span");

    // A whole answer without a traceparent: a trace of its own, no streaming stage.
    let whole = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    let r = request(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Bearer sk-trace-secret"),
        ],
        whole.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200);
    let all = receiver.wait_for(Duration::from_secs(30), |spans| {
        spans
            .iter()
            .any(|r| r.span.name == "chat" && hex(&r.span.trace_id) != CLIENT_TRACE)
    });
    let root = all
        .iter()
        .find(|r| r.span.name == "chat" && hex(&r.span.trace_id) != CLIENT_TRACE)
        .unwrap();
    assert!(root.span.parent_span_id.is_empty(), "a new trace's root has no parent");
    let theirs = spans_of(&all, &hex(&root.span.trace_id));
    assert!(theirs.iter().any(|r| r.span.name == "upstream"));
    assert!(!theirs.iter().any(|r| r.span.name == "streaming"));
}

#[test]
fn a_stream_continued_after_its_rank_0_was_killed_has_a_resume_span() {
    let receiver = Receiver::start();
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("SIM_SPEED", "0.3"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{}", receiver.addr)),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ])
        .start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let body = json!({"messages": [{"role": "user", "content": "explain tensor parallel decode"}],
        "max_tokens": 60, "temperature": 0, "stream": true});
    let headers = [
        ("Content-Type", "application/json"),
        ("traceparent", traceparent.as_str()),
    ];
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200);
    let mut raw = Vec::new();
    let mut killed = false;
    while let Some(chunk) = s.next_chunk() {
        raw.extend(chunk);
        if !killed && sparkgate_tests::sse::events(&raw).len() >= 10 {
            gw.signal_rank(0, "-KILL");
            killed = true;
        }
    }
    assert!(killed, "the kill landed mid-stream");
    let all = receiver.wait_for(Duration::from_secs(60), |spans| {
        spans_of(spans, CLIENT_TRACE).iter().any(|r| r.span.name == "chat")
    });
    let spans = spans_of(&all, CLIENT_TRACE);
    let root = spans.iter().find(|r| r.span.name == "chat").unwrap();
    let resume = spans
        .iter()
        .find(|r| r.span.name == "resume")
        .unwrap_or_else(|| panic!("no resume span in {spans:#?}\n{}", gw.proc.log().join("\n")));
    assert_eq!(resume.span.parent_span_id, root.span.span_id);
    assert!(
        resume.span.end_time_unix_nano > resume.span.start_time_unix_nano,
        "the restart took time"
    );
    assert_eq!(attribute(&root.span, "sparkgate.outcome").as_deref(), Some("completed"));
    let streaming = spans.iter().find(|r| r.span.name == "streaming").unwrap();
    assert!(
        streaming.span.start_time_unix_nano <= resume.span.start_time_unix_nano,
        "cut while streaming"
    );
}
