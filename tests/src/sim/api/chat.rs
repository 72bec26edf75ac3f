//! `POST /v1/chat/completions`: validation, the template-kwargs merge, the plan submitted to the
//! engine, and the whole response as vLLM shapes it (the handler and the stream:
//! `chat_stream.rs`).

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::before;
use super::generate::{ChoicePlan, Job};
use super::logprobs;
use super::request;
use super::schema;
use super::validate;
use super::{ApiError, App};
use crate::sim::changes::{exclude_null, since, Change};
use crate::sim::count::ChatPrompt;
use crate::sim::parser::ParserConfig;
use crate::sim::structured::Constraint;
use crate::sim::text::{self, ToolCall};
use crate::sim::{model, prompt, vocab};

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
pub(crate) enum Opening {
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
    pub(crate) fn of(app: &App, req: &Map<String, Value>, messages: &[Value]) -> Opening {
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

/// A chat body validated, checked and submitted.
pub(crate) fn run(app: &App, headers: &HeaderMap, body: &[u8]) -> Result<(Job, Ctx), ApiError> {
    prepare(app, headers, validated(request::json_object(headers, body)?)?)
}

/// `ChatCompletionRequest`'s validation: its before-validators, then the captured schema.
pub(crate) fn validated(mut req: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    before::run(before::CHAT, &mut req)?;
    before::run(before::CHAT_FIELDS, &mut req)?;
    schema::check_body("/v1/chat/completions", &mut req)?;
    Ok(req)
}

/// A chat request checked in vLLM's serving order and rendered, before the engine.
pub(crate) struct Rendered {
    pub(crate) messages: Vec<Value>,
    /// The prompt's text.
    pub(crate) prompt: String,
    /// The prompt's ids as the real frontend counts them (`sim::count`): its length is the
    /// prompt's token count, its blocks the prefix cache's key.
    pub(crate) counted: Vec<u32>,
    pub(crate) prompt_tokens: usize,
    pub(crate) rendering: text::Rendering,
    pub(crate) opening: Opening,
    /// The template kwargs after vLLM's merge.
    pub(crate) kwargs: Map<String, Value>,
    /// `max_completion_tokens` or `max_tokens`, when given.
    pub(crate) max_tokens: Option<u64>,
    pub(crate) stream: request::StreamOptions,
    pub(crate) n: usize,
}

impl Rendered {
    /// The output budget: the request's limit within what the context leaves.
    pub(crate) fn budget(&self, app: &App) -> usize {
        (app.args.max_model_len as usize - self.prompt_tokens).min(self.max_tokens.map_or(usize::MAX, |m| m as usize))
    }
}

/// Checks a validated chat request in vLLM's serving order and renders its prompt.
pub(crate) fn render_checked(app: &App, req: &Map<String, Value>) -> Result<Rendered, ApiError> {
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let stream = request::stream_options(app, req)?;
    let kwargs = request::template_kwargs(app, req)?;
    let tools = req.get("tools").and_then(Value::as_array).cloned();
    serving_checks(app, req, &messages, &kwargs)?;
    let max_tokens = request::max_tokens(app, req, &["max_completion_tokens", "max_tokens"])?;
    let n = request::n_choices(req)?;
    let (rendering, opening) = rendering_of(app, req, &messages, &kwargs);
    let prompt = prompt::render(
        &messages,
        tools.as_deref(),
        req.get("tool_choice"),
        &rendering,
        app.template,
    );
    let (add_generation_prompt, continue_final) = ChatPrompt::endings(req);
    let counted = ChatPrompt {
        messages: &messages,
        tools: tools.as_deref(),
        rendering: &app.template.render(&kwargs),
        add_generation_prompt,
        continue_final,
    }
    .ids(app.template);
    let prompt_tokens = counted.len();
    request::check_prompt_length(app, prompt_tokens)?;
    request::routed_experts_start(req, prompt_tokens)?;
    Ok(Rendered {
        messages,
        prompt,
        counted,
        prompt_tokens,
        rendering,
        opening,
        kwargs,
        max_tokens,
        stream,
        n,
    })
}

/// Checks a validated chat request in vLLM's serving order and submits it to the engine.
pub(crate) fn prepare(app: &App, headers: &HeaderMap, req: Map<String, Value>) -> Result<(Job, Ctx), ApiError> {
    let r = render_checked(app, &req)?;
    let budget = r.budget(app);
    let ignore_eos = req.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false);
    let min_tokens = req.get("min_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
    let stops = request::stop_strings(&req);
    let planned = model::chat(app.template, &r.prompt, Constraint::of_request(&req).as_ref());
    let cfg = parser_config(app, &req, &r.rendering, r.opening, r.rendering.thinking);
    let named_tool = matches!(req.get("tool_choice"), Some(Value::Object(_)));
    let choices = (0..r.n)
        .map(|_| {
            let mut plan = ChoicePlan::new(planned.clone(), budget, ignore_eos, min_tokens, cfg.clone());
            plan.apply_stop(&stops);
            if named_tool && plan.tool_call.is_some() {
                // A named tool choice is structured output: vLLM finishes it with `stop`.
                plan.finish = "stop";
            }
            plan
        })
        .collect();
    let request_id = request::request_id(headers, &req);
    let job = Job::start_tokens(app, std::slice::from_ref(&r.counted), &[&r.prompt], choices)?;
    let ctx = Ctx::new(app, &req, &r.messages, request_id, r.stream, &r.prompt, r.prompt_tokens);
    Ok((job, ctx))
}

/// What the template renders for the request and how its prompt opens the answer (no
/// thinking unless the prompt ends in the assistant's generation prompt).
pub(crate) fn rendering_of(
    app: &App,
    req: &Map<String, Value>,
    messages: &[Value],
    kwargs: &Map<String, Value>,
) -> (text::Rendering, Opening) {
    let mut rendering = app.template.render(kwargs);
    let opening = Opening::of(app, req, messages);
    if opening != Opening::Generation {
        // The prompt does not end in the assistant's header: the model answers at once.
        rendering.thinking = false;
    }
    (rendering, opening)
}

/// How the request's output is parsed: reasoning first when the prompt left it open
/// (`reasoning_open`: it ends in `<think>`) and the reasoning parser separates it — or when
/// the answer has no header, all of it; tool markup read when tools are offered and not
/// refused.
pub(crate) fn parser_config(
    app: &App,
    req: &Map<String, Value>,
    rendering: &text::Rendering,
    opening: Opening,
    reasoning_open: bool,
) -> ParserConfig {
    let tools: Vec<Value> = req.get("tools").and_then(Value::as_array).cloned().unwrap_or_default();
    let choice = req.get("tool_choice");
    let forced = matches!(choice, Some(Value::Object(_))) || choice == Some(&json!("required"));
    ParserConfig {
        reasoning_open: (reasoning_open && rendering.parsed) || opening == Opening::AsReasoning,
        markup: (!tools.is_empty() && choice != Some(&json!("none"))).then(|| model::syntax(app.template)),
        tools,
        whole_call: forced && app.template == text::Template::Glm,
    }
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
            prompt_ids: flag("return_token_ids").then(|| json!(vocab::prompt_ids(prompt, prompt_tokens))),
        }
    }
}

/// A choice's generated token ids (the end-of-sequence token included), with
/// `return_token_ids`.
fn output_ids(ctx: &Ctx, c: &super::generate::ChoicePlan) -> Value {
    match ctx.prompt_ids {
        // Without the reasoning returned, vLLM returns no ids either.
        Some(_) if ctx.include_reasoning => {
            let mut ids = c.ids().to_vec();
            ids.extend(c.eos);
            json!(ids)
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
