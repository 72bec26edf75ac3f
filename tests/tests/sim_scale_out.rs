//! vllm-sim's scale-out routes (`--enable-scale-out`) continue a cut stream exactly, as
//! `tests/resume_real.rs` shows the real frontends do: a chat stream read with
//! `return_token_ids` is cut, `/render` gives the prompt's ids (the stream's own), a fresh
//! rank's `/inference/v1/generate` runs the prompt plus the emitted ids, and the streaming
//! `/derender` parses the new tokens with the state of the emitted ones. The spliced answer
//! equals the uninterrupted one on both releases and both profiles — thinking on and off, cut
//! before any token, in the reasoning, in the content, before a tool call and after its name —
//! and a completions stream continues alike. Without the flag every route answers 403.

use serde_json::{json, Value};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{post_json, request, Streaming};
use sparkgate_tests::sse;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const RELEASES: [&str; 2] = ["0.33.0", "0.34.0"];

/// A profile's served name and flags, as the launch plan gives them.
fn profile_args(glm: bool) -> (&'static str, Vec<&'static str>) {
    if glm {
        (
            "GLM-5.3-Flash-EXL3",
            vec![
                "/glm",
                "--served-model-name",
                "GLM-5.3-Flash-EXL3",
                "--reasoning-parser",
                "glm45",
                "--tool-call-parser",
                "glm47",
                "--enable-auto-tool-choice",
            ],
        )
    } else {
        (
            "DeepSeek-v4.1-Flash-EXL3",
            vec![
                "/model",
                "--served-model-name",
                "DeepSeek-v4.1-Flash-EXL3",
                "--reasoning-parser",
                "deepseek_v41",
                "--tool-call-parser",
                "deepseek_v41",
                "--enable-auto-tool-choice",
            ],
        )
    }
}

/// A rank of `release` serving the profile, with the scale-out routes.
fn sim(glm: bool, release: &str, extra: &[&str]) -> Sim {
    let (_, mut args) = profile_args(glm);
    args.extend([
        "--enable-scale-out",
        "--vllm-version",
        release,
        "--max-model-len",
        "16384",
    ]);
    args.extend(extra);
    Sim::start(SIM, &args, &[])
}

/// What a client reads from a chat stream's chunks.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    reasoning: String,
    content: String,
    /// Each call's id, name and arguments, by index.
    tools: Vec<(String, String, String)>,
    finish: Option<String>,
}

impl Answer {
    fn of(chunks: &[Value]) -> Answer {
        let mut a = Answer::default();
        for choice in chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        {
            let d = &choice["delta"];
            a.reasoning += d["reasoning"].as_str().unwrap_or("");
            a.content += d["content"].as_str().unwrap_or("");
            for t in d["tool_calls"].as_array().into_iter().flatten() {
                let i = t["index"].as_u64().expect("a tool call delta has its index") as usize;
                if a.tools.len() <= i {
                    a.tools.resize(i + 1, Default::default());
                }
                let call = &mut a.tools[i];
                if let Some(id) = t["id"].as_str() {
                    call.0 = id.to_owned();
                }
                call.1 += t["function"]["name"].as_str().unwrap_or("");
                call.2 += t["function"]["arguments"].as_str().unwrap_or("");
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                a.finish = Some(f.to_owned());
            }
        }
        a
    }
}

/// The JSON chunks of an OpenAI-style stream, up to `[DONE]`.
fn stream(s: &Sim, path: &str, body: &Value) -> Vec<Value> {
    let raw = Streaming::post_json(s.addr(), path, body).read_all();
    let events = sse::events(&raw);
    assert!(
        events.last().is_some_and(sse::is_done),
        "{path} ends with [DONE]: {}",
        String::from_utf8_lossy(&raw)
    );
    events.iter().filter(|e| !sse::is_done(e)).map(sse::json).collect()
}

fn ok_json(s: &Sim, path: &str, body: &Value) -> Value {
    let r = post_json(s.addr(), path, body);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().into_iter().flatten().filter_map(Value::as_u64).collect()
}

/// Where a chat stream is cut, found in the uninterrupted stream.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// After the role chunk only.
    BeforeAnyToken,
    /// Halfway through the reasoning chunks.
    InReasoning,
    /// A few chunks into the content.
    InContent,
    /// Right before the chunk that names the tool call.
    BeforeTool,
    /// Right after the chunk that names the tool call (its id streamed, its arguments not).
    AfterToolName,
}

