//! vllm-sim's HTTP surface against vLLM 0.33's documented shapes (reference
//! `vllm-0.33-http.md`): error envelopes, SSE framing, usage chunk, 404 text, headers.

use serde_json::{json, Value};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{post_json, request, sse_data, Streaming};
use sparkgate_tests::sse;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const DS: &[&str] = &[
    "/model",
    "--served-model-name",
    "DeepSeek-v4.1-Flash-EXL3",
    "--reasoning-parser",
    "deepseek_v41",
    "--max-model-len",
    "600000",
];
const GLM: &[&str] = &[
    "/glm",
    "--served-model-name",
    "GLM-5.3-Flash-EXL3",
    "--reasoning-parser",
    "glm45",
];

fn ds(extra: &[&str], env: &[(&str, &str)]) -> Sim {
    let args: Vec<&str> = DS.iter().chain(extra).copied().collect();
    Sim::start(SIM, &args, env)
}

fn smoke() -> Value {
    json!({"model": "DeepSeek-v4.1-Flash-EXL3", "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}],
           "max_tokens": 32, "temperature": 0, "chat_template_kwargs": {"enable_thinking": false}})
}

#[test]
fn smoke_request_answers_323_with_vllm_body_shape() {
    let sim = ds(&[], &[]);
    let r = post_json(sim.addr(), "/v1/chat/completions", &smoke());
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let b = r.json();
    let keys: Vec<&str> = b.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "id",
            "object",
            "created",
            "model",
            "choices",
            "service_tier",
            "system_fingerprint",
            "usage",
            "prompt_logprobs",
            "prompt_token_ids",
            "prompt_text",
            "kv_transfer_params",
            "ec_transfer_params",
            "metrics"
        ]
    );
    assert!(b["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(b["object"], "chat.completion");
    let choice = &b["choices"][0];
    assert_eq!(choice["message"]["content"], "323");
    assert_eq!(
        choice["message"]["reasoning"],
        Value::Null,
        "thinking off: no reasoning"
    );
    assert!(
        choice["message"].get("tool_calls").is_none(),
        "tool_calls omitted when empty"
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(b["usage"]["completion_tokens"], 1);
    assert_eq!(
        b["usage"]["total_tokens"],
        b["usage"]["prompt_tokens"].as_u64().unwrap() + 1
    );
}

#[test]
fn wrong_model_is_vllms_404_also_for_streams() {
    let sim = ds(&[], &[]);
    for stream in [false, true] {
        let r = post_json(
            sim.addr(),
            "/v1/chat/completions",
            &json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}], "stream": stream}),
        );
        assert_eq!(r.status, 404);
        assert_eq!(r.header("content-type"), Some("application/json"), "JSON, not SSE");
        assert_eq!(
            r.text(),
            r#"{"error":{"message":"The model `gpt-4` does not exist. Valid aliases: DeepSeek-v4.1-Flash-EXL3.","type":"NotFoundError","param":"model","code":404}}"#
        );
    }
    for model in [json!(null), json!("")] {
        let r = post_json(
            sim.addr(),
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        );
        assert_eq!(r.status, 200, "absent/null/empty model means the served one");
        assert_eq!(r.json()["model"], "DeepSeek-v4.1-Flash-EXL3");
    }
}

