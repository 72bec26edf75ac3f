//! Generations that lose their rank group (docs/resume.md), in front of supervised vllm-sim
//! ranks: a non-streaming request in flight when rank 0 is SIGKILLed is sent again once the
//! group is Ready and answered 200 — the same answer as without the fault, since nothing of
//! it had reached the client; a temperature-0 stream whose rank 0 is SIGKILLed after 40 chunks
//! is continued and ends as it would have without the fault (one chunk id, one finish,
//! `[DONE]`, no error event), on both profiles.

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0})
}

/// The answer's text, without what differs between two runs (ids, times).
fn text_of(body: &Value) -> (Value, Value, Value) {
    let message = &body["choices"][0]["message"];
    (
        message["content"].clone(),
        message["reasoning"].clone(),
        body["choices"][0]["finish_reason"].clone(),
    )
}

#[test]
fn a_non_streaming_request_in_flight_at_sigkill_of_rank_0_answers_200() {
    // Slow decoding: the request is still inside vLLM when its rank dies.
    let gw = TestGateway::builder(SIM).envs(&[("SIM_SPEED", "1")]).start();
    let body = chat("explain tensor parallelism", 200);
    let addr = gw.addr;
    let post = move |b: &Value| {
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", "application/json")],
            b.to_string().as_bytes(),
        )
    };
    let clean = post(&body);
    assert_eq!(clean.status, 200, "{}", clean.text());

    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let pid = gw.rank0_pid();
    let in_flight = {
        let body = body.clone();
        std::thread::spawn(move || post(&body))
    };
    gw.wait_status("the request running", |s| s["admission"]["in_flight"] == 1);
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let r = in_flight.join().unwrap();
    assert_eq!(
        r.status,
        200,
        "re-run after the restart: {}\n{}",
        r.text(),
        gw.proc.log().join("\n")
    );
    assert_eq!(
        text_of(&r.json()),
        text_of(&clean.json()),
        "the same answer as without the fault"
    );
    let s = gw.wait_status("serving again", |s| s["supervisor"]["state"] == "ready");
    assert_eq!(s["supervisor"]["restarts"], 1, "one restart: {s}");
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.lines().any(|l| l == "sparkgate_poison_suspects_total 1"),
        "vLLM held the request when its rank died (a suspect, then answered):\n{metrics}"
    );
}

/// What a client reads of a chat stream: reasoning, content, the tool calls' names and
/// arguments, the finish, the chunk ids, error events, and whether `[DONE]` ended it.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    reasoning: String,
    content: String,
    tools: Vec<(String, String)>,
    finish: Option<String>,
    ids: Vec<String>,
    errors: Vec<String>,
    done: bool,
}

impl Answer {
    fn of(raw: &[u8]) -> Answer {
        let events = sse::events(raw);
        let mut a = Answer {
            done: events.last().is_some_and(sse::is_done),
            ..Answer::default()
        };
        for chunk in events.iter().filter(|e| !sse::is_done(e)).map(sse::json) {
            if chunk.get("error").is_some() {
                a.errors.push(chunk.to_string());
                continue;
            }
            if let Some(id) = chunk["id"].as_str().filter(|id| !a.ids.iter().any(|i| i == id)) {
                a.ids.push(id.to_owned());
            }
            let choice = &chunk["choices"][0];
            a.reasoning += choice["delta"]["reasoning"].as_str().unwrap_or("");
            a.content += choice["delta"]["content"].as_str().unwrap_or("");
            for t in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let i = t["index"].as_u64().unwrap_or(0) as usize;
                if a.tools.len() <= i {
                    a.tools.resize(i + 1, Default::default());
                }
                a.tools[i].0 += t["function"]["name"].as_str().unwrap_or("");
                a.tools[i].1 += t["function"]["arguments"].as_str().unwrap_or("");
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                a.finish = Some(f.to_owned());
            }
        }
        a
    }

    /// What must be the same with and without the fault.
    fn text(&self) -> (&str, &str, &[(String, String)], Option<&str>) {
        (&self.reasoning, &self.content, &self.tools, self.finish.as_deref())
    }
}

