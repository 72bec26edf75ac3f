//! The gateway's Responses store (docs/store.md) in front of the real vLLM 0.33.0 frontend (the
//! reference fixture, its store off as sparkgate runs it): a chain of turns by
//! `previous_response_id`, across a gateway restart, reaches vLLM as the whole conversation — the
//! fixture's model answers "Which numbers did I say?" from every user turn of its rendered
//! prompt — and vLLM accepts the chain's items (its own output messages) as input.

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::http::request;
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn turn(addr: std::net::SocketAddr, text: &str, previous: Option<&str>) -> Value {
    let mut body = json!({"input": text, "max_output_tokens": 400, "temperature": 0});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    let r = request(
        addr,
        "POST",
        "/v1/responses",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn chain_in_front_of(release: VllmRelease) {
    let real = RealVllm::start(release, ProfileId::DeepSeekV41Flash);
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("responses.sqlite").display().to_string();
    let start = || {
        TestGateway::builder(SIM)
            .upstream(real.addr)
            .env("STORE_URL", &store)
            .start()
    };
    let mut gw = start();
    let mut previous: Option<String> = None;
    for n in 1..=3 {
        if n == 3 {
            drop(gw);
            gw = start();
        }
        let answer = turn(
            gw.addr,
            &format!("Turn {n}: remember the number {}.", n * 11),
            previous.as_deref(),
        );
        assert_eq!(answer["previous_response_id"], json!(previous));
        previous = answer["id"].as_str().map(str::to_owned);
    }
    let recall = turn(gw.addr, "Which numbers did I say?", previous.as_deref());
    let said = recall["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "message")
        .unwrap_or_else(|| panic!("a message: {recall}"));
    assert_eq!(said["content"][0]["text"], "You said: 11, 22, 33.", "{recall}");
}

#[test]
fn a_chain_reaches_the_real_0_33_frontend_whole_across_a_gateway_restart() {
    chain_in_front_of(VllmRelease::V0_33);
}
