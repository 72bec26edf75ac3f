//! `POST /v1/responses` for plain turns (text in, text or a function call out), non-streaming
//! and as the `event: …` / `data: …` event sequence agent frameworks consume.

mod checks;
pub(crate) mod input;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::chat::{now_secs, sse_response, with_request_id};
use super::generate::{ChoicePlan, Job, Step};
use super::request::{self, invalid};
use super::{internal_error, json_response, ApiError, App, Shared};
use crate::sim::count::ChatPrompt;
use crate::sim::structured::Constraint;
use crate::sim::{model, prompt, vocab};

/// Responses `input` (plus `instructions`) as chat messages.
fn messages(req: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(Value::String(i)) = req.get("instructions") {
        out.push(json!({"role": "system", "content": i}));
    }
    match req.get("input") {
        Some(Value::String(s)) => out.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call_output") => out.push(json!({"role": "tool", "content": item.get("output").cloned().unwrap_or(Value::Null)})),
                    Some("function_call") | Some("reasoning") => {}
                    _ => out.push(json!({"role": item.get("role").cloned().unwrap_or(json!("user")), "content": item.get("content").cloned().unwrap_or(Value::Null)})),
                }
            }
        }
        // `input` is `str | list[...]`: pydantic reports both branches.
        Some(other) => {
            return Err(super::pydantic::to_error(&[
                super::pydantic::PyErr::new("string_type", "body.input", "Input should be a valid string", other),
                super::pydantic::PyErr::new("list_type", "body.input", "Input should be a valid list", other),
            ]))
        }
        None => {
            return Err(invalid(
                "missing",
                "input",
                "Field required",
                &Value::Object(req.clone()),
            ))
        }
    }
    Ok(out)
}

/// A Responses function tool as the chat tool vLLM renders (`name`, `description` and
/// `parameters` under `function`).
fn chat_tool(t: &Value) -> Value {
    let mut function = t.as_object().cloned().unwrap_or_default();
    function.remove("type");
    json!({"type": "function", "function": function})
}

