//! The exact continuation of a cut generation, judged by each real frontend (docs/resume.md).
//! A chat stream read with `return_token_ids` is cut after k chunks and continued through
//! vLLM's own scale-out routes (the plan passes `--enable-scale-out`): `/render` gives the
//! prompt's token ids, `/inference/v1/generate` runs the prompt plus the emitted ids, and the
//! streaming `/derender` parses the new tokens with the stream state of the emitted ones. The
//! spliced answer must equal the uninterrupted one — reasoning and content split where they
//! were, a tool call cut in its arguments still one call with its id — on both releases, both
//! profiles, thinking on and off. The fixture's fake engine continues its own output as a model
//! does at temperature 0 (tests/realvllm/fixture.py).

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::http::{post_json, Streaming};
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::sse;

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
fn stream(vllm: &RealVllm, path: &str, body: &Value) -> Vec<Value> {
    let raw = Streaming::post_json(vllm.addr, path, body).read_all();
    let events = sse::events(&raw);
    assert!(
        events.last().is_some_and(sse::is_done),
        "{path} ends with [DONE]: {}",
        String::from_utf8_lossy(&raw)
    );
    events.iter().filter(|e| !sse::is_done(e)).map(sse::json).collect()
}

fn ok_json(vllm: &RealVllm, path: &str, body: &Value) -> Value {
    let r = post_json(vllm.addr, path, body);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

/// Where the stream is cut.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// After this many chunks.
    After(usize),
    /// After the first chunk that carries tool-call arguments.
    InToolArguments,
}

/// The generated token ids of `chunks`, the count of each chunk that had some, and the tool
/// call ids they streamed: the derender's stream state for the emitted part.
fn state_of(chunks: &[Value]) -> Value {
    let (mut ids, mut lens, mut tool_ids) = (Vec::new(), Vec::new(), Vec::new());
    for choice in chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
    {
        let got: Vec<u64> = choice["token_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .collect();
        if !got.is_empty() {
            lens.push(got.len());
            ids.extend(got);
        }
        for t in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            if let Some(id) = t["id"].as_str() {
                tool_ids.push(id.to_owned());
            }
        }
    }
    json!({"role_sent": true, "output_token_ids": ids, "output_chunk_lens": lens,
           "tools_streamed": !tool_ids.is_empty(), "last_tool_call_ids": tool_ids})
}

/// Runs `body` whole, then cut at `cut` and continued; asserts the prompts are token-exact and
/// returns (uninterrupted, resumed).
fn cut_and_continue(vllm: &RealVllm, body: &Value, cut: Cut) -> (Answer, Answer) {
    let mut traced = body.clone();
    traced["return_token_ids"] = json!(true);
    let chunks = stream(vllm, "/v1/chat/completions", &traced);
    let prompt: Vec<u64> = chunks[0]["prompt_token_ids"]
        .as_array()
        .expect("the first chunk carries the prompt's ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let at = match cut {
        Cut::After(n) => n,
        Cut::InToolArguments => {
            let first = chunks
                .iter()
                .position(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].is_string())
                .expect("a tool call with arguments");
            first + 1
        }
    };
    let emitted = &chunks[..at.min(chunks.len())];
    let state = state_of(emitted);

    let mut generate = ok_json(vllm, "/v1/chat/completions/render", body);
    let rendered: Vec<u64> = generate["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(
        rendered, prompt,
        "/render gives the stream's own prompt, token for token"
    );
    let out_ids: Vec<u64> = state["output_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let mut continued = prompt.clone();
    continued.extend(&out_ids);
    generate["token_ids"] = json!(continued);
    let max = generate["sampling_params"]["max_tokens"]
        .as_u64()
        .expect("render sets max_tokens");
    generate["sampling_params"]["max_tokens"] = json!(max - out_ids.len() as u64);
    generate["stream"] = json!(true);
    generate["return_token_ids"] = json!(true);
    let generated = stream(vllm, "/inference/v1/generate", &generate);
    assert_eq!(
        generated[0]["prompt_token_ids"],
        json!(continued),
        "the continuation's prompt is the original prompt plus the emitted tokens"
    );

    let mut state = state;
    let mut resumed = emitted.to_vec();
    for chunk in generated {
        let d = ok_json(
            vllm,
            "/v1/chat/completions/derender",
            &json!({"stream": true, "generate_chunk": chunk, "stream_state": state,
                    "prompt_token_ids": prompt, "prompt_tokens": prompt.len(), "chat_request": body}),
        );
        state = d["stream_state"].clone();
        resumed.push(d["chunk"].clone());
    }
    (Answer::of(&chunks), Answer::of(&resumed))
}

fn model(vllm: &RealVllm) -> String {
    let r = sparkgate_tests::http::request(vllm.addr, "GET", "/v1/models", &[], b"");
    r.json()["data"][0]["id"].as_str().expect("a served model").to_owned()
}

fn chat(model: &str, content: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}],
           "max_tokens": 200, "temperature": 0, "stream": true})
}

fn exact_continuations(release: VllmRelease, profile: ProfileId) {
    let vllm = RealVllm::start(release, profile);
    let model = model(&vllm);
    let thinking = chat(&model, "Explain tensor parallel decode in detail please");
    let mut plain = thinking.clone();
    plain["chat_template_kwargs"] = json!({"thinking": false, "enable_thinking": false});
    let mut tool = chat(&model, "call get_weather for Paris now");
    tool["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]);
    let cases = [
        ("thinking, cut before any token", &thinking, Cut::After(1)),
        ("thinking, cut in the reasoning", &thinking, Cut::After(20)),
        ("thinking, cut in the content", &thinking, Cut::After(80)),
        ("thinking off, cut in the content", &plain, Cut::After(20)),
        ("a tool call cut in its arguments", &tool, Cut::InToolArguments),
    ];
    for (what, body, cut) in cases {
        let (whole, mut resumed) = cut_and_continue(&vllm, body, cut);
        let label = format!("{} {profile:?}: {what}", release.version());
        assert!(whole.finish.is_some(), "{label}: the uninterrupted answer finished");
        if !matches!(cut, Cut::InToolArguments) {
            // A call that begins after the cut gets its own id, as every call does (random).
            for (call, was) in resumed.tools.iter_mut().zip(&whole.tools) {
                call.0.clone_from(&was.0);
            }
        }
        assert_eq!(
            resumed, whole,
            "{label}: the continued answer equals the uninterrupted one"
        );
    }
    let (whole, _) = cut_and_continue(&vllm, &thinking, Cut::After(20));
    assert!(
        !whole.reasoning.is_empty() && !whole.content.is_empty(),
        "the thinking case has both parts"
    );
    let (whole, _) = cut_and_continue(&vllm, &tool, Cut::InToolArguments);
    assert_eq!(whole.tools.len(), 1, "the tool case makes one call: {whole:?}");
}

#[test]
fn continuations_are_exact_on_0_33_deepseek() {
    exact_continuations(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash);
}

#[test]
fn continuations_are_exact_on_0_33_glm() {
    exact_continuations(VllmRelease::V0_33, ProfileId::Glm53Flash);
}

#[test]
fn continuations_are_exact_on_0_34_deepseek() {
    exact_continuations(VllmRelease::V0_34, ProfileId::DeepSeekV41Flash);
}

#[test]
fn continuations_are_exact_on_0_34_glm() {
    exact_continuations(VllmRelease::V0_34, ProfileId::Glm53Flash);
}
