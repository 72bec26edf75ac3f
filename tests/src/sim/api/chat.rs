//! `POST /v1/chat/completions`: validation, the template-kwargs merge, and the response or SSE
//! chunk sequence as vLLM 0.33 shapes them (reference §5).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::before;
use super::generate::{ChoicePlan, Delta, Job, Step};
use super::logprobs;
use super::request;
use super::schema;
use super::validate;
use super::{internal_error, json_response, ApiError, App, Shared};
use crate::sim::changes::{exclude_null, since, Change};
use crate::sim::structured::Constraint;
use crate::sim::text::{self, ToolCall};
use crate::sim::vocab;

pub(crate) async fn handle(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    match run(&app, &headers, &body) {
        Ok((job, ctx)) if ctx.stream.stream => stream(app.clone(), job, ctx),
        Ok((mut job, ctx)) => match job.complete().await {
            Ok(()) => with_request_id(
                &app,
                &ctx.request_id,
                json_response(StatusCode::OK, &full_body(&app, &job, &ctx)),
            ),
            Err(msg) => internal_error(&msg).into_response(),
        },
        Err(e) => e.into_response(),
    }
}

/// The echoed `X-Request-Id` (only with `--enable-request-id-headers`, as vLLM).
pub(crate) fn with_request_id(app: &App, id: &str, mut resp: Response) -> Response {
    if app.args.enable_request_id_headers {
        if let Ok(v) = id.parse() {
            resp.headers_mut().insert("x-request-id", v);
        }
    }
    resp
}

pub(crate) struct Ctx {
    pub(crate) id: String,
    pub(crate) request_id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) stream: request::StreamOptions,
    /// `tool_choice` required or named: vLLM answers `content: ""` beside the call.
    pub(crate) forced_tool: bool,
    /// `logprobs: true`: how many top alternatives each token lists.
    pub(crate) logprobs: Option<usize>,
    /// The answer's role: vLLM's `get_chat_request_role` — the assistant after a generation
    /// prompt, else the last message's own role.
    pub(crate) role: String,
    /// `include_reasoning: false`: the reasoning is produced but not returned.
    pub(crate) include_reasoning: bool,
    /// `return_prompt_text`: the rendered prompt, returned beside the answer.
    pub(crate) prompt_text: Value,
    /// `use_beam_search`: vLLM's beam-search path reports no prompt token details.
    pub(crate) beam_search: bool,
    /// `return_token_ids`: the prompt's ids (the answer's are added per choice).
    pub(crate) prompt_ids: Option<Value>,
    /// `prompt_logprobs` asked: one entry a prompt token, null as the engine (no model) gives.
    pub(crate) prompt_logprobs: Value,
}

/// DeepSeek V4.1's encoder from 0.34 (`encode_messages`): continuing the final message needs
/// one from the assistant to continue.
fn continue_needs_final_assistant(req: &Map<String, Value>, messages: &[Value]) -> Result<(), ApiError> {
    let continuing = req.get("continue_final_message").and_then(Value::as_bool) == Some(true);
    let last_is_assistant = messages.last().and_then(|m| m.get("role")) == Some(&json!("assistant"));
    if continuing && !last_is_assistant && since(Change::DeepSeekContinueFinalMessage) {
        return Err(super::bad_request(
            "continue_final_message requires a final assistant message",
            None,
            None,
        ));
    }
    Ok(())
}

/// The Hugging Face renderer's refusal (GLM's; DeepSeek's own encoder had none before 0.34): continuing
/// the final message and adding a generation prompt (on by default) exclude each other.
fn continue_needs_no_generation_prompt(req: &Map<String, Value>) -> Result<(), ApiError> {
    let set = |k: &str, default: bool| req.get(k).and_then(Value::as_bool).unwrap_or(default);
    if set("continue_final_message", false) && set("add_generation_prompt", true) {
        return Err(super::bad_request(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead.",
            None,
            None,
        ));
    }
    Ok(())
}

/// How the rendered prompt ends, as the real frontend with the fixture's model answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// The assistant's generation prompt: the model thinks as the template says.
    Generation,
    /// The final assistant message continued: the answer follows as content.
    Continuation,
    /// No assistant header, or (0.33's DeepSeek encoder) a continued message closed by EOS:
    /// the answer comes without thinking, and the parser reads it as reasoning.
    AsReasoning,
}