struct Turn {
    id: String,
    created: u64,
    model: String,
    msg_id: String,
    rs_id: String,
    call_id: String,
    fc_id: String,
    max_output_tokens: u64,
    /// The request's tools, echoed with vLLM's defaults for the keys not given.
    tools: Value,
    tool_choice: Value,
    /// The request fields the object echoes, as it echoes them.
    echo: Vec<(&'static str, Value)>,
    /// `include_reasoning: false`: no reasoning item in the output.
    include_reasoning: bool,
}

impl Turn {
    /// The ids and echoes of the response to `req`; the item ids are fresh.
    fn new(
        app: &App,
        req: &Map<String, Value>,
        request_id: &str,
        tools: Option<&[Value]>,
        max_output_tokens: u64,
    ) -> Turn {
        Turn {
            id: format!("resp_{request_id}"),
            created: now_secs(),
            model: app.args.served_name().to_owned(),
            msg_id: format!("msg_{}", request::random_hex(16)),
            rs_id: format!("rs_{}", request::random_hex(16)),
            call_id: format!("chatcmpl-tool-{}", request::random_hex(16)),
            fc_id: format!("fc_{}", request::random_hex(16)),
            max_output_tokens,
            tools: Value::Array(tools.iter().copied().flatten().map(echo_tool).collect()),
            tool_choice: req
                .get("tool_choice")
                .cloned()
                .unwrap_or_else(|| json!(if tools.is_some() { "auto" } else { "none" })),
            echo: echoes(req),
            include_reasoning: req.get("include_reasoning") != Some(&Value::Bool(false)),
        }
    }
}

/// The request's `text` and `reasoning` with vLLM's defaults for the keys not given.
fn echoes(req: &Map<String, Value>) -> Vec<(&'static str, Value)> {
    let text = req.get("text").filter(|t| t.is_object()).map_or(Value::Null, |t| {
        let mut t = t.clone();
        match t.get_mut("format") {
            Some(f) if f.is_object() => {
                for k in ["description", "strict"] {
                    if f.get(k).is_none() {
                        f[k] = Value::Null;
                    }
                }
            }
            _ => t["format"] = Value::Null,
        }
        if t.get("verbosity").is_none() {
            t["verbosity"] = Value::Null;
        }
        t
    });
    let reasoning = req.get("reasoning").filter(|r| r.is_object()).map_or(Value::Null, |r| {
        let mut r = r.clone();
        for k in ["context", "effort", "generate_summary", "mode", "summary"] {
            if r.get(k).is_none() {
                r[k] = Value::Null;
            }
        }
        r
    });
    let given = |k: &str| req.get(k).cloned().unwrap_or(Value::Null);
    vec![
        ("instructions", given("instructions")),
        ("text", text),
        ("reasoning", reasoning),
        ("safety_identifier", given("safety_identifier")),
        ("metadata", given("metadata")),
        ("max_tool_calls", given("max_tool_calls")),
        ("prompt_cache_key", given("prompt_cache_key")),
        ("prompt_cache_retention", given("prompt_cache_retention")),
        ("user", given("user")),
        ("prompt_cache_options", cache_options(req)),
    ]
}

/// `prompt_cache_options` as the response echoes it (`PromptCacheOptions.to_response`,
/// responses/protocol.py): the request's, with its defaults, without `prewarm`.
fn cache_options(req: &Map<String, Value>) -> Value {
    let Some(Value::Object(o)) = req.get("prompt_cache_options") else {
        return Value::Null;
    };
    let or = |k: &str, d: Value| o.get(k).cloned().unwrap_or(d);
    json!({
        "comparison_response_id": or("comparison_response_id", Value::Null),
        "mode": or("mode", json!("implicit")),
        "ttl": or("ttl", json!("30m")),
    })
}

/// A function tool as the Responses object echoes it.
fn echo_tool(t: &Value) -> Value {
    let mut e = json!({"name": t.get("name"), "parameters": t.get("parameters"), "strict": null, "type": "function",
        "description": t.get("description"), "allowed_callers": null, "async": null, "defer_loading": null, "output_schema": null});
    if let Some(strict) = t.get("strict") {
        e["strict"] = strict.clone();
    }
    e
}

fn response_object(turn: &Turn, status: &str, output: Vec<Value>, usage: Value) -> Value {
    let incomplete = if status == "incomplete" {
        json!({"reason": "max_output_tokens"})
    } else {
        Value::Null
    };
    let mut o = json!({
        "id": turn.id, "created_at": turn.created, "incomplete_details": incomplete, "instructions": null, "metadata": null,
        "model": turn.model, "object": "response", "output": output, "parallel_tool_calls": true, "temperature": 1.0,
        "tool_choice": turn.tool_choice, "tools": turn.tools, "top_p": 1.0, "background": false, "max_output_tokens": turn.max_output_tokens,
        "max_tool_calls": null, "previous_response_id": null, "prompt": null, "prompt_cache_options": null, "prompt_cache_key": null,
        "prompt_cache_retention": null, "reasoning": null, "safety_identifier": null, "service_tier": "auto",
        "status": status, "text": null, "top_logprobs": null, "truncation": "disabled", "usage": usage, "user": null,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "kv_transfer_params": null, "ec_transfer_params": null,
        "input_messages": null, "output_messages": null
    });
    for (k, v) in &turn.echo {
        o[*k] = v.clone();
    }
    o
}

fn usage(prompt: usize, cached: usize, completion: usize, reasoning: usize) -> Value {
    json!({"input_tokens": prompt,
           "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0, "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
           "output_tokens": completion,
           "output_tokens_details": {"reasoning_tokens": reasoning, "tool_output_tokens": 0, "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
           "total_tokens": prompt + completion})
}

fn reasoning_item(turn: &Turn, text: &str, status: Value) -> Value {
    json!({"id": turn.rs_id, "summary": [], "type": "reasoning", "content": [{"text": text, "type": "reasoning_text"}], "encrypted_content": null, "status": status})
}

fn message_item(turn: &Turn, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{"annotations": [], "text": text, "type": "output_text", "logprobs": null}])
    };
    json!({"id": turn.msg_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": null})
}

fn call_item(turn: &Turn, name: &str, arguments: &str, status: &str) -> Value {
    json!({"arguments": arguments, "call_id": turn.call_id, "name": name, "type": "function_call", "id": turn.fc_id,
        "async": null, "caller": null, "namespace": null, "status": status})
}

/// The output items of a finished turn. `streamed`: the stream's final object, where the
/// reasoning item carries its status (non-streamed it is null).
fn final_output(turn: &Turn, plan: &ChoicePlan, streamed: bool) -> Vec<Value> {
    let mut output = Vec::new();
    let cut = plan.finish == "length";
    let content = plan.content_text();
    if let Some(r) = plan.reasoning_text().filter(|_| turn.include_reasoning) {
        let status = match (streamed, cut && content.is_empty() && plan.tool_call.is_none()) {
            (false, _) => Value::Null,
            (true, true) => json!("incomplete"),
            (true, false) => json!("completed"),
        };
        output.push(reasoning_item(turn, &r, status));
    }
    match &plan.tool_call {
        Some(call) => output.push(call_item(turn, &call.name, &call.arguments, "completed")),
        None if !content.is_empty() => output.push(message_item(
            turn,
            &content,
            if cut { "incomplete" } else { "completed" },
        )),
        None => {}
    }
    output
}

pub(crate) async fn handle(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let mut req = request::json_object(&headers, &body)?;
    super::before::run(super::before::RESPONSES, &mut req)?;
    // `input_item_parsing` makes any other iterable a list: a mapping becomes its keys.
    if let Some(Value::Object(m)) = req.get("input") {
        let keys = m.keys().cloned().map(Value::String).collect();
        req.insert("input".into(), Value::Array(keys));
    }
    super::before::run(super::before::RESPONSES_FIELDS, &mut req)?;
    super::schema::check_body("/v1/responses", &mut req)?;
    let msgs = messages(&req)?;
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let kwargs = request::template_kwargs(&app, &with_effort(&req))?;
    request::check_model(&app, &req)?;
    if let Some(early) = checks::serving_checks(&app, &req, &msgs, stream)? {
        return Ok(early);
    }
    let max_output_tokens = request::max_tokens(&app, &req, &["max_output_tokens"])?;
    let tools: Option<Vec<Value>> = req
        .get("tools")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
        .cloned();
    let rendering = app.template.render(&kwargs);
    let prompt = prompt::render(
        &msgs,
        tools.as_deref(),
        req.get("tool_choice"),
        &rendering,
        app.template,
    );
    let chat_tools: Option<Vec<Value>> = tools.as_ref().map(|t| t.iter().map(chat_tool).collect());
    let counted = ChatPrompt {
        messages: &msgs,
        tools: chat_tools.as_deref(),
        rendering: &rendering,
        add_generation_prompt: true,
        continue_final: false,
    }
    .ids(app.template);
    let prompt_tokens = counted.len();
    request::check_prompt_length(&app, prompt_tokens)?;
    let budget =
        (app.args.max_model_len as usize - prompt_tokens).min(max_output_tokens.map_or(usize::MAX, |m| m as usize));
    let planned = model::chat(app.template, &prompt, constraint(&req).as_ref());
    let ignore_eos = req.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false);
    let cfg = super::chat::parser_config(
        &app,
        &req,
        &rendering,
        super::chat::Opening::Generation,
        rendering.thinking,
    );
    let plan = ChoicePlan::new(planned, budget, ignore_eos, 0, cfg);
    let request_id = request::request_id(&headers, &req);
    let job = Job::start_tokens(&app, &[counted], &[&prompt], vec![plan])?;
    let max_output_tokens = max_output_tokens.unwrap_or(app.args.max_model_len.saturating_sub(prompt_tokens as u64));
    let turn = Turn::new(&app, &req, &request_id, tools.as_deref(), max_output_tokens);
    if !stream {
        return whole(&app, job, &turn, prompt_tokens, &request_id).await;
    }
    let frames = async_events(job, turn, prompt_tokens);
    Ok(sse_response(&app, &request_id, frames))
}

