//! Real clients keep a conversation in the gateway's store (docs/store.md) across a restart in
//! the middle (`tests/python/store_chain.py`): the openai SDK starts it; after a rank-group
//! restart (in front of supervised vllm-sim ranks) or a gateway restart (in front of the real
//! vLLM 0.33.0 frontend) the SDK continues it, openai-agents continues from that with
//! `previous_response_id` and is answered from the whole conversation, and the SDK retrieves,
//! lists and deletes.

use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::request;
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

/// One step of the script against `gw`; its last line.
fn step(gw: &Gateway, args: &[&str]) -> String {
    let base = gw.base_url();
    let env = [
        ("SPARKGATE_BASE_URL", base.as_str()),
        ("SPARKGATE_MODEL", MODEL),
        ("OPENAI_AGENTS_DISABLE_TRACING", "1"),
    ];
    match sparkgate_tests::python::script("store_chain.py", args, &env) {
        Ok(ran) => ran.last_line().to_owned(),
        Err(e) => panic!("{e}\n{}", gw.proc.log().join("\n")),
    }
}

#[test]
fn sdk_and_agents_carry_a_conversation_across_a_rank_group_restart() {
    let gw = TestGateway::builder(SIM).start();
    let first = step(&gw, &["start"]);
    assert!(first.starts_with("resp_"), "{first}");
    let epoch = gw.status()["supervisor"]["epoch"].clone();
    assert!(request(gw.addr, "POST", "/admin/restart", &[], b"").status < 300);
    gw.wait_status("a new epoch", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] != epoch && s["ready"] == true
    });
    assert_eq!(step(&gw, &["continue", &first]), "ok");
}

#[test]
fn sdk_and_agents_carry_a_conversation_across_a_gateway_restart_in_front_of_the_real_0_33_frontend() {
    let real = RealVllm::start(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash);
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("responses.sqlite").display().to_string();
    let start = || {
        TestGateway::builder(SIM)
            .upstream(real.addr)
            .env("STORE_URL", &store)
            .start()
    };
    let gw = start();
    let first = step(&gw, &["start"]);
    drop(gw);
    let gw = start();
    assert_eq!(step(&gw, &["continue", &first]), "ok");
}