#[test]
fn validation_errors_use_the_envelope_and_status_400() {
    let sim = ds(&[], &[]);
    let a = sim.addr();
    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"}),
    );
    assert_eq!(r.status, 400);
    let e = &r.json()["error"];
    assert_eq!(e["type"], "Bad Request");
    assert_eq!(e["param"], "body.reasoning_effort");
    assert_eq!(e["code"], 400);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("1 validation error:\n  {'type': 'literal_error'"),
        "{e}"
    );

    let r = post_json(a, "/v1/chat/completions", &json!({"model": "DeepSeek-v4.1-Flash-EXL3"}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "body.messages");

    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "text/plain")],
        b"{}",
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    );

    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        b"{not json",
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("json_invalid"));

    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "stream_options");

    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"chat_template": "{{x}}"}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "BadRequestError");

    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 700000}),
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("max_tokens=700000 cannot be greater than max_model_len=600000"));

    let r = request(a, "GET", "/nope", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (404, r#"{"detail":"Not Found"}"#));
}

#[test]
fn unknown_fields_and_a_nested_extra_body_are_ignored() {
    let sim = ds(&[], &[]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "frobnicate": 1,
                      "extra_body": {"chat_template_kwargs": {"enable_thinking": false}}});
    let r = post_json(sim.addr(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    let reasoning = r.json()["choices"][0]["message"]["reasoning"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reasoning.starts_with("Reasoning Effort:"),
        "the nested enable_thinking=false did not take effect: {reasoning}"
    );
}

#[test]
fn sse_framing_usage_chunk_and_done() {
    let sim = ds(&[], &[]);
    let mut req = smoke();
    req["stream"] = json!(true);
    let mut s = Streaming::post_json(sim.addr(), "/v1/chat/completions", &req);
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("text/event-stream; charset=utf-8"));
    let events = sse_data(&s.read_all());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c.get("usage").is_none()),
        "no usage without include_usage"
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last.get("system_fingerprint").is_some());
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "323");

    req["stream_options"] = json!({"include_usage": true});
    let r = post_json(sim.addr(), "/v1/chat/completions", &req);
    let events = sse_data(&r.body);
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 1);
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn usage_counts_every_token_even_when_chunks_carry_several() {
    let sim = ds(
        &[
            "--speculative-config",
            r#"{"method":"dspark","num_speculative_tokens":3}"#,
        ],
        &[],
    );
    let body = json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}], "max_tokens": 200, "stream": true,
                      "stream_options": {"include_usage": true}, "chat_template_kwargs": {"enable_thinking": false}});
    let r = post_json(sim.addr(), "/v1/chat/completions", &body);
    let events = sse_data(&r.body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let content_chunks = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    let completion = chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(
        completion > content_chunks,
        "speculation releases several tokens per step: {completion} tokens in {content_chunks} chunks"
    );
    let metrics = request(sim.addr(), "GET", "/metrics", &[], b"").text();
    assert!(metrics.contains("vllm:spec_decode_num_drafts_total{model_name=\"DeepSeek-v4.1-Flash-EXL3\",engine=\"0\"}"));
    assert!(metrics.contains("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"DeepSeek-v4.1-Flash-EXL3\",engine=\"0\",position=\"2\"}"));
}

#[test]
fn request_ids_and_the_echo_header() {
    let plain = ds(&[], &[]);
    let r = request(
        plain.addr(),
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json"), ("X-Request-Id", "abc-123")],
        smoke().to_string().as_bytes(),
    );
    assert_eq!(r.json()["id"], "chatcmpl-abc-123");
    assert_eq!(
        r.header("x-request-id"),
        None,
        "echoed only with --enable-request-id-headers"
    );
    let echo = ds(&["--enable-request-id-headers"], &[]);
    let r = request(
        echo.addr(),
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json"), ("X-Request-Id", "abc-123")],
        smoke().to_string().as_bytes(),
    );
    assert_eq!(r.header("x-request-id"), Some("abc-123"));
}