/// The request as the chat template sees it: `reasoning.effort` reaches it as
/// `reasoning_effort`.
fn with_effort(req: &Map<String, Value>) -> Map<String, Value> {
    let mut chat_like = req.clone();
    if let Some(effort) = req
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    {
        chat_like.insert("reasoning_effort".into(), effort.clone());
    }
    chat_like
}

/// `text.format` constrains the answer like chat's `response_format`.
fn constraint(req: &Map<String, Value>) -> Option<Constraint> {
    let format = req.get("text").and_then(|t| t.get("format"));
    match format.and_then(|f| f.get("type")).and_then(Value::as_str) {
        Some("json_schema") => Some(Constraint::Schema(
            format.and_then(|f| f.get("schema")).cloned().unwrap_or(json!({})),
        )),
        Some("json_object") => Some(Constraint::Object),
        _ => None,
    }
}

/// The whole response object, once the turn is done.
async fn whole(
    app: &Shared,
    mut job: Job,
    turn: &Turn,
    prompt_tokens: usize,
    request_id: &str,
) -> Result<Response, ApiError> {
    job.complete().await.map_err(|msg| internal_error(&msg))?;
    let plan = &job.choices[0];
    let reasoning = plan.reasoning_text().map_or(0, |r| vocab::count_tokens(&r));
    let status = if plan.finish == "length" {
        "incomplete"
    } else {
        "completed"
    };
    let body = response_object(
        turn,
        status,
        final_output(turn, plan, false),
        usage(prompt_tokens, job.cached_tokens, job.completion_tokens(), reasoning),
    );
    Ok(with_request_id(app, request_id, json_response(StatusCode::OK, &body)))
}

