//! The gateway continues a cut stream in front of each real frontend (docs/resume.md). A proxy
//! between the gateway and vLLM closes the stream's connection after N events, as a rank's
//! death would; vLLM itself lives on, so its render, tokens-in generate and derender — and the
//! fixture's engine, which continues its own plans — judge the gateway's continuation. The
//! client's answer must be the uninterrupted one: the same reasoning and content, one chunk id,
//! one finish, `[DONE]`, no error event.

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::cutproxy::CutProxy;
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::realvllm::{plan_argv, RealVllm};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// What a client reads from a chat stream.
#[derive(Debug, PartialEq)]
struct Read {
    reasoning: String,
    content: String,
    tools: Vec<(String, String)>,
    finish: Option<String>,
    ids: Vec<String>,
    errors: usize,
    done: bool,
}

fn read(gw: &Gateway, body: &Value) -> Read {
    let raw = Streaming::post_json(gw.addr, "/v1/chat/completions", body).read_all();
    let events = sse::events(&raw);
    let mut r = Read {
        reasoning: String::new(),
        content: String::new(),
        tools: Vec::new(),
        finish: None,
        ids: Vec::new(),
        errors: 0,
        done: events.last().is_some_and(sse::is_done),
    };
    for e in events.iter().filter(|e| !sse::is_done(e)) {
        let chunk = sse::json(e);
        if chunk.get("error").is_some() {
            r.errors += 1;
            continue;
        }
        if let Some(id) = chunk["id"].as_str() {
            if !r.ids.iter().any(|i| i == id) {
                r.ids.push(id.to_owned());
            }
        }
        assert!(
            chunk["choices"]
                .as_array()
                .is_some_and(|c| c.iter().all(|c| c["token_ids"].is_null())),
            "the client did not ask for token ids: {chunk}"
        );
        let choice = &chunk["choices"][0];
        r.reasoning += choice["delta"]["reasoning"].as_str().unwrap_or("");
        r.content += choice["delta"]["content"].as_str().unwrap_or("");
        for t in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().unwrap() as usize;
            if r.tools.len() <= i {
                r.tools.resize(i + 1, Default::default());
            }
            r.tools[i].0 += t["function"]["name"].as_str().unwrap_or("");
            r.tools[i].1 += t["function"]["arguments"].as_str().unwrap_or("");
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            r.finish = Some(f.to_owned());
        }
    }
    r
}

fn metric(gw: &Gateway, name: &str) -> f64 {
    let text = request(gw.addr, "GET", "/metrics", &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn continued_in_front_of(release: VllmRelease, profile: ProfileId) {
    // 10 ms engine steps: the cut lands mid-stream, long before the answer's end.
    let real = RealVllm::start_with(release, profile, &plan_argv(profile, None), &[("FAKE_STEP_S", "0.01")]);
    let proxy = CutProxy::start(real.addr);
    let gw = TestGateway::builder(SIM)
        .profile(profile.as_str())
        .upstream(proxy.addr)
        .start();
    let model = request(real.addr, "GET", "/v1/models", &[], b"").json()["data"][0]["id"].clone();
    let thinking = json!({"model": model, "messages": [{"role": "user", "content": "Explain tensor parallel decode in detail please"}],
        "max_tokens": 200, "temperature": 0, "stream": true});
    let mut tool = thinking.clone();
    tool["messages"][0]["content"] = json!("call get_weather for Paris now");
    tool["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    for (what, body, cut) in [
        ("thinking, cut in the reasoning", &thinking, 20),
        ("thinking, cut in the content", &thinking, 90),
        ("a tool call after the cut", &tool, 30),
    ] {
        let whole = read(&gw, body);
        assert!(
            whole.finish.is_some() && whole.done && whole.errors == 0,
            "{what}: {whole:?}"
        );
        let before = proxy.cuts();
        proxy.cut_next_stream_after(cut);
        let resumed = read(&gw, body);
        assert_eq!(proxy.cuts(), before + 1, "{what}: the stream was cut");
        assert_eq!(
            resumed.errors,
            0,
            "{what}: no error event: {resumed:?}\n{}",
            gw.proc.log().join("\n")
        );
        assert_eq!(
            resumed.ids.len(),
            1,
            "{what}: one chunk id: {resumed:?}\n{}",
            gw.proc.log().join("\n")
        );
        assert!(resumed.done, "{what}: [DONE] ends it");
        assert_eq!(
            (&resumed.reasoning, &resumed.content, &resumed.tools, &resumed.finish),
            (&whole.reasoning, &whole.content, &whole.tools, &whole.finish),
            "{what} ({release:?} {profile:?}): the continued answer is the uninterrupted one"
        );
    }
    assert_eq!(metric(&gw, "sparkgate_stream_resumes_total"), 3.0);
}

#[test]
fn a_cut_stream_is_continued_exactly_in_front_of_0_33_deepseek() {
    continued_in_front_of(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash);
}

#[test]
fn a_cut_stream_is_continued_exactly_in_front_of_0_34_glm() {
    continued_in_front_of(VllmRelease::V0_34, ProfileId::Glm53Flash);
}