#[test]
fn api_key_guards_only_v1_with_a_bare_401() {
    let sim = ds(&["--api-key", "k1", "k2"], &[]);
    let a = sim.addr();
    let r = request(a, "GET", "/v1/models", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (401, r#"{"error":"Unauthorized"}"#));
    assert_eq!(
        request(a, "GET", "/v1/models", &[("Authorization", "bearer k2")], b"").status,
        200
    );
    assert_eq!(
        request(a, "GET", "/v1/models", &[("Authorization", "Bearer nope")], b"").status,
        401
    );
    for open in ["/health", "/metrics", "/version", "/ping"] {
        assert_eq!(request(a, "GET", open, &[], b"").status, 200, "{open} is not guarded");
    }
}

#[test]
fn health_models_version_tokenize() {
    let sim = ds(&[], &[]);
    let a = sim.addr();
    let h = request(a, "GET", "/health", &[], b"");
    assert_eq!((h.status, h.body.len()), (200, 0));
    assert_eq!(
        request(a, "GET", "/version", &[], b"").json(),
        json!({"version": "0.34.0"}),
        "the newest release, played by default"
    );
    let m = request(a, "GET", "/v1/models", &[], b"").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "DeepSeek-v4.1-Flash-EXL3");
    assert_eq!(m["data"][0]["root"], "/model");
    assert_eq!(m["data"][0]["max_model_len"], 600000);
    let t = post_json(a, "/tokenize", &json!({"prompt": "What is 17*19?"})).json();
    assert_eq!(t["count"], t["tokens"].as_array().unwrap().len());
    let d = post_json(a, "/detokenize", &json!({"tokens": t["tokens"]})).json();
    assert_eq!(d["prompt"], "What is 17*19?");
}

#[test]
fn keep_alive_connections_close_after_the_idle_timeout() {
    use std::io::{Read, Write};
    let sim = ds(&[], &[("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "0.5")]);
    let mut s = std::net::TcpStream::connect(sim.addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let started = std::time::Instant::now();
    let eof = s.read(&mut buf).unwrap();
    assert_eq!(eof, 0, "the server closes the idle connection");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "closed by the idle timeout, not the read timeout"
    );
}

#[test]
fn client_disconnect_aborts_the_request() {
    let sim = ds(&[], &[("SIM_SPEED", "1")]);
    let body = json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}], "max_tokens": 500, "stream": true, "ignore_eos": true});
    let mut s = Streaming::post_json(sim.addr(), "/v1/chat/completions", &body);
    s.next_chunk().expect("first chunk");
    sim.wait_state("running 1", |s| s["running"] == 1);
    drop(s);
    let state = sim.wait_state("an abort", |s| s["aborted"] == 1);
    assert_eq!(state["running"], 0);
    let metrics = request(sim.addr(), "GET", "/metrics", &[], b"").text();
    assert!(metrics.contains(r#"vllm:request_success_total{model_name="DeepSeek-v4.1-Flash-EXL3",engine="0",finished_reason="abort"} 1.0"#), "{metrics}");
}

#[test]
fn completions_default_to_16_tokens() {
    let sim = ds(&[], &[]);
    let r = post_json(sim.addr(), "/v1/completions", &json!({"prompt": "Once upon a time"}));
    let b = r.json();
    assert_eq!(b["object"], "text_completion");
    assert_eq!(b["usage"]["completion_tokens"], 16);
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    let r = post_json(
        sim.addr(),
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": 5, "stream": true}),
    );
    let events = sse_data(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[test]
fn tools_get_a_well_formed_tool_call() {
    let sim = ds(
        &["--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v41"],
        &[],
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Call get_weather for Paris."}], "tools": tools, "chat_template_kwargs": {"enable_thinking": false}});
    let b = post_json(sim.addr(), "/v1/chat/completions", &body).json();
    let choice = &b["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = sse_data(&post_json(sim.addr(), "/v1/chat/completions", &stream).body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn responses_api_plain_turns() {
    let sim = ds(&[], &[]);
    let b = post_json(
        sim.addr(),
        "/v1/responses",
        &json!({"input": "What is 17*19? Reply with the integer only.", "reasoning": {"effort": "none"}}),
    )
    .json();
    assert_eq!(b["object"], "response");
    assert_eq!(b["status"], "completed");
    let msg = b["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "message")
        .unwrap();
    assert_eq!(msg["content"][0]["text"], "323");
    let r = post_json(
        sim.addr(),
        "/v1/responses",
        &json!({"input": "hi", "stream": true, "max_output_tokens": 30}),
    );
    let events = sse::events(&r.body);
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert!(!kinds.contains(&sse::UNNAMED), "every event is named: {kinds:?}");
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert!(kinds.contains(&"response.reasoning_text.delta"));
    assert!(matches!(
        *kinds.last().unwrap(),
        "response.completed" | "response.incomplete"
    ));
}

fn first_reasoning_line(sim: &Sim, body: Value) -> Option<String> {
    let b = post_json(sim.addr(), "/v1/chat/completions", &body).json();
    b["choices"][0]["message"]["reasoning"]
        .as_str()
        .map(|r| r.lines().next().unwrap().to_owned())
}

#[test]
fn the_template_sees_exactly_the_effort_each_profile_receives() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let sim = ds(&[], &[]);
    for (extra, expected) in [
        (json!({}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "low"}), Some("Reasoning Effort: 50")),
        (json!({"reasoning_effort": "max"}), Some("Reasoning Effort: 100")),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": 33}}),
            Some("Reasoning Effort: 33"),
        ),
        (json!({"reasoning_effort": "none"}), None),
        (json!({"chat_template_kwargs": {"enable_thinking": false}}), None),
        // Top-level wins over kwargs, as in vLLM's merge.
        (
            json!({"reasoning_effort": "max", "chat_template_kwargs": {"reasoning_effort": "low"}}),
            Some("Reasoning Effort: 100"),
        ),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 400});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        assert_eq!(first_reasoning_line(&sim, body.clone()).as_deref(), expected, "{body}");
    }
    let glm = Sim::start(SIM, GLM, &[]);
    let glm_default = Sim::start(
        SIM,
        &[
            GLM,
            &["--default-chat-template-kwargs", r#"{"reasoning_effort":"high"}"#],
        ]
        .concat(),
        &[],
    );
    for (sim, extra, expected) in [
        (&glm, json!({}), "Reasoning Effort: Max"),
        (&glm, json!({"reasoning_effort": "high"}), "Reasoning Effort: High"),
        (&glm, json!({"reasoning_effort": "medium"}), "Reasoning Effort: Max"),
        (
            &glm,
            json!({"chat_template_kwargs": {"reasoning_effort": "low"}}),
            "Reasoning Effort: Low",
        ),
        (&glm_default, json!({}), "Reasoning Effort: High"),
        (
            &glm_default,
            json!({"reasoning_effort": "low"}),
            "Reasoning Effort: Low",
        ),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 2000});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        assert_eq!(
            first_reasoning_line(sim, body.clone()).as_deref(),
            Some(expected),
            "{body}"
        );
    }
    let len = |effort: &str| {
        let b = post_json(
            glm.addr(),
            "/v1/chat/completions",
            &json!({"messages": msgs, "reasoning_effort": effort}),
        )
        .json();
        b["choices"][0]["message"]["reasoning"].as_str().unwrap().len()
    };
    assert!(len("max") > 4 * len("high"), "reasoning grows with effort");
    assert!(len("high") > len("low"));
}

/// The value of one unlabelled-but-model sample of `/metrics`.
fn metric_value(sim: &Sim, name: &str) -> f64 {
    let text = String::from_utf8(request(sim.addr(), "GET", "/metrics", &[], b"").body).unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

#[test]
fn a_shared_prompt_prefix_is_served_from_the_prefix_cache_in_whole_blocks() {
    let sim = ds(&["--enable-prompt-tokens-details"], &[]);
    let system = "You are a careful assistant. ".repeat(40);
    let chat = |question: &str| {
        let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                          "max_tokens": 4, "chat_template_kwargs": {"enable_thinking": false}});
        post_json(sim.addr(), "/v1/chat/completions", &body).json()["usage"].clone()
    };
    let first = chat("What is 17*19?");
    assert_eq!(
        first["prompt_tokens_details"]["cached_tokens"], 0,
        "a cold cache: {first}"
    );
    let second = chat("And what is 23*29?");
    let cached = second["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = second["prompt_tokens"].as_u64().unwrap();
    assert!(cached >= 200, "the shared system prompt is cached: {second}");
    assert!(
        cached < prompt && cached % 16 == 0,
        "whole blocks, never the whole prompt: {second}"
    );
    assert_eq!(metric_value(&sim, "vllm:prefix_cache_hits_total"), cached as f64);
    let queried = first["prompt_tokens"].as_u64().unwrap() + prompt;
    assert_eq!(metric_value(&sim, "vllm:prefix_cache_queries_total"), queried as f64);
    let off = ds(&["--enable-prompt-tokens-details", "--no-enable-prefix-caching"], &[]);
    for _ in 0..2 {
        let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}], "max_tokens": 4});
        let u = post_json(off.addr(), "/v1/chat/completions", &body).json()["usage"].clone();
        assert_eq!(
            u["prompt_tokens_details"]["cached_tokens"], 0,
            "prefix caching off: {u}"
        );
    }
}
