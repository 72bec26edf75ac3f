//! The gateway in front of vllm-sim processes, over raw HTTP: extra_body repair, effort
//! translation per profile, errors, request ids and aliases, auth, rate limits, readiness and
//! drain.

use std::time::Duration;

use serde_json::json;
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{post_json, request, sse_data, try_request, Streaming};

mod common;
use common::{chat, ds_pair, reasoning_first_line, GLM, SIM};
use sparkgate_tests::test_gateway::TestGateway;

#[test]
fn nested_extra_body_turns_thinking_off_through_the_gateway() {
    let (sim, gw) = ds_pair(&[], &[]);
    let body = json!({"messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 32,
                      "extra_body": {"chat_template_kwargs": {"enable_thinking": false}}});
    let direct = post_json(sim.addr(), "/v1/chat/completions", &body).json();
    assert!(
        reasoning_first_line(&direct).is_some(),
        "plain vLLM ignores the nested extra_body and thinks"
    );
    let via = chat(&gw, body).json();
    assert_eq!(
        reasoning_first_line(&via),
        None,
        "the gateway applied enable_thinking=false"
    );
    assert_eq!(via["choices"][0]["message"]["content"], "323");
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("sparkgate_request_repairs_total{rule=\"extra_body\"} 1"),
        "{metrics}"
    );
    let bad = chat(&gw, json!({"messages": [], "extra_body": "x"}));
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "extra_body");
}

#[test]
fn deepseek_efforts_reach_the_template_as_documented() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (extra, expected) in [
        (json!({}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "low"}), Some("Reasoning Effort: 50")),
        (json!({"reasoning_effort": "high"}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "max"}), Some("Reasoning Effort: 100")),
        (json!({"reasoning_effort": 33}), Some("Reasoning Effort: 33")),
        (json!({"reasoning_effort": "40"}), Some("Reasoning Effort: 40")),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": 90}}),
            Some("Reasoning Effort: 90"),
        ),
        (json!({"reasoning_effort": "medium"}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "minimal"}), Some("Reasoning Effort: 50")),
        (json!({"reasoning_effort": "xhigh"}), Some("Reasoning Effort: 100")),
        (json!({"reasoning_effort": "none"}), None),
        (
            json!({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": 90}}),
            Some("Reasoning Effort: 50"),
        ),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 300});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = chat(&gw, body.clone());
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        assert_eq!(reasoning_first_line(&r.json()).as_deref(), expected, "{body}");
    }
    for (extra, param) in [
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (json!({"reasoning_effort": 0}), "reasoning_effort"),
        (json!({"reasoning_effort": 101}), "reasoning_effort"),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": "ultra"}}),
            "chat_template_kwargs.reasoning_effort",
        ),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
            "chat_template_kwargs",
        ),
        (
            json!({"chat_template_kwargs": {"chat_template": "x"}}),
            "chat_template_kwargs",
        ),
    ] {
        let mut body = json!({"messages": msgs});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = chat(&gw, body.clone());
        assert_eq!(r.status, 400, "{body}");
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{body}");
        assert_eq!(e["error"]["type"], "BadRequestError");
    }
    // Kwargs that are not an object are vLLM's to refuse, in its own words (issue #31).
    let r = chat(&gw, json!({"messages": msgs, "chat_template_kwargs": []}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "body.chat_template_kwargs");
    assert_eq!(r.json()["error"]["type"], "Bad Request");
    let e = chat(&gw, json!({"messages": msgs, "reasoning_effort": "extreme"})).json();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("use low, high, max, none or an integer 1-100"),
        "{e}"
    );
}

#[test]
fn glm_efforts_render_exactly_what_was_asked() {
    let sim = Sim::start(SIM, GLM, &[]);
    let gw = TestGateway::builder(SIM)
        .profile("glm-5.3-flash")
        .upstream(sim.addr())
        .start();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (effort, expected) in [
        (json!("low"), Some("Reasoning Effort: Low")),
        (json!("high"), Some("Reasoning Effort: High")),
        (json!("max"), Some("Reasoning Effort: Max")),
        (json!("medium"), Some("Reasoning Effort: High")),
        (json!("none"), None),
    ] {
        let r = chat(
            &gw,
            json!({"messages": msgs, "reasoning_effort": effort, "max_tokens": 2000}),
        )
        .json();
        assert_eq!(reasoning_first_line(&r).as_deref(), expected, "{effort}");
    }
    for bad in [json!(50), json!("50"), json!("ultra")] {
        let r = chat(&gw, json!({"messages": msgs, "reasoning_effort": bad}));
        assert_eq!(r.status, 400);
        assert_eq!(r.json()["error"]["param"], "reasoning_effort");
    }
    // Responses API: reasoning.effort under the same rules.
    let r = post_json(
        gw.addr,
        "/v1/responses",
        &json!({"input": "hi", "reasoning": {"effort": "max"}, "max_output_tokens": 2000}),
    )
    .json();
    let text = r["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(text.starts_with("Reasoning Effort: Max"), "{r}");
    let r = post_json(
        gw.addr,
        "/v1/responses",
        &json!({"input": "hi", "reasoning": {"effort": 7}}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("reasoning.effort"))
    );
}

#[test]
fn gateway_errors_use_the_envelope() {
    let (_sim, gw) = ds_pair(&[], &[("MAX_BODY_BYTES", "2048")]);
    let a = gw.addr;
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        b"{not json",
    );
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (400, json!("Bad Request"))
    );
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "text/plain")],
        b"{}",
    );
    assert_eq!(
        r.json()["error"]["message"],
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    );
    let big = format!(
        "{{\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
        "x".repeat(4096)
    );
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        big.as_bytes(),
    );
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (413, json!(413)));
    let r = request(a, "GET", "/nowhere", &[], b"");
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (404, json!(404)));
    let r = request(a, "GET", "/v1/chat/completions", &[], b"");
    assert_eq!(r.status, 405);
    let r = chat(&gw, json!({"model": "gpt-4", "messages": [], "stream": true}));
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.text(),
        r#"{"error":{"message":"The model `gpt-4` does not exist. Valid aliases: DeepSeek-v4.1-Flash-EXL3.","type":"NotFoundError","param":"model","code":404}}"#
    );
    // Upstream validation errors pass through unchanged.
    let r = chat(&gw, json!({"messages": "nope"}));
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (400, json!("Bad Request"))
    );
}

