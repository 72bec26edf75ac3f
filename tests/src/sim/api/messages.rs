//! `POST /v1/messages` and `/v1/messages/count_tokens`: the Anthropic Messages API as vLLM 0.33
//! serves it — the request translated into a chat request (system, content blocks, tools and
//! tool choice, stop sequences, `output_config.effort` as reasoning effort, `thinking` disabled
//! as effort `none`, `output_config.format` as a JSON schema), the answer as content blocks
//! (thinking with a signature, text, tool_use) or Anthropic's event stream. Request-validation
//! failures keep vLLM's own envelope; every later failure is Anthropic's.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::chat;
use super::generate::{Job, Step};
use super::{json_response, request, schema, ApiError, App, Shared};
use crate::sim::changes::{since, Change};
use crate::sim::count::ChatPrompt;

/// Anthropic's finish names.
fn stop_reason(finish: &str, stop: Option<&String>) -> &'static str {
    match (finish, stop) {
        (_, Some(_)) => "stop_sequence",
        ("length", _) => "max_tokens",
        ("tool_calls", _) => "tool_use",
        _ => "end_turn",
    }
}

/// The text of a content field: a string, or the text blocks of a list.
fn block_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A text block's text, unless empty or Claude Code's billing header (which vLLM strips from
/// system text).
fn system_text(b: &Value) -> Option<&str> {
    let text = b.get("text").and_then(Value::as_str).filter(|t| !t.is_empty())?;
    (b.get("type").and_then(Value::as_str) == Some("text") && !text.starts_with("x-anthropic-billing-header"))
        .then_some(text)
}

/// The system prompt as vLLM joins it: a string, or its text blocks run together.
fn system_prompt(system: Option<&Value>) -> String {
    match system {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks.iter().filter_map(system_text).collect(),
        _ => String::new(),
    }
}

/// One Anthropic message as chat messages, as vLLM's `_convert_messages` makes them: tool
/// results become tool messages, thinking the turn's `reasoning`, one text block the content
/// string and several a list of text parts.
fn convert_message(m: &Value, out: &mut Vec<Value>) {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    let blocks = m.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
    let kind = |b: &Value, t: &str| b.get("type").and_then(Value::as_str) == Some(t);
    for b in blocks.iter().filter(|b| kind(b, "tool_result")) {
        let id = b.get("tool_use_id").cloned().unwrap_or(Value::Null);
        out.push(json!({"role": "tool", "tool_call_id": id, "content": block_text(b.get("content"))}));
    }
    let calls: Vec<Value> = blocks
        .iter()
        .filter(|b| kind(b, "tool_use"))
        .map(|b| {
            let args = b.get("input").cloned().unwrap_or_else(|| json!({})).to_string();
            json!({"id": b.get("id"), "type": "function", "function": {"name": b.get("name"), "arguments": args}})
        })
        .collect();
    let texts: Vec<&Value> = blocks
        .iter()
        .filter(|b| kind(b, "text") && b.get("text").and_then(Value::as_str).is_some_and(|t| !t.is_empty()))
        .collect();
    let reasoning: Vec<&str> = blocks
        .iter()
        .filter(|b| kind(b, "thinking"))
        .filter_map(|b| b.get("thinking").and_then(Value::as_str))
        .collect();
    let content = match texts.as_slice() {
        [] => json!(""),
        [one] => json!(one["text"]),
        many => json!(many
            .iter()
            .map(|b| json!({"type": "text", "text": b["text"]}))
            .collect::<Vec<_>>()),
    };
    if !texts.is_empty() || !calls.is_empty() || !reasoning.is_empty() || blocks.is_empty() {
        let mut msg = json!({"role": role, "content": if blocks.is_empty() { m["content"].clone() } else { content }});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if !reasoning.is_empty() {
            msg["reasoning"] = json!(reasoning.concat());
        }
        out.push(msg);
    }
}

/// The chat request vLLM derives from a Messages request.
pub(crate) fn to_chat(req: &Map<String, Value>) -> Map<String, Value> {
    let mut messages = Vec::new();
    let system = system_prompt(req.get("system"));
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    for m in req.get("messages").and_then(Value::as_array).into_iter().flatten() {
        convert_message(m, &mut messages);
    }
    let mut chat = Map::new();
    chat.insert("model".into(), req.get("model").cloned().unwrap_or(Value::Null));
    chat.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("max_tokens", "max_tokens"),
        ("stop_sequences", "stop"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
        // vLLM 0.33 `AnthropicServingMessages._build_base_request` passes these as they are.
        ("chat_template_kwargs", "chat_template_kwargs"),
        ("cache_salt", "cache_salt"),
        ("vllm_xargs", "vllm_xargs"),
    ] {
        if let Some(v) = req.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = req.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.get("name"), "description": t.get("description"), "parameters": t.get("input_schema")}}))
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = req.get("tool_choice") {
        let mapped = match choice.get("type").and_then(Value::as_str) {
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice.get("name")}}),
            _ => json!("auto"),
        };
        chat.insert("tool_choice".into(), mapped);
    }
    let config = req.get("output_config");
    if let Some(effort) = config.and_then(|c| c.get("effort")).filter(|v| !v.is_null()) {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    let thinking = req.get("thinking").and_then(|t| t.get("type")).and_then(Value::as_str);
    let off =
        thinking == Some("disabled") || (thinking == Some("between_tools") && since(Change::ThinkingBetweenTools));
    if off {
        chat.insert("reasoning_effort".into(), json!("none"));
    }
    if since(Change::AnthropicMinTokens) {
        if let Some(n) = req.get("min_tokens").filter(|v| !v.is_null()) {
            chat.insert("min_tokens".into(), n.clone());
        }
    }
    if let Some(schema) = config.and_then(|c| c.get("format")).and_then(|f| f.get("schema")) {
        chat.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
        );
    }
    chat
}