impl Opening {
    /// GLM's template honours `add_generation_prompt` and `continue_final_message`; DeepSeek's
    /// encoder does from 0.34 (continuing implies no generation prompt); 0.33's always added
    /// the generation prompt, after closing a continued message.
    fn of(app: &App, req: &Map<String, Value>, messages: &[Value]) -> Opening {
        let set = |k: &str, default: bool| req.get(k).and_then(Value::as_bool).unwrap_or(default);
        let last_is_assistant = messages.last().and_then(|m| m.get("role")) == Some(&json!("assistant"));
        let continuing = set("continue_final_message", false) && last_is_assistant;
        let honoured = app.template == text::Template::Glm || since(Change::DeepSeekContinueFinalMessage);
        match (honoured, continuing, set("add_generation_prompt", true)) {
            (true, true, _) => Opening::Continuation,
            (true, false, false) => Opening::AsReasoning,
            (false, true, _) => Opening::AsReasoning,
            _ => Opening::Generation,
        }
    }
}

fn chat_role(req: &Map<String, Value>, messages: &[Value]) -> String {
    let generation_prompt = req
        .get("add_generation_prompt")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    match messages.last().and_then(|m| m.get("role")).and_then(Value::as_str) {
        Some(role) if !generation_prompt => role.to_owned(),
        _ => "assistant".to_owned(),
    }
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn run(app: &App, headers: &HeaderMap, body: &[u8]) -> Result<(Job, Ctx), ApiError> {
    prepare(app, headers, validated(request::json_object(headers, body)?)?)
}

/// `ChatCompletionRequest`'s validation: its before-validators, then the captured schema.
pub(crate) fn validated(mut req: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    before::run(before::CHAT, &mut req)?;
    before::run(before::CHAT_FIELDS, &mut req)?;
    schema::check_body("/v1/chat/completions", &mut req)?;
    Ok(req)
}

/// Checks a validated chat request in vLLM's serving order and submits it to the engine.
pub(crate) fn prepare(app: &App, headers: &HeaderMap, req: Map<String, Value>) -> Result<(Job, Ctx), ApiError> {
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let stream = request::stream_options(app, &req)?;
    let kwargs = request::template_kwargs(app, &req)?;
    let tools = req.get("tools").and_then(Value::as_array).cloned();
    serving_checks(app, &req, &messages, &kwargs)?;
    let max_tokens = request::max_tokens(app, &req, &["max_completion_tokens", "max_tokens"])?;
    let n = request::n_choices(&req)?;
    let mut rendering = app.template.render(&kwargs);
    let opening = Opening::of(app, &req, &messages);
    if opening != Opening::Generation {
        // The prompt does not end in the assistant's header: the model answers at once.
        rendering.thinking = false;
    }
    let prompt = text::render_prompt(&messages, &rendering);
    let prompt_tokens = vocab::count_tokens(&prompt);
    request::check_prompt_length(app, prompt_tokens)?;
    request::routed_experts_start(&req, prompt_tokens)?;
    let budget = (app.args.max_model_len as usize - prompt_tokens).min(max_tokens.map_or(usize::MAX, |m| m as usize));
    let ignore_eos = req.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false);
    let min_tokens = req.get("min_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
    let stops = request::stop_strings(&req);
    let constraint = Constraint::of_request(&req);
    let named_tool = matches!(req.get("tool_choice"), Some(Value::Object(_)));
    let choices = (0..n)
        .map(|_| {
            let mut out = text::plan_chat(&messages, tools.as_deref(), req.get("tool_choice"), &rendering);
            if opening == Opening::AsReasoning {
                // No `</think>` after the prompt: the reasoning parser takes it all as reasoning.
                out.reasoning.append(&mut out.content);
            }
            if let Some(c) = &constraint {
                out.constrain(c);
            }
            let mut plan = ChoicePlan::new(out, budget, ignore_eos, min_tokens);
            plan.apply_stop(&stops);
            if named_tool && plan.tool_call.is_some() {
                // A named tool choice is structured output: vLLM finishes it with `stop`.
                plan.finish = "stop";
            }
            plan
        })
        .collect();
    let request_id = request::request_id(headers, &req);
    let job = Job::start(app, &[&prompt], choices)?;
    let ctx = Ctx::new(app, &req, &messages, request_id, stream, &prompt, prompt_tokens);
    Ok((job, ctx))
}

/// vLLM's refusals between the model check and generation, in its order: the model, the
/// renderer's, then the sampling parameters' (beam search has its own) and the engine's.
fn serving_checks(
    app: &App,
    req: &Map<String, Value>,
    messages: &[Value],
    kwargs: &Map<String, Value>,
) -> Result<(), ApiError> {
    request::check_model(app, req)?;
    request::refuse_chat_template(app, req)?;
    request::untrusted_mm_kwargs(req)?;
    request::truncation(app, req)?;
    request::render_checks(app, messages, kwargs)?;
    match app.template {
        text::Template::Glm => continue_needs_no_generation_prompt(req)?,
        text::Template::DeepSeek => continue_needs_final_assistant(req, messages)?,
    }
    // Beam search builds `BeamSearchParams`, which `SamplingParams`' checks do not cover.
    if req.get("use_beam_search") == Some(&Value::Bool(true)) {
        validate::beam_search(req, false)?;
    } else {
        validate::sampling(app, req, &["max_completion_tokens", "max_tokens"])?;
        let top = req.get("top_logprobs").and_then(Value::as_i64);
        let prompt_lp = req.get("prompt_logprobs").and_then(Value::as_i64);
        validate::sample_logprobs(
            top.filter(|_| req.get("logprobs") == Some(&Value::Bool(true))),
            prompt_lp,
        )?;
        validate::speculation(app, req)?;
    }
    request::empty_decoder_prompt(req)?;
    if messages.is_empty() && req.get("add_generation_prompt") == Some(&Value::Bool(false)) {
        // `get_chat_request_role` reads `messages[-1]`: Python's IndexError, a 500.
        return Err(super::internal_error("list index out of range"));
    }
    Ok(())
}

impl Ctx {
    fn new(
        app: &App,
        req: &Map<String, Value>,
        messages: &[Value],
        request_id: String,
        stream: request::StreamOptions,
        prompt: &str,
        prompt_tokens: usize,
    ) -> Ctx {
        let flag = |k: &str| req.get(k) == Some(&Value::Bool(true));
        Ctx {
            id: format!("chatcmpl-{request_id}"),
            request_id,
            model: app.args.served_name().to_owned(),
            created: now_secs(),
            stream,
            forced_tool: matches!(req.get("tool_choice"), Some(Value::Object(_)))
                || req.get("tool_choice") == Some(&json!("required")),
            logprobs: flag("logprobs").then(|| req.get("top_logprobs").and_then(Value::as_u64).unwrap_or(0) as usize),
            role: chat_role(req, messages),
            include_reasoning: req.get("include_reasoning") != Some(&Value::Bool(false)),
            prompt_text: if flag("return_prompt_text") {
                Value::String(prompt.to_owned())
            } else {
                Value::Null
            },
            beam_search: flag("use_beam_search"),
            prompt_logprobs: match req.get("prompt_logprobs") {
                Some(p) if !p.is_null() => Value::Array(vec![Value::Null; prompt_tokens]),
                _ => Value::Null,
            },
            prompt_ids: flag("return_token_ids").then(|| json!(vocab::tokenize(prompt))),
        }
    }
}

/// A choice's generated token ids, with `return_token_ids`.
fn output_ids(ctx: &Ctx, c: &super::generate::ChoicePlan) -> Value {
    match ctx.prompt_ids {
        // Without the reasoning returned, vLLM returns no ids either.
        Some(_) if ctx.include_reasoning => {
            let text = c.reasoning_text().unwrap_or_default() + &c.content_text();
            json!(vocab::tokenize(&text))
        }
        _ => Value::Null,
    }
}

fn tool_call_json(call: &ToolCall, id: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
}

/// The usage object; `streamed` is the usage chunk's form (no `multimodal_tokens`, no null
/// details), as vLLM renders the two.
pub(crate) fn usage(app: &App, job: &Job, streamed: bool) -> Value {
    let (prompt, completion) = (job.prompt_tokens, job.completion_tokens());
    let mut u = json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion});
    let cached = job.cached_tokens;
    match (app.args.enable_prompt_tokens_details, streamed) {
        (true, false) => {
            u["prompt_tokens_details"] =
                json!({"cached_tokens": cached, "created_cache_tokens": 0, "multimodal_tokens": null})
        }
        (true, true) => u["prompt_tokens_details"] = json!({"cached_tokens": cached, "created_cache_tokens": 0}),
        (false, false) => u["prompt_tokens_details"] = Value::Null,
        (false, true) => {}
    }
    u["completion_tokens_details"] = json!({"reasoning_tokens": job.reasoning_tokens()});
    u
}