/// Reads a stream of `body` from `gw`'s `path`; after `after` events, `fault` runs once. The
/// raw stream.
fn raw_with_fault(gw: &Gateway, path: &str, body: &Value, after: usize, fault: impl FnOnce()) -> Vec<u8> {
    let mut s = Streaming::post_json(gw.addr, path, body);
    let (mut raw, mut fault) = (Vec::new(), Some(fault));
    while let Some(chunk) = s.next_chunk() {
        raw.extend(chunk);
        if sse::events(&raw).len() >= after {
            if let Some(f) = fault.take() {
                f();
            }
        }
    }
    assert!(fault.is_none() || after == usize::MAX, "the fault ran mid-stream");
    raw
}

/// A chat stream read with `fault` after `after` events: the answer and how many events it had.
fn stream_with_fault(gw: &Gateway, body: &Value, after: usize, fault: impl FnOnce()) -> (Answer, usize) {
    let raw = raw_with_fault(gw, "/v1/chat/completions", body, after, fault);
    (Answer::of(&raw), sse::events(&raw).len())
}

fn kill_rank0(gw: &Gateway) {
    let pid = gw.rank0_pid();
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

fn continued_after_sigkill(profile: &str) {
    // Slow decoding: the kill lands while most of the answer is still to come.
    let gw = TestGateway::builder(SIM)
        .profile(profile)
        .envs(&[("SIM_SPEED", "0.3")])
        .start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let body = json!({"messages": [{"role": "user", "content": "explain tensor parallel decode"}],
        "max_tokens": 200, "temperature": 0, "stream": true});
    let (whole, events) = stream_with_fault(&gw, &body, usize::MAX, || {});
    assert!(
        whole.done && whole.errors.is_empty() && whole.finish.is_some(),
        "{whole:?}"
    );
    // After 40 chunks; GLM's DFlash speculation puts several tokens in a chunk, so its 200
    // tokens may come in fewer: then halfway.
    let after = 40.min(events / 2);
    let (cut, _) = stream_with_fault(&gw, &body, after, || kill_rank0(&gw));
    let log = gw.proc.log().join("\n");
    assert!(cut.errors.is_empty(), "{profile}: no error event: {cut:?}\n{log}");
    assert!(cut.done, "{profile}: [DONE] ends it");
    assert_eq!(cut.ids.len(), 1, "{profile}: one chunk id: {:?}", cut.ids);
    assert_eq!(
        cut.text(),
        whole.text(),
        "{profile}: the continued answer is the uninterrupted one"
    );
    let s = gw.wait_status("serving again", |s| s["supervisor"]["state"] == "ready");
    assert_eq!(
        s["supervisor"]["restarts"], 1,
        "{profile}: the kill restarted the group: {s}"
    );
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.lines().any(|l| l == "sparkgate_stream_resumes_total 1"),
        "{metrics}"
    );
}

#[test]
fn a_stream_whose_rank_0_is_sigkilled_after_40_chunks_ends_as_without_the_fault_deepseek() {
    continued_after_sigkill("deepseek-v4.1-flash");
}

#[test]
fn a_stream_whose_rank_0_is_sigkilled_after_40_chunks_ends_as_without_the_fault_glm() {
    continued_after_sigkill("glm-5.3-flash");
}

/// What a client reads of a Messages or Responses stream: the text of each block or item part
/// in order, the end, the ids that name the answer, error events, and the usage it ended with.
#[derive(Debug, Default, PartialEq)]
struct Events {
    texts: Vec<(String, String)>,
    end: Option<String>,
    ids: Vec<String>,
    errors: Vec<String>,
    output_tokens: Option<u64>,
    /// Responses: the sequence numbers are 0, 1, 2, …
    in_sequence: bool,
}