fn usage(app: &App, input: usize, output: usize) -> Value {
    let mut u = json!({"input_tokens": input, "output_tokens": output});
    if app.args.enable_prompt_tokens_details {
        u["cache_creation_input_tokens"] = json!(0);
        u["cache_read_input_tokens"] = json!(0);
    }
    u
}

fn signature() -> String {
    request::random_hex(32)
}

pub(crate) async fn handle(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let mut req = match request::json_object(&headers, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = schema::check_body("/v1/messages", &mut req) {
        return e.into_response();
    }
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let (mut job, ctx) = match chat::prepare(&app, &headers, to_chat(&req)) {
        Ok(p) => p,
        Err(e) if e.is_validation() => return e.into_response(),
        Err(e) => return e.into_anthropic(),
    };
    if stream {
        return event_stream(app, job, ctx.id);
    }
    if let Err(msg) = job.complete().await {
        return super::internal_error(&msg).into_anthropic();
    }
    let c = &job.choices[0];
    let mut content = Vec::new();
    if let Some(r) = c.reasoning_text().filter(|r| !r.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": signature()}));
    }
    let text = c.content_text();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    if let Some(call) = &c.tool_call {
        let input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
        let id = format!("chatcmpl-tool-{}", request::random_hex(16));
        content.push(json!({"type": "tool_use", "id": id, "name": call.name, "input": input}));
    }
    let mut body = json!({"id": ctx.id, "type": "message", "role": "assistant", "content": content, "model": ctx.model,
        "stop_reason": stop_reason(c.finish, c.stop_reason.as_ref()),
        "usage": usage(&app, job.prompt_tokens, job.completion_tokens())});
    if let Some(s) = &c.stop_reason {
        body["stop_sequence"] = json!(s);
    }
    json_response(StatusCode::OK, &body)
}

/// `event: NAME\ndata: {json}\n\n`.
fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// Which content block is open in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Thinking,
    Text,
}

struct Events {
    app: Shared,
    job: Job,
    id: String,
    out: Vec<Bytes>,
    open: Block,
    index: usize,
    started: bool,
}

