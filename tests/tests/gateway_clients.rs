//! Real clients from PyPI through the gateway (`tests/python/test_clients.py`): the `openai` SDK,
//! `openai-agents` on chat completions and on Responses, `langchain-openai`, `pydantic-ai`, the
//! `anthropic` SDK and `litellm` — in front of vllm-sim playing each vLLM release and in front of
//! each real frontend (0.33.0, 0.34.0); the response store on SQLite, and on PostgreSQL in front
//! of vllm-sim as 0.34.

use std::net::SocketAddr;

use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::load::deepseek_sim_args;
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const TESTS: &[&str] = &[
    "test_non_streaming_smoke",
    "test_tools",
    "test_structured_output_parses",
    "test_responses_api",
    "test_responses_stream",
    "test_responses_chain_retrieve_items_delete",
    "test_errors_raise_the_right_classes",
    "test_async_stream_and_non_stream",
    "test_openai_agents_tool_turn",
    "test_openai_agents_on_the_responses_api",
    "test_openai_agents_with_server_side_conversation_state",
    "test_invoke_and_stream",
    "test_tools_and_structured_output",
    "test_structured_output_by_tool_and_native",
    "test_tool_turn",
    "test_messages_plain_and_stream",
    "test_thinking_and_effort",
    "test_tool_use",
    "test_litellm_chat_and_stream",
    "test_litellm_tools",
    "test_litellm_reasoning_effort_and_response_format",
    "test_litellm_responses_bridge",
];

/// Runs the client suite against `backend` (the normal gateway) and `tight` (QUEUE_DEPTH=0).
fn run_clients(backend: SocketAddr, tight_backend: SocketAddr, gw_env: &[(&str, &str)]) {
    let gw = TestGateway::builder(SIM).upstream(backend).envs(gw_env).start();
    let tight = TestGateway::builder(SIM)
        .upstream(tight_backend)
        .env("QUEUE_DEPTH", "0")
        .start();
    // Client libraries' unclosed-socket warnings (ignored by `python::script`) would
    // interleave with unittest's verdict lines.
    let (base, tight_base) = (gw.base_url(), tight.base_url());
    let env = [
        ("SPARKGATE_BASE_URL", base.as_str()),
        ("SPARKGATE_TIGHT_URL", tight_base.as_str()),
        ("SPARKGATE_MODEL", MODEL),
        ("OPENAI_AGENTS_DISABLE_TRACING", "1"),
    ];
    let ran = sparkgate_tests::python::script("test_clients.py", &[], &env)
        .unwrap_or_else(|e| panic!("python client tests failed: {e}"));
    let report = ran.stderr.as_str();
    for test in TESTS {
        let line = report.lines().find(|l| l.starts_with(&format!("{test} ")));
        assert!(
            line.is_some_and(|l| l.ends_with("ok")),
            "{test} did not pass:\n{report}"
        );
    }
}

fn in_front_of_vllm_sim(release: VllmRelease, gw_env: &[(&str, &str)]) {
    let args = [
        &deepseek_sim_args("8")[..],
        &["--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v41"],
        &["--vllm-version", release.version()],
    ]
    .concat();
    let sim = Sim::start(SIM, &args, &[]);
    let slow = Sim::start(SIM, &args, &[("SIM_SPEED", "1")]);
    let env = [&[("MAX_NUM_SEQS", "8")][..], gw_env].concat();
    run_clients(sim.addr(), slow.addr(), &env);
}

fn in_front_of_the_real_frontend(release: VllmRelease) {
    // The profile's own plan argv (MAX_NUM_SEQS 2); the fake engine's 2 ms steps hold the tight
    // gateway's two 2000-token streams for seconds.
    let real = RealVllm::start(release, ProfileId::DeepSeekV41Flash);
    run_clients(real.addr, real.addr, &[]);
}

#[test]
fn clients_in_front_of_vllm_sim_as_0_33() {
    in_front_of_vllm_sim(VllmRelease::V0_33, &[]);
}

/// With the response store on PostgreSQL (a real server): the Responses chains of the suite
/// run against the shared backend.
#[test]
fn clients_in_front_of_vllm_sim_as_0_34() {
    let pg = sparkgate_tests::postgres::Postgres::start();
    let url = pg.database("clients");
    in_front_of_vllm_sim(VllmRelease::V0_34, &[("STORE_URL", &url)]);
}

#[test]
fn clients_in_front_of_the_real_0_33_frontend() {
    in_front_of_the_real_frontend(VllmRelease::V0_33);
}

#[test]
fn clients_in_front_of_the_real_0_34_frontend() {
    in_front_of_the_real_frontend(VllmRelease::V0_34);
}
