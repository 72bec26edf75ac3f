//! Anthropic's Messages API through the gateway, first-class: model names and `claude-*`
//! aliases, the profile's effort rules on `output_config.effort`, errors in Anthropic's
//! envelope, and a rank lost mid-stream ending the stream with Anthropic's `event: error`.

use std::net::SocketAddr;

use serde_json::json;
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::http::{post_json, Streaming};
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::sse;

mod common;
use common::ds_pair;
use sparkgate_tests::test_gateway::TestGateway;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn body(model: &str) -> serde_json::Value {
    json!({"model": model, "max_tokens": 64, "thinking": {"type": "disabled"},
           "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}]})
}

#[test]
fn claude_model_names_are_served_with_the_alias_and_refused_in_anthropics_envelope_without() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let refused = post_json(gw.addr, "/v1/messages", &body("claude-sonnet-4-5"));
    assert_eq!(refused.status, 404);
    let e = refused.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], "not_found_error", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("claude-sonnet-4-5"),
        "{e}"
    );
    let (_sim2, aliased) = ds_pair(&[], &[("MODEL_ALIASES", "claude-*")]);
    let served = post_json(aliased.addr, "/v1/messages", &body("claude-sonnet-4-5"));
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.json()["content"][0]["text"], "323");
    assert_eq!(served.json()["model"], MODEL);
}

#[test]
fn output_config_effort_follows_the_profile_and_refusals_speak_anthropic() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let mut b = body(MODEL);
    b["output_config"] = json!({"effort": "medium"});
    b.as_object_mut().unwrap().remove("thinking");
    b["max_tokens"] = json!(400);
    let r = post_json(gw.addr, "/v1/messages", &b);
    assert_eq!(
        r.status,
        200,
        "medium is mapped to an effort DeepSeek renders: {}",
        r.text()
    );
    let thinking = r.json()["content"][0]["thinking"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(thinking.starts_with("Reasoning Effort: 75"), "{thinking}");
    let (_sim2, strict) = ds_pair(&[], &[("REASONING_EFFORT_MAP", "")]);
    let r = post_json(strict.addr, "/v1/messages", &b);
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("low, high, max"),
        "{e}"
    );
}

/// DeepSeek's integer efforts on `/v1/messages`, in `output_config.effort` and in
/// `chat_template_kwargs`, as integers and integer strings: each renders its own number.
fn integer_efforts_render(gw: SocketAddr) {
    for (extra, rendered) in [
        (json!({"output_config": {"effort": 30}}), "Reasoning Effort: 30"),
        (json!({"output_config": {"effort": 1}}), "Reasoning Effort: 1"),
        (json!({"output_config": {"effort": "50"}}), "Reasoning Effort: 50"),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": 30}}),
            "Reasoning Effort: 30",
        ),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": "40"}}),
            "Reasoning Effort: 40",
        ),
        (
            json!({"output_config": {"effort": "low"}, "chat_template_kwargs": {"reasoning_effort": 30}}),
            "Reasoning Effort: 50",
        ),
    ] {
        let mut b = json!({"model": MODEL, "max_tokens": 200,
                           "messages": [{"role": "user", "content": "What is 17*19?"}]});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = post_json(gw, "/v1/messages", &b);
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
        let thinking = r.json()["content"][0]["thinking"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let after = thinking.strip_prefix(rendered).and_then(|rest| rest.chars().next());
        assert!(after.is_some_and(|c| !c.is_ascii_digit()), "{extra}: {thinking}");
    }
}

#[test]
fn integer_efforts_on_messages_render_in_front_of_vllm_sim() {
    let (_sim, gw) = ds_pair(&[], &[]);
    integer_efforts_render(gw.addr);
}

#[test]
fn integer_efforts_on_messages_render_in_front_of_the_real_frontend() {
    let real = RealVllm::start(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash);
    let gw = TestGateway::builder(common::SIM).upstream(real.addr).start();
    integer_efforts_render(gw.addr);
}

#[test]
fn a_rank_lost_mid_stream_ends_the_stream_with_anthropics_error_event() {
    let (mut sim, gw) = ds_pair(&[("SIM_SPEED", "0.5")], &[]);
    let b = json!({"model": MODEL, "max_tokens": 2000, "stream": true,
                   "messages": [{"role": "user", "content": "Explain tensor parallel inference."}]});
    let mut s = Streaming::post_json(gw.addr, "/v1/messages", &b);
    assert_eq!(s.status, 200);
    let first = String::from_utf8(s.next_chunk().expect("a first event")).unwrap();
    assert!(first.contains("event: message_start"), "{first}");
    sim.proc.kill();
    let rest = String::from_utf8_lossy(&s.read_all()).into_owned();
    let events = sse::events(rest.as_bytes());
    let last = events.last().filter(|e| e.event == "error");
    let last = last.unwrap_or_else(|| panic!("the stream ends with Anthropic's error event: {rest}"));
    let data: serde_json::Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(data["type"], "error");
    assert!(data["error"]["message"].is_string());
    assert!(!rest.contains("[DONE]"), "no OpenAI framing on an Anthropic stream");
}