impl Events {
    fn start(&mut self) {
        if !self.started {
            self.started = true;
            // From 0.34 the chat stream's first chunk carries the prompt's token details, so
            // message_start has the cache counts the final usage has.
            let u = if since(Change::MessageStartCacheTokens) {
                usage(&self.app, self.job.prompt_tokens, 0)
            } else {
                json!({"input_tokens": self.job.prompt_tokens, "output_tokens": 0})
            };
            let msg = json!({"id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.app.args.served_name(), "stop_reason": null, "stop_sequence": null, "usage": u});
            self.out.push(event(
                "message_start",
                &json!({"type": "message_start", "message": msg}),
            ));
        }
    }

    fn close(&mut self) {
        if self.open == Block::Thinking {
            let d = json!({"type": "content_block_delta", "delta": {"type": "signature_delta", "signature": signature()}, "index": self.index});
            self.out.push(event("content_block_delta", &d));
        }
        if self.open != Block::None {
            self.out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
            self.open = Block::None;
        }
    }

    fn delta(&mut self, block: Block, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.open != block {
            self.close();
            let start = match block {
                Block::Thinking => json!({"type": "thinking", "thinking": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            self.out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "content_block": start, "index": self.index}),
            ));
            self.open = block;
        }
        let d = match block {
            Block::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            _ => json!({"type": "text_delta", "text": text}),
        };
        self.out.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "delta": d, "index": self.index}),
        ));
    }

    fn finish(&mut self, index: usize) {
        let c = &self.job.choices[index];
        let (call, finish, stop) = (c.tool_call.clone(), c.finish, c.stop_reason.clone());
        self.close();
        if let Some(call) = call {
            let id = format!("chatcmpl-tool-{}", request::random_hex(16));
            let start = json!({"type": "tool_use", "id": id, "name": call.name, "input": {}});
            self.out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "content_block": start, "index": self.index}),
            ));
            let d = json!({"type": "input_json_delta", "partial_json": call.arguments});
            self.out.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "delta": d, "index": self.index}),
            ));
            self.out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
        }
        let u = usage(&self.app, self.job.prompt_tokens, self.job.completion_tokens());
        let d = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(finish, stop.as_ref()), "stop_sequence": stop}, "usage": u});
        self.out.push(event("message_delta", &d));
        self.out.push(event("message_stop", &json!({"type": "message_stop"})));
    }
}

fn event_stream(app: Shared, job: Job, id: String) -> Response {
    let state = Events {
        app: app.clone(),
        job,
        id,
        out: Vec::new(),
        open: Block::None,
        index: 0,
        started: false,
    };
    let frames = futures_util::stream::unfold((state, false), |(mut s, done)| async move {
        if done {
            return None;
        }
        match s.job.next().await {
            Some(Step::Delta(i, d)) => {
                s.start();
                s.delta(Block::Thinking, &d.reasoning);
                s.delta(Block::Text, &d.content);
                if d.last {
                    s.finish(i);
                }
                let bytes: Vec<u8> = s.out.drain(..).flat_map(|b| b.to_vec()).collect();
                Some((Bytes::from(bytes), (s, false)))
            }
            Some(Step::Failed(msg)) => {
                let e = json!({"type": "error", "error": {"type": "api_error", "message": msg}});
                Some((event("error", &e), (s, true)))
            }
            None => None,
        }
    });
    chat::sse_response(&app, "", frames)
}

/// `POST /v1/messages/count_tokens`: the rendered prompt's length, no generation.
pub(crate) async fn count_tokens(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut req = request::json_object(&headers, &body)?;
    schema::check_body("/v1/messages/count_tokens", &mut req)?;
    if let Err(e) = request::check_model(&app, &req) {
        return Ok(e.into_anthropic());
    }
    let chat = to_chat(&req);
    let messages = chat
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let kwargs = request::template_kwargs(&app, &chat)?;
    if let Err(e) = request::render_checks(&app, &messages, &kwargs) {
        return Ok(e.into_anthropic());
    }
    // The prompt the chat route renders for it.
    let (add_generation_prompt, continue_final) = ChatPrompt::endings(&chat);
    let n = ChatPrompt {
        messages: &messages,
        tools: chat.get("tools").and_then(Value::as_array).map(Vec::as_slice),
        rendering: &app.template.render(&kwargs),
        add_generation_prompt,
        continue_final,
    }
    .ids(app.template)
    .len();
    // 0.33 rendered the count as a chat request, with the context limit; 0.34 counts past it.
    if !since(Change::CountTokensOverContext) {
        if let Err(e) = request::check_prompt_length(&app, n) {
            return Ok(e.into_anthropic());
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"input_tokens": n, "context_management": {"original_input_tokens": n}}),
    ))
}