/// How many chunks of `chunks` the client had when the stream was cut at `cut`.
fn cut_at(chunks: &[Value], cut: Cut) -> usize {
    let first = |pred: &dyn Fn(&Value) -> bool| {
        chunks
            .iter()
            .position(|c| pred(&c["choices"][0]["delta"]))
            .unwrap_or_else(|| panic!("{cut:?}: no such chunk in {chunks:?}"))
    };
    match cut {
        Cut::BeforeAnyToken => 1,
        Cut::InReasoning => {
            let start = first(&|d| d["reasoning"].is_string());
            let count = chunks
                .iter()
                .filter(|c| c["choices"][0]["delta"]["reasoning"].is_string())
                .count();
            start + count / 2
        }
        Cut::InContent => first(&|d| d["content"].as_str().is_some_and(|s| !s.is_empty())) + 5,
        Cut::BeforeTool => first(&|d| d["tool_calls"].is_array()),
        Cut::AfterToolName => first(&|d| d["tool_calls"].is_array()) + 1,
    }
}

/// The derender's stream state for the emitted chunks: their ids, each chunk's count, the tool
/// call ids they streamed.
fn state_of(chunks: &[Value]) -> Value {
    let (mut out, mut lens, mut tool_ids) = (Vec::new(), Vec::new(), Vec::new());
    for choice in chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
    {
        let got = ids(&choice["token_ids"]);
        if !got.is_empty() {
            lens.push(got.len());
            out.extend(got);
        }
        for t in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            if let Some(id) = t["id"].as_str() {
                tool_ids.push(id.to_owned());
            }
        }
    }
    json!({"role_sent": true, "output_token_ids": out, "output_chunk_lens": lens,
           "tools_streamed": !tool_ids.is_empty(), "last_tool_call_ids": tool_ids})
}

/// The uninterrupted answer to `body` from `first`, and the answer cut at `cut` and continued
/// through `second` (a rank that never saw the request).
fn cut_and_continue(first: &Sim, second: &Sim, body: &Value, cut: Cut) -> (Answer, Answer) {
    let mut traced = body.clone();
    traced["return_token_ids"] = json!(true);
    let chunks = stream(first, "/v1/chat/completions", &traced);
    let prompt = ids(&chunks[0]["prompt_token_ids"]);
    assert!(!prompt.is_empty(), "the first chunk carries the prompt's ids");
    let emitted = &chunks[..cut_at(&chunks, cut).min(chunks.len())];
    let mut state = state_of(emitted);
    let out = ids(&state["output_token_ids"]);

    let mut generate = ok_json(second, "/v1/chat/completions/render", body);
    assert_eq!(
        ids(&generate["token_ids"]),
        prompt,
        "/render gives the stream's prompt, token for token"
    );
    let continued: Vec<u64> = prompt.iter().chain(&out).copied().collect();
    generate["token_ids"] = json!(continued);
    let max = generate["sampling_params"]["max_tokens"]
        .as_u64()
        .expect("render sets max_tokens");
    generate["sampling_params"]["max_tokens"] = json!(max - out.len() as u64);
    generate["stream"] = json!(true);
    generate["return_token_ids"] = json!(true);
    let generated = stream(second, "/inference/v1/generate", &generate);
    assert_eq!(
        ids(&generated[0]["prompt_token_ids"]),
        continued,
        "the continuation's prompt is the original prompt plus the emitted tokens"
    );
    let mut resumed = emitted.to_vec();
    for chunk in generated {
        let d = ok_json(
            second,
            "/v1/chat/completions/derender",
            &json!({"stream": true, "generate_chunk": chunk, "stream_state": state,
                    "prompt_token_ids": prompt, "prompt_tokens": prompt.len(), "chat_request": body}),
        );
        state = d["stream_state"].clone();
        resumed.push(d["chunk"].clone());
    }
    (Answer::of(&chunks), Answer::of(&resumed))
}

fn chat(model: &str, content: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}],
           "max_tokens": 1000, "temperature": 0, "stream": true})
}