impl Events {
    fn of(raw: &[u8]) -> Events {
        let mut out = Events {
            in_sequence: true,
            ..Events::default()
        };
        for (n, e) in sse::events(raw).iter().enumerate() {
            let d = sse::json(e);
            let kind = d["type"].as_str().unwrap_or(&e.event).to_owned();
            if kind == "error" {
                out.errors.push(e.data.clone());
            }
            if let Some(seq) = d["sequence_number"].as_u64() {
                out.in_sequence &= seq == n as u64;
            }
            let id = d["message"]["id"].as_str().or(d["response"]["id"].as_str());
            if let Some(id) = id.filter(|id| !out.ids.iter().any(|i| i == id)) {
                out.ids.push(id.to_owned());
            }
            let (place, text) = match kind.as_str() {
                "content_block_delta" => {
                    let delta = &d["delta"];
                    let text = ["text", "thinking", "partial_json"]
                        .iter()
                        .find_map(|f| delta[*f].as_str());
                    (format!("{}/{}", d["index"], delta["type"]), text)
                }
                k if k.ends_with(".delta") => (
                    format!("{k}/{}/{}", d["output_index"], d["content_index"]),
                    d["delta"].as_str(),
                ),
                _ => (String::new(), None),
            };
            if let Some(text) = text {
                match out.texts.iter_mut().find(|(p, _)| *p == place) {
                    Some((_, t)) => t.push_str(text),
                    None => out.texts.push((place, text.to_owned())),
                }
            }
            match kind.as_str() {
                "message_delta" => {
                    out.end = d["delta"]["stop_reason"].as_str().map(str::to_owned);
                    out.output_tokens = d["usage"]["output_tokens"].as_u64();
                }
                "response.completed" | "response.incomplete" => {
                    out.end = Some(kind.clone());
                    out.output_tokens = d["response"]["usage"]["output_tokens"].as_u64();
                }
                _ => {}
            }
        }
        out
    }
}

fn replayed_after_sigkill(path: &str, body: Value) {
    let gw = TestGateway::builder(SIM).envs(&[("SIM_SPEED", "0.3")]).start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let whole_raw = raw_with_fault(&gw, path, &body, usize::MAX, || {});
    let whole = Events::of(&whole_raw);
    assert!(
        whole.errors.is_empty() && whole.end.is_some(),
        "{whole:?}: {}",
        String::from_utf8_lossy(&whole_raw)
    );
    let after = 40.min(sse::events(&whole_raw).len() / 2);
    assert!(
        whole.texts.len() >= 2,
        "{path}: a reasoning block and a text block: {whole:?}"
    );
    let cut = Events::of(&raw_with_fault(&gw, path, &body, after, || kill_rank0(&gw)));
    let log = gw.proc.log().join("\n");
    assert!(cut.errors.is_empty(), "{path}: no error event: {cut:?}\n{log}");
    assert_eq!(cut.ids.len(), 1, "{path}: one id names the answer: {:?}", cut.ids);
    assert!(cut.in_sequence, "{path}: one sequence of events");
    assert_eq!(
        (&cut.texts, &cut.end, cut.output_tokens),
        (&whole.texts, &whole.end, whole.output_tokens),
        "{path}: the replayed answer is the uninterrupted one"
    );
    let s = gw.wait_status("serving again", |s| s["supervisor"]["state"] == "ready");
    assert_eq!(
        s["supervisor"]["restarts"], 1,
        "{path}: the kill restarted the group: {s}"
    );
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.lines().any(|l| l == "sparkgate_stream_resumes_total 1"),
        "{metrics}"
    );
}

#[test]
fn a_temperature_0_messages_stream_whose_rank_0_is_sigkilled_is_replayed_past_the_cut() {
    let body = json!({"model": MODEL, "max_tokens": 200, "temperature": 0, "stream": true,
        "messages": [{"role": "user", "content": "explain tensor parallel decode"}]});
    replayed_after_sigkill("/v1/messages", body);
}

#[test]
fn a_temperature_0_responses_stream_whose_rank_0_is_sigkilled_is_replayed_past_the_cut() {
    let body = json!({"model": MODEL, "max_output_tokens": 200, "temperature": 0, "stream": true,
        "input": "explain tensor parallel decode"});
    replayed_after_sigkill("/v1/responses", body);
}