#[test]
fn request_ids_models_aliases_and_passthrough_routes() {
    let (_sim, gw) = ds_pair(&[], &[("MODEL_ALIASES", "ds,deepseek")]);
    let a = gw.addr;
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json"), ("X-Request-Id", "my-id-1")],
        json!({"model": "ds", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.header("x-request-id"), Some("my-id-1"));
    let b = r.json();
    assert_eq!(b["id"], "chatcmpl-my-id-1", "the id reached vLLM");
    assert_eq!(b["model"], "DeepSeek-v4.1-Flash-EXL3", "the alias was rewritten");
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert!(
        r.header("x-request-id").unwrap().starts_with("sg-"),
        "generated when absent"
    );
    let models = request(a, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["id"], "DeepSeek-v4.1-Flash-EXL3");
    let t = post_json(a, "/tokenize", &json!({"model": "deepseek", "prompt": "hello"})).json();
    assert!(t["count"].as_u64().unwrap() > 0);
    assert_eq!(
        post_json(a, "/tokenize", &json!({"model": "gpt", "prompt": "x"})).status,
        404
    );
    let c = post_json(a, "/v1/completions", &json!({"model": "ds", "prompt": "Once"})).json();
    assert_eq!(c["usage"]["completion_tokens"], 16);
    assert_eq!(request(a, "GET", "/health", &[], b"").status, 200);
}

#[test]
fn api_keys_admin_token_and_rate_limit() {
    let (_sim, gw) = ds_pair(
        &[],
        &[
            ("API_KEYS", "k1,k2"),
            ("ADMIN_TOKEN", "adm"),
            ("RATE_LIMIT_RPM", "60"),
            ("RATE_LIMIT_BURST", "2"),
        ],
    );
    let a = gw.addr;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).to_string();
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (401, json!(401)));
    let auth = [("Content-Type", "application/json"), ("Authorization", "Bearer k2")];
    let r1 = request(a, "POST", "/v1/chat/completions", &auth, body.as_bytes());
    assert_eq!(r1.status, 200);
    assert_eq!(r1.header("x-ratelimit-limit-requests"), Some("60"));
    assert_eq!(r1.header("x-ratelimit-remaining-requests"), Some("1"));
    assert_eq!(
        request(a, "POST", "/v1/chat/completions", &auth, body.as_bytes()).status,
        200
    );
    let limited = request(a, "POST", "/v1/chat/completions", &auth, body.as_bytes());
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("1"));
    assert_eq!(limited.header("x-ratelimit-remaining-requests"), Some("0"));
    let other_key = [("Content-Type", "application/json"), ("Authorization", "Bearer k1")];
    assert_eq!(
        request(a, "POST", "/v1/chat/completions", &other_key, body.as_bytes()).status,
        200,
        "limits are per key"
    );
    assert_eq!(request(a, "GET", "/admin/status", &[], b"").status, 401);
    assert_eq!(
        request(a, "GET", "/admin/status", &[("Authorization", "Bearer k1")], b"").status,
        401
    );
    let s = request(a, "GET", "/admin/status", &[("Authorization", "Bearer adm")], b"");
    assert_eq!(s.status, 200);
    assert_eq!(s.json()["admission"]["capacity"], 2);
    assert_eq!(request(a, "GET", "/health", &[], b"").status, 200, "health is open");
    let log = gw.proc.log().join("\n");
    assert!(
        !log.contains("Bearer k2") && !log.contains("adm\""),
        "no secrets in logs"
    );
}

#[test]
fn ready_reports_an_absent_upstream_and_requests_get_502() {
    let gw = TestGateway::builder(SIM)
        .upstream_url("http://127.0.0.1:9")
        .start_unready();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ready = loop {
        let r = request(gw.addr, "GET", "/ready", &[], b"");
        if r.json()["state"] == "unreachable" {
            break r;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ready.status, 503);
    let r = post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 502);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("http://127.0.0.1:9"));
}

#[test]
fn sigterm_drains_and_exits() {
    let (_sim, mut gw) = ds_pair(&[("SIM_SPEED", "4")], &[("DRAIN_TIMEOUT", "30")]);
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "ignore_eos": true, "stream": true});
    let mut s = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    s.next_chunk().unwrap();
    let pid = gw.proc.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    gw.proc.wait_for("draining");
    // New connections get 503 + Retry-After in the envelope (not a reset); the stream in flight
    // completes.
    let refused = try_request(gw.addr, "GET", "/health", &[], b"").expect("an answer, not a reset");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
    let events = sse_data(&s.read_all());
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
}