/// The streaming event sequence; each frame is `event: <type>\ndata: <json>\n\n`.
fn async_events(job: Job, turn: Turn, prompt_tokens: usize) -> impl futures_util::Stream<Item = Bytes> + Send {
    let mut s = Events {
        job,
        turn,
        seq: 0,
        queue: Default::default(),
        started_reasoning: false,
        started_message: false,
        reasoning: String::new(),
        content: String::new(),
        done: false,
        prompt_tokens,
    };
    let initial = response_object(&s.turn, "in_progress", vec![], Value::Null);
    s.emit("response.created", json!({"response": initial.clone()}));
    s.emit("response.in_progress", json!({"response": initial}));
    futures_util::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(b) = s.queue.pop_front() {
                return Some((b, s));
            }
            if s.done {
                return None;
            }
            match s.job.next().await {
                Some(Step::Delta(_, d)) => {
                    if !d.reasoning.is_empty() && s.turn.include_reasoning {
                        s.reasoning_delta(&d.reasoning);
                    }
                    if !d.content.is_empty() {
                        s.content_delta(&d.content);
                    }
                }
                Some(Step::Failed(msg)) => s.failed(&msg),
                None => s.finished(),
            }
        }
    })
}

/// A streamed turn: the events queued to send, and what the items so far hold.
struct Events {
    job: Job,
    turn: Turn,
    seq: u64,
    queue: std::collections::VecDeque<Bytes>,
    started_reasoning: bool,
    started_message: bool,
    reasoning: String,
    content: String,
    done: bool,
    prompt_tokens: usize,
}

