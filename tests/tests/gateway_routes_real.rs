//! The route table in front of the real vLLM 0.33.0 frontend: six concurrent streams on
//! `/v1/messages`, `/v1/chat%2Fcompletions` and `/v1/%63hat/completions` never put more than
//! MAX_NUM_SEQS requests into vLLM (its own running + waiting gauges), and the checks hold on
//! every spelling. The scale-out routes the plan turns on for resuming streams
//! (`--enable-scale-out`) answer on rank 0 and never through the gateway.

use std::time::Duration;

use serde_json::json;
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::http::{in_vllm, post_json};
use sparkgate_tests::load::concurrent_streams;
use sparkgate_tests::realvllm::{plan_argv, RealVllm};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

#[test]
fn every_spelling_and_messages_stay_under_max_num_seqs_in_the_real_frontend() {
    // 20 ms engine steps: each stream lasts seconds, long enough to see the queue.
    let real = RealVllm::start_with(
        VllmRelease::V0_33,
        ProfileId::DeepSeekV41Flash,
        &plan_argv(ProfileId::DeepSeekV41Flash, None),
        &[("FAKE_STEP_S", "0.02")],
    );
    let gw = TestGateway::builder(SIM).upstream(real.addr).start();
    let prompt = json!([{"role": "user", "content": "Explain tensor parallel inference."}]);
    let chat = json!({"model": MODEL, "messages": prompt, "max_tokens": 60, "stream": true});
    let messages = json!({"model": MODEL, "messages": prompt, "max_tokens": 60, "stream": true});
    for (path, body) in [
        ("/v1/messages", &messages),
        ("/v1/chat%2Fcompletions", &chat),
        ("/v1/%63hat/completions", &chat),
    ] {
        let (most, bodies) =
            concurrent_streams(gw.addr, path, body, 6, Duration::from_millis(10), || in_vllm(real.addr));
        for text in bodies {
            let events = sse::events(text.as_bytes());
            assert!(
                events.iter().any(|e| sse::is_done(e) || e.event == "message_stop"),
                "{path}: {text}"
            );
        }
        assert!(
            (1..=2).contains(&most),
            "{path}: {most} requests inside vLLM at once (MAX_NUM_SEQS 2)"
        );
    }
    for path in ["/v1/chat%2Fcompletions", "/v1//chat/./completions/"] {
        let r = post_json(gw.addr, path, &json!({"model": MODEL, "messages": prompt, "n": 50}));
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let r = post_json(
            gw.addr,
            path,
            &json!({"model": MODEL, "messages": prompt, "chat_template_kwargs": {"chat_template": "{{1}}"}}),
        );
        assert_eq!(
            r.json()["error"]["param"],
            "chat_template_kwargs",
            "{path}: {}",
            r.text()
        );
    }
    // Rank 0 serves tokens-in generation and the renderers (the gateway's resume uses them),
    // and clients never reach them: the gateway's table does not list them.
    let tokens = json!({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}});
    assert_eq!(post_json(real.addr, "/inference/v1/generate", &tokens).status, 200);
    for path in [
        "/inference/v1/generate",
        "/v1/chat/completions/render",
        "/v1/chat/completions/derender",
        "/v1/completions/render",
        "/v1/messages/render",
    ] {
        let r = post_json(gw.addr, path, &tokens);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(
            r.json().get("detail").is_none(),
            "{path}: the gateway's own 404: {}",
            r.text()
        );
    }
}
