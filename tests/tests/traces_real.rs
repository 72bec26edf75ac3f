//! Traces through the gateway into the real vLLM frontend (the reference fixture, 0.33.0): rank 0
//! started with the launch plan's argv and environment for tracing (`--otlp-traces-endpoint`,
//! the HTTP protocol) exports vLLM's own `llm_request` span into the trace the client began, as
//! the child of the gateway's `upstream` span — both read back from one real OTLP receiver.

use std::time::Duration;

use serde_json::json;
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::http::Streaming;
use sparkgate_tests::otlp::{hex, Receiver};
use sparkgate_tests::realvllm::{plan_argv_with, RealVllm};
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

#[test]
fn vllms_own_span_joins_the_clients_trace_under_the_gateways_upstream_span() {
    let receiver = Receiver::start();
    let endpoint = format!("http://{}", receiver.addr);
    let argv = plan_argv_with(
        ProfileId::DeepSeekV41Flash,
        None,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    );
    assert!(argv.iter().any(|a| a == "--otlp-traces-endpoint"), "{argv:?}");
    // Rank 0's environment as the plan gives it when tracing is on, and a short export delay.
    let env = [
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ("OTEL_SERVICE_NAME", "vllm"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let real = RealVllm::start_with(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash, &argv, &env);
    let state = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream(real.addr)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("STORE_URL", &state.path().join("state.sqlite").display().to_string())
        .start();
    let traceparent = format!("00-{CLIENT_TRACE}-b7ad6b7169203331-01");
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "stream": true});
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[
            ("Content-Type", "application/json"),
            ("traceparent", traceparent.as_str()),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200);
    s.read_all();
    let mine = |r: &sparkgate_tests::otlp::Received| hex(&r.span.trace_id) == CLIENT_TRACE;
    let all = receiver.wait_for(Duration::from_secs(60), |spans| {
        spans.iter().any(|r| mine(r) && r.service == "vllm") && spans.iter().any(|r| mine(r) && r.span.name == "chat")
    });
    let upstream = all
        .iter()
        .find(|r| mine(r) && r.span.name == "upstream")
        .expect("the gateway's upstream span");
    let vllm = all.iter().find(|r| mine(r) && r.service == "vllm").unwrap();
    assert_eq!(vllm.span.name, "llm_request");
    assert_eq!(
        vllm.span.parent_span_id, upstream.span.span_id,
        "vLLM's span is the child of the gateway's upstream span"
    );
    assert_eq!(upstream.service, "sparkgate");
}