impl Events {
    fn emit(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.queue
            .push_back(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
    }

    fn close_reasoning(&mut self) {
        if self.started_reasoning {
            self.started_reasoning = false;
            let text = self.reasoning.clone();
            self.emit(
                "response.reasoning_text.done",
                json!({"item_id": self.turn.rs_id, "output_index": 0, "content_index": 0, "text": text}),
            );
            let rs = self.turn.rs_id.clone();
            self.emit(
                "response.content_part.done",
                json!({"content_index": 0, "item_id": rs, "output_index": 0, "part": {"text": text, "type": "reasoning_text"}}),
            );
            let status = if self.job.choices[0].finish == "length" && !self.started_message {
                "incomplete"
            } else {
                "completed"
            };
            let item = reasoning_item(&self.turn, &text, json!(status));
            self.emit("response.output_item.done", json!({"item": item, "output_index": 0}));
        }
    }

    fn message_index(&self) -> usize {
        usize::from(!self.reasoning.is_empty())
    }

    /// More reasoning text, opening the reasoning item first.
    fn reasoning_delta(&mut self, delta: &str) {
        if !self.started_reasoning && self.reasoning.is_empty() {
            self.started_reasoning = true;
            let item = json!({"id": self.turn.rs_id, "summary": [], "type": "reasoning", "content": null, "encrypted_content": null, "status": "in_progress"});
            self.emit("response.output_item.added", json!({"item": item, "output_index": 0}));
            let rs = self.turn.rs_id.clone();
            self.emit("response.content_part.added", json!({"content_index": 0, "item_id": rs, "output_index": 0, "part": {"text": "", "type": "reasoning_text"}}));
        }
        self.reasoning.push_str(delta);
        let rs = self.turn.rs_id.clone();
        self.emit(
            "response.reasoning_text.delta",
            json!({"item_id": rs, "output_index": 0, "content_index": 0, "delta": delta}),
        );
    }

    /// More answer text: the reasoning item closes, the message item opens.
    fn content_delta(&mut self, delta: &str) {
        self.close_reasoning();
        let idx = self.message_index();
        if !self.started_message {
            self.started_message = true;
            let item = message_item(&self.turn, "", "in_progress");
            self.emit("response.output_item.added", json!({"item": item, "output_index": idx}));
            let msg = self.turn.msg_id.clone();
            self.emit("response.content_part.added", json!({"item_id": msg, "output_index": idx, "content_index": 0, "part": {"annotations": [], "text": "", "type": "output_text", "logprobs": []}}));
        }
        self.content.push_str(delta);
        let msg = self.turn.msg_id.clone();
        self.emit(
            "response.output_text.delta",
            json!({"item_id": msg, "output_index": idx, "content_index": 0, "delta": delta, "logprobs": []}),
        );
    }

    fn failed(&mut self, msg: &str) {
        let mut r = response_object(&self.turn, "failed", vec![], Value::Null);
        r["error"] = json!({"code": "server_error", "message": msg});
        self.emit("response.failed", json!({"response": r}));
        self.done = true;
    }

    /// The turn is done: its last item closes (the function call is sent whole), then the
    /// final response object.
    fn finished(&mut self) {
        self.close_reasoning();
        let idx = self.message_index();
        let plan = &self.job.choices[0];
        let (call, finish) = (plan.tool_call.clone(), plan.finish);
        if let Some(call) = call {
            let item = call_item(&self.turn, &call.name, "", "in_progress");
            self.emit("response.output_item.added", json!({"item": item, "output_index": idx}));
            let fc = self.turn.fc_id.clone();
            self.emit(
                "response.function_call_arguments.delta",
                json!({"item_id": fc, "output_index": idx, "delta": call.arguments}),
            );
            self.emit(
                "response.function_call_arguments.done",
                json!({"item_id": fc, "output_index": idx, "arguments": call.arguments, "name": call.name}),
            );
            let item = call_item(&self.turn, &call.name, &call.arguments, "completed");
            self.emit("response.output_item.done", json!({"item": item, "output_index": idx}));
        } else if self.started_message {
            let (msg, text) = (self.turn.msg_id.clone(), self.content.clone());
            self.emit(
                "response.output_text.done",
                json!({"item_id": msg, "output_index": idx, "content_index": 0, "text": text, "logprobs": []}),
            );
            self.emit("response.content_part.done", json!({"item_id": msg, "output_index": idx, "content_index": 0, "part": {"annotations": [], "text": text, "type": "output_text", "logprobs": null}}));
            let status = if finish == "length" { "incomplete" } else { "completed" };
            let item = message_item(&self.turn, &text, status);
            self.emit("response.output_item.done", json!({"item": item, "output_index": idx}));
        }
        let plan = &self.job.choices[0];
        let reasoning = plan.reasoning_text().map_or(0, |r| vocab::count_tokens(&r));
        let output = final_output(&self.turn, plan, true);
        let u = usage(
            self.prompt_tokens,
            self.job.cached_tokens,
            self.job.completion_tokens(),
            reasoning,
        );
        let (kind, status) = if finish == "length" {
            ("response.incomplete", "incomplete")
        } else {
            ("response.completed", "completed")
        };
        let resp = response_object(&self.turn, status, output, u);
        self.emit(kind, json!({"response": resp}));
        self.done = true;
    }
}

/// `GET /v1/responses/{id}`: the simulator stores no responses, so every id is unknown.
pub(crate) async fn get_stored(axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    super::error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        &format!("Response with id '{id}' not found."),
        Some("response_id"),
    )
    .into_response()
}