pub(crate) fn full_body(app: &App, job: &Job, ctx: &Ctx) -> Value {
    let choices: Vec<Value> = job
        .choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let content = c.content_text();
            let mut message = json!({
                "role": ctx.role,
                "content": if content.is_empty() && !ctx.forced_tool { Value::Null } else { Value::String(content) },
                "refusal": null, "annotations": null, "audio": null, "function_call": null,
            });
            if let Some(call) = &c.tool_call {
                message["tool_calls"] = json!([tool_call_json(call, &format!("chatcmpl-tool-{}", request::random_hex(16)))]);
            }
            message["reasoning"] = match c.reasoning_text() {
                Some(r) if ctx.include_reasoning => Value::String(r),
                _ => Value::Null,
            };
            exclude_null(&mut message, "annotations", Change::AnnotationsOmittedWhenNone);
            let lp = ctx.logprobs.map_or(Value::Null, |top| logprobs::chat(c.released(), top));
            json!({"index": index, "message": message, "logprobs": lp, "finish_reason": c.finish, "stop_reason": c.stop_reason, "token_ids": output_ids(ctx, c), "routed_experts": null, "weight_versions": null})
        })
        .collect();
    let mut usage = usage(app, job, false);
    if ctx.beam_search {
        usage["prompt_tokens_details"] = Value::Null;
    }
    exclude_null(
        &mut usage,
        "prompt_tokens_details",
        Change::PromptDetailsOmittedWhenNone,
    );
    json!({
        "id": ctx.id, "object": "chat.completion", "created": ctx.created, "model": ctx.model, "choices": choices,
        "service_tier": null, "system_fingerprint": app.fingerprint,
        "usage": usage,
        "prompt_logprobs": ctx.prompt_logprobs, "prompt_token_ids": ctx.prompt_ids, "prompt_text": ctx.prompt_text,
        "kv_transfer_params": null, "ec_transfer_params": null, "metrics": null
    })
}