fn exact_continuations(release: &str, glm: bool) {
    let (model, _) = profile_args(glm);
    let (first, second) = (sim(glm, release, &[]), sim(glm, release, &[]));
    let thinking = chat(model, "Explain tensor parallel decode in detail please");
    let mut plain = thinking.clone();
    plain["chat_template_kwargs"] = json!({"thinking": false, "enable_thinking": false});
    let mut tool = chat(model, "call get_weather for Paris now");
    tool["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]);
    let cases = [
        ("thinking, cut before any token", &thinking, Cut::BeforeAnyToken),
        ("thinking, cut in the reasoning", &thinking, Cut::InReasoning),
        ("thinking, cut in the content", &thinking, Cut::InContent),
        ("thinking off, cut in the content", &plain, Cut::InContent),
        ("a tool call, cut before it", &tool, Cut::BeforeTool),
        ("a tool call, cut after its name", &tool, Cut::AfterToolName),
    ];
    for (what, body, cut) in cases {
        let (whole, mut resumed) = cut_and_continue(&first, &second, body, cut);
        let label = format!("{release} {}: {what}", if glm { "GLM" } else { "DeepSeek" });
        assert!(whole.finish.is_some(), "{label}: the uninterrupted answer finished");
        if !matches!(cut, Cut::AfterToolName) {
            // A call that begins after the cut gets its own id, as every call does (random).
            for (call, was) in resumed.tools.iter_mut().zip(&whole.tools) {
                call.0.clone_from(&was.0);
            }
        }
        assert_eq!(
            resumed, whole,
            "{label}: the continued answer equals the uninterrupted one"
        );
        match body == &tool {
            true => {
                assert_eq!(whole.tools.len(), 1, "{label}: one call: {whole:?}");
                assert_eq!(whole.finish.as_deref(), Some("tool_calls"), "{label}");
                let args: Value = serde_json::from_str(&whole.tools[0].2).expect("JSON arguments");
                assert_eq!(args["city"], "Paris", "{label}");
            }
            false => assert_eq!(whole.finish.as_deref(), Some("stop"), "{label}: {whole:?}"),
        }
    }
    let (whole, _) = cut_and_continue(&first, &second, &thinking, Cut::InContent);
    assert!(
        !whole.reasoning.is_empty() && !whole.content.is_empty(),
        "the thinking case has both parts"
    );
}

#[test]
fn chat_continuations_are_exact_on_0_33_deepseek() {
    exact_continuations(RELEASES[0], false);
}

#[test]
fn chat_continuations_are_exact_on_0_33_glm() {
    exact_continuations(RELEASES[0], true);
}

#[test]
fn chat_continuations_are_exact_on_0_34_deepseek() {
    exact_continuations(RELEASES[1], false);
}

#[test]
fn chat_continuations_are_exact_on_0_34_glm() {
    exact_continuations(RELEASES[1], true);
}

#[test]
fn continuations_are_exact_when_chunks_carry_several_tokens() {
    let spec = [
        "--speculative-config",
        r#"{"method":"dspark","num_speculative_tokens":3}"#,
    ];
    for glm in [false, true] {
        let (model, _) = profile_args(glm);
        let (first, second) = (sim(glm, "0.34.0", &spec), sim(glm, "0.34.0", &spec));
        let mut tool = chat(model, "call get_weather for Paris now");
        tool["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]);
        for (body, cut) in [
            (chat(model, "Explain tensor parallel decode"), Cut::InReasoning),
            (chat(model, "Explain tensor parallel decode"), Cut::InContent),
            (tool, Cut::BeforeTool),
        ] {
            let (whole, mut resumed) = cut_and_continue(&first, &second, &body, cut);
            for (call, was) in resumed.tools.iter_mut().zip(&whole.tools) {
                call.0.clone_from(&was.0);
            }
            assert_eq!(resumed, whole, "glm={glm} {cut:?}");
        }
    }
}

/// A completions stream cut after `k` chunks and continued: (uninterrupted text and finish,
/// resumed text and finish).
fn cut_completion(first: &Sim, second: &Sim, body: &Value, k: usize) -> ((String, Value), (String, Value)) {
    let mut traced = body.clone();
    traced["return_token_ids"] = json!(true);
    let chunks = stream(first, "/v1/completions", &traced);
    let prompt = ids(&chunks[0]["choices"][0]["prompt_token_ids"]);
    let emitted = &chunks[..k.min(chunks.len())];
    let out: Vec<u64> = emitted
        .iter()
        .flat_map(|c| ids(&c["choices"][0]["token_ids"]))
        .collect();
    let render = ok_json(second, "/v1/completions/render", body);
    let mut generate = render[0].clone();
    assert_eq!(ids(&generate["token_ids"]), prompt, "/render gives the stream's prompt");
    let continued: Vec<u64> = prompt.iter().chain(&out).copied().collect();
    generate["token_ids"] = json!(continued);
    // 0.33's render leaves out a `max_tokens` equal to SamplingParams' default (16), and its
    // generate would then run to the context: the client fills it in.
    let max = generate["sampling_params"]["max_tokens"].as_u64().unwrap_or(16);
    generate["sampling_params"]["max_tokens"] = json!(max - out.len() as u64);
    generate["stream"] = json!(true);
    let mut state = Value::Null;
    let mut resumed = emitted.to_vec();
    for chunk in stream(second, "/inference/v1/generate", &generate) {
        let d = ok_json(
            second,
            "/v1/completions/derender",
            &json!({"stream": true, "generate_chunk": chunk, "stream_state": state,
                    "prompt_token_ids": continued, "completion_request": body}),
        );
        state = d["stream_state"].clone();
        resumed.push(d["chunk"].clone());
    }
    let read = |chunks: &[Value]| {
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        let finish = chunks
            .iter()
            .rev()
            .map(|c| c["choices"][0]["finish_reason"].clone())
            .find(|f| !f.is_null());
        (text, finish.unwrap_or(Value::Null))
    };
    (read(&chunks), read(&resumed))
}

#[test]
fn completion_continuations_are_exact() {
    for release in RELEASES {
        for glm in [false, true] {
            let (model, _) = profile_args(glm);
            let (first, second) = (sim(glm, release, &[]), sim(glm, release, &[]));
            let long = json!({"model": model, "prompt": "The gateway admits", "max_tokens": 400, "stream": true});
            let short = json!({"model": model, "prompt": "Once upon a time", "stream": true});
            for (body, k, finish) in [(&long, 1, "stop"), (&long, 30, "stop"), (&short, 7, "length")] {
                let (whole, resumed) = cut_completion(&first, &second, body, k);
                assert_eq!(whole.1, finish, "{release} glm={glm}: {whole:?}");
                assert_eq!(resumed, whole, "{release} glm={glm}: cut after {k} chunks");
            }
        }
    }
}

#[test]
fn without_the_flag_every_scale_out_route_is_forbidden() {
    let (_, args) = profile_args(false);
    let plain = Sim::start(SIM, &args, &[]);
    for path in [
        "/v1/chat/completions/render",
        "/v1/completions/render",
        "/v1/messages/render",
        "/v1/responses/render",
        "/v1/chat/completions/derender",
        "/v1/completions/derender",
        "/inference/v1/generate",
        "/inference/v1/abort_requests",
    ] {
        let r = post_json(plain.addr(), path, &json!({}));
        assert_eq!(r.status, 403, "{path}");
        assert_eq!(
            r.json(),
            json!({"error": {"message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
                             "type": "PermissionDeniedError", "param": null, "code": 403}}),
            "{path}"
        );
        assert_eq!(
            request(plain.addr(), "GET", path, &[], b"").status,
            405,
            "{path} takes POST only"
        );
    }
}

#[test]
fn bad_requests_are_refused_as_vllm_refuses_them() {
    let s = sim(false, "0.34.0", &[]);
    let r = post_json(
        s.addr(),
        "/inference/v1/generate",
        &json!({"token_ids": [], "sampling_params": {}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "1 validation error:\n  {'type': 'too_short', 'loc': 'body.token_ids', 'msg': 'List should have at least 1 item after validation, not 0', 'input': '<list of 0 items>', 'ctx': {'field_type': 'List', 'min_length': 1, 'actual_length': 0}}",
                         "type": "Bad Request", "param": "body.token_ids", "code": 400}})
    );
    let r = post_json(
        s.addr(),
        "/inference/v1/generate",
        &json!({"token_ids": [-1], "sampling_params": {}}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("token_ids must not contain negative values"),
        "{}",
        r.text()
    );
    let r = post_json(
        s.addr(),
        "/inference/v1/generate",
        &json!({"token_ids": [99999999], "sampling_params": {}}),
    );
    assert_eq!(r.json()["error"]["message"], "Token id 99999999 is out of vocabulary");

    let body = chat("DeepSeek-v4.1-Flash-EXL3", "hi");
    let mut generate = ok_json(&s, "/v1/chat/completions/render", &body);
    generate["stream"] = json!(true);
    let chunk = stream(&s, "/inference/v1/generate", &generate).remove(0);
    let r = post_json(
        s.addr(),
        "/v1/chat/completions/derender",
        &json!({"stream": true, "generate_chunk": chunk, "chat_request": body}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "prompt_token_ids is required when a tool or reasoning parser is configured. Without it parse_delta cannot tell whether the prompt left reasoning open (e.g. a chat template that pre-opens <think>) and would misclassify reasoning content as plain content.",
                         "type": "BadRequestError", "param": null, "code": 400}})
    );
    let r = post_json(
        s.addr(),
        "/v1/chat/completions/derender",
        &json!({"stream": true, "generate_chunk": chunk, "chat_request": body, "prompt_token_ids": [1],
                "stream_state": {"output_token_ids": [1, 2], "output_chunk_lens": [1]}}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.text()
            .contains("output_chunk_lens must sum to len(output_token_ids) (got sum=1, len(output_token_ids)=2)"),
        "{}",
        r.text()
    );
}