/// `data: {json}\n\n`.
pub(crate) fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

pub(crate) fn error_frame(msg: &str) -> Bytes {
    frame(&json!({"error": {"message": msg, "type": "InternalServerError", "param": null, "code": 500}}))
}

pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

pub(crate) fn sse_response(
    app: &App,
    request_id: &str,
    frames: impl futures_util::Stream<Item = Bytes> + Send + 'static,
) -> Response {
    use futures_util::StreamExt as _;
    let body = axum::body::Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>));
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream; charset=utf-8")
        .body(body)
        .expect("static response parts");
    with_request_id(app, request_id, resp)
}

struct StreamState {
    app: Shared,
    job: Job,
    ctx: Ctx,
    pending: std::collections::VecDeque<Bytes>,
    finished: bool,
    /// The role chunks go out with the first engine output (after prefill), as in vLLM.
    started: bool,
}

impl StreamState {
    fn chunk(&self, choices: Value, extra: Option<(&str, Value)>) -> Value {
        let mut c = json!({"id": self.ctx.id, "object": "chat.completion.chunk", "created": self.ctx.created, "model": self.ctx.model, "choices": choices});
        if let Some((k, v)) = extra {
            c[k] = v;
        }
        if self.ctx.stream.continuous_usage && !c["choices"].as_array().is_some_and(Vec::is_empty) {
            let (p, n) = (self.job.prompt_tokens, self.job.completion_tokens());
            c["usage"] = json!({"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n, "completion_tokens_details": {"reasoning_tokens": self.job.reasoning_tokens()}});
        }
        c
    }

    fn role_chunks(&mut self) {
        if self.started {
            return;
        }
        self.started = true;
        for index in 0..self.job.choices.len() {
            let choice = json!({"index": index, "delta": {"role": self.ctx.role, "content": ""}, "logprobs": null, "finish_reason": null});
            let mut c = self.chunk(json!([choice]), None);
            if c.get("usage").is_some() && since(Change::FirstChunkPromptDetails) {
                // The role chunks' usage: the prompt's split is known from the first output.
                let details = usage(&self.app, &self.job, false)["prompt_tokens_details"].take();
                if !details.is_null() {
                    c["usage"]["prompt_tokens_details"] = details;
                }
            }
            c["prompt_token_ids"] = self.ctx.prompt_ids.clone().unwrap_or(Value::Null);
            c["prompt_text"] = self.ctx.prompt_text.clone();
            self.pending.push_back(frame(&c));
        }
    }

    /// A content (or reasoning, or tool-call) chunk: vLLM adds `token_ids` to the choice and
    /// `kv_transfer_params` to the chunk.
    fn push_delta(&mut self, index: usize, delta: Value, tokens: &[String]) {
        let lp = self.logprobs(tokens);
        let ids = self.ids(tokens);
        let choice = json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": null, "token_ids": ids});
        let c = self.chunk(json!([choice]), Some(("kv_transfer_params", Value::Null)));
        self.pending.push_back(frame(&c));
    }

    /// A chunk's token ids, with `return_token_ids`.
    fn ids(&self, tokens: &[String]) -> Value {
        match self.ctx.prompt_ids {
            Some(_) => json!(vocab::tokenize(&tokens.concat())),
            None => Value::Null,
        }
    }

    fn logprobs(&self, tokens: &[String]) -> Value {
        match self.ctx.logprobs {
            Some(top) if !tokens.is_empty() => logprobs::chat(tokens, top),
            _ => Value::Null,
        }
    }

    /// With `include_reasoning: false` the reasoning parser sets each delta's reasoning to
    /// None (`parse_delta`), which pydantic then writes: `"reasoning": null` on every delta
    /// that carries content or a tool call.
    fn hide_reasoning(&self, delta: &mut Map<String, Value>) {
        if !self.ctx.include_reasoning {
            delta.insert("reasoning".into(), Value::Null);
        }
    }

    fn on_delta(&mut self, index: usize, d: Delta) {
        self.role_chunks();
        let mut delta = Map::new();
        if !d.reasoning.is_empty() && self.ctx.include_reasoning {
            delta.insert("reasoning".into(), Value::String(d.reasoning));
        }
        if !d.content.is_empty() {
            delta.insert("content".into(), Value::String(d.content));
            self.hide_reasoning(&mut delta);
        }
        let mut tokens = d.tokens;
        if !d.last {
            if !delta.is_empty() {
                self.push_delta(index, Value::Object(delta), &tokens);
            }
            return;
        }
        let plan = &self.job.choices[index];
        let (finish, stop_reason, tool_call) = (plan.finish, plan.stop_reason.clone(), plan.tool_call.clone());
        if let Some(call) = tool_call {
            if !delta.is_empty() {
                self.push_delta(
                    index,
                    Value::Object(std::mem::take(&mut delta)),
                    &std::mem::take(&mut tokens),
                );
            }
            let id = format!("chatcmpl-tool-{}", request::random_hex(16));
            // A forced call (required or named) comes as one delta on GLM and as name, then
            // arguments on DeepSeek: what the real frontend streams for each profile.
            let deltas = if self.ctx.forced_tool && self.app.template == text::Template::Glm {
                vec![
                    json!({"tool_calls": [{"id": id, "type": "function", "index": 0, "function": {"name": call.name, "arguments": call.arguments}}]}),
                ]
            } else {
                vec![
                    json!({"tool_calls": [{"id": id, "type": "function", "index": 0, "function": {"name": call.name}}]}),
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]}),
                ]
            };
            for mut call in deltas {
                if let Value::Object(delta) = &mut call {
                    self.hide_reasoning(delta);
                }
                self.push_delta(index, call, &[]);
            }
        } else if finish == "stop" && !delta.is_empty() {
            // The end-of-sequence token has no text: its chunk carries only the finish reason.
            self.push_delta(
                index,
                Value::Object(std::mem::take(&mut delta)),
                &std::mem::take(&mut tokens),
            );
        }
        let lp = self.logprobs(&tokens);
        let choice = json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": self.ids(&tokens), "weight_versions": null});
        let mut c = self.chunk(json!([choice]), Some(("kv_transfer_params", Value::Null)));
        if !self.ctx.stream.include_usage {
            c["system_fingerprint"] = Value::String(self.app.fingerprint.clone());
        }
        self.pending.push_back(frame(&c));
    }

    fn on_end(&mut self) {
        if self.ctx.stream.include_usage {
            let mut c = self.chunk(json!([]), None);
            c["usage"] = usage(&self.app, &self.job, true);
            c["system_fingerprint"] = Value::String(self.app.fingerprint.clone());
            self.pending.push_back(frame(&c));
        }
        self.pending.push_back(Bytes::from_static(DONE));
        self.finished = true;
    }
}

fn stream(app: Shared, job: Job, ctx: Ctx) -> Response {
    let request_id = ctx.request_id.clone();
    let state = StreamState {
        app: app.clone(),
        job,
        ctx,
        pending: Default::default(),
        finished: false,
        started: false,
    };
    let frames = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.pending.pop_front() {
                return Some((b, s));
            }
            if s.finished {
                return None;
            }
            match s.job.next().await {
                Some(Step::Delta(i, d)) => s.on_delta(i, d),
                Some(Step::Failed(msg)) => {
                    s.pending.push_back(error_frame(&msg));
                    s.pending.push_back(Bytes::from_static(DONE));
                    s.finished = true;
                }
                None => {
                    s.role_chunks();
                    s.on_end()
                }
            }
        }
    });
    sse_response(&app, &request_id, frames)
}
