//! `POST /v1/chat/completions/render`, `/v1/messages/render` and `/v1/completions/render`:
//! a request checked exactly as its generation route checks it, rendered, and answered as
//! vLLM's `GenerateRequest` — the prompt's token ids (the ids the generation route's stream
//! reports as `prompt_token_ids`), the sampling parameters with `max_tokens` filled in, and
//! (chat) the parser's context.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::super::chat::{self, Rendered};
use super::super::{bad_request, completions, messages, request, schema, ApiError, App, Shared};
use super::ok;
use crate::sim::changes::{since, Change};
use crate::sim::structured::Constraint;
use crate::sim::text::Template;
use crate::sim::vocab;

pub(crate) async fn chat(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req = chat::validated(request::json_object(&headers, &body)?)?;
    Ok(ok(&render_chat(&app, &headers, &req)?))
}

/// The Anthropic request as the chat request vLLM converts it to, rendered alike.
pub(crate) async fn messages(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let mut req = request::json_object(&headers, &body)?;
    schema::check_body("/v1/messages", &mut req)?;
    Ok(ok(&render_chat(&app, &headers, &messages::to_chat(&req))?))
}

/// Responses' render needs the Responses conversation state the simulator does not keep.
pub(crate) async fn responses(headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    request::json_object(&headers, &body)?;
    Err(bad_request("vllm-sim does not simulate this task", None, None))
}

pub(crate) async fn completions(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let c = completions::checked(&app, &headers, &body)?;
    if c.req.get("use_beam_search") == Some(&Value::Bool(true)) {
        return Err(beam_search());
    }
    let base = format!("cmpl-{}", request::request_id(&headers, &c.req));
    let many = c.prompts.len() > 1;
    let list: Vec<Value> = c
        .ids
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            let room = (app.args.max_model_len as usize).saturating_sub(ids.len());
            let sampling = sampling_params(&c.req, c.max_tokens.min(room), c.stream.stream, false, None);
            let id = if many { format!("{base}-{i}") } else { base.clone() };
            let mut g = generate_request(&c.req, id, ids, sampling, c.stream.stream);
            g["stream_options"] = stream_options(&c.req, c.stream.stream);
            g
        })
        .collect();
    Ok(ok(&Value::Array(list)))
}

fn beam_search() -> ApiError {
    bad_request("Beam search is not supported by the render endpoint", None, None)
}

/// A chat request's `GenerateRequest`, after the chat route's checks.
fn render_chat(app: &App, headers: &HeaderMap, req: &Map<String, Value>) -> Result<Value, ApiError> {
    request::check_model(app, req)?;
    if req.get("use_beam_search") == Some(&Value::Bool(true)) {
        return Err(beam_search());
    }
    let r = chat::render_checked(app, req)?;
    let ids = vocab::prompt_ids(&r.prompt, r.prompt_tokens);
    let stream = r.stream.stream;
    let so = structured_outputs(app, req);
    let sampling = sampling_params(req, r.budget(app), stream, true, so);
    let id = format!("chatcmpl-{}", request::request_id(headers, req));
    let mut g = generate_request(req, id, &ids, sampling, stream);
    let kwargs = effective_kwargs(req, &r);
    let include_reasoning = req.get("include_reasoning") != Some(&Value::Bool(false));
    let parser = app.args.reasoning_parser.is_some();
    g["reasoning_ended"] = match (include_reasoning, parser) {
        (false, _) => json!(true),
        (true, true) => json!(!crate::sim::parser::reasoning_open_after(&ids)),
        (true, false) => Value::Null,
    };
    if parser {
        g["reasoning_parser_kwargs"] = json!({"chat_template_kwargs": kwargs});
    }
    g["return_token_ids"] = req.get("return_token_ids").cloned().unwrap_or(Value::Null);
    g["parse_context"] = parse_context(req, &kwargs, &r.messages);
    g["stream_options"] = stream_options(req, stream);
    Ok(g)
}

/// `GenerateRequest`'s fields, in its order.
fn generate_request(req: &Map<String, Value>, request_id: String, ids: &[u32], sampling: Value, stream: bool) -> Value {
    let field = |k: &str| req.get(k).cloned().unwrap_or(Value::Null);
    json!({
        "request_id": request_id, "token_ids": ids, "token_offsets": null, "features": null, "content_parts": null,
        "sampling_params": sampling, "model": field("model"), "reasoning_ended": null, "reasoning_parser_kwargs": null,
        "return_token_ids": field("return_token_ids"), "output_mode": "tokens", "parse_context": null, "stream": stream,
        "stream_options": null, "cache_salt": field("cache_salt"),
        "priority": req.get("priority").filter(|p| !p.is_null()).cloned().unwrap_or(json!(0)),
        "kv_transfer_params": null, "ec_transfer_params": null
    })
}

/// The request's `stream_options` as vLLM's model holds them (only when streaming).
fn stream_options(req: &Map<String, Value>, stream: bool) -> Value {
    match req.get("stream_options").and_then(Value::as_object) {
        Some(o) if stream => {
            let flag = |k: &str| o.get(k).cloned().filter(|v| !v.is_null()).unwrap_or(json!(false));
            json!({"include_usage": flag("include_usage"), "continuous_usage_stats": flag("continuous_usage_stats")})
        }
        _ => Value::Null,
    }
}

/// The template kwargs the prompt was rendered with, as vLLM resolves them: the server's
/// defaults (with `cohere_format`), the request's, and the generation-prompt switches.
fn effective_kwargs(req: &Map<String, Value>, r: &Rendered) -> Map<String, Value> {
    let mut out = Map::from_iter([("cohere_format".to_owned(), json!("cmd4"))]);
    out.extend(r.kwargs.clone());
    let flag = |k: &str, default: bool| req.get(k).and_then(Value::as_bool).unwrap_or(default);
    out.insert(
        "add_generation_prompt".into(),
        json!(flag("add_generation_prompt", true)),
    );
    out.insert(
        "continue_final_message".into(),
        json!(flag("continue_final_message", false)),
    );
    out
}

/// What the generate server's parser needs (`ParseContext`).
fn parse_context(req: &Map<String, Value>, kwargs: &Map<String, Value>, messages: &[Value]) -> Value {
    let tools: Option<Vec<Value>> = req.get("tools").and_then(Value::as_array).map(|tools| {
        tools
            .iter()
            .map(|t| {
                let f = t.get("function").cloned().unwrap_or_default();
                let field = |k: &str| f.get(k).cloned().unwrap_or(Value::Null);
                json!({"type": t.get("type").cloned().unwrap_or(json!("function")),
                       "function": {"name": field("name"), "description": field("description"), "parameters": field("parameters")}})
            })
            .collect()
    });
    let choice = match req.get("tool_choice").filter(|c| !c.is_null()) {
        Some(c) => c.clone(),
        None if tools.as_ref().is_some_and(|t| !t.is_empty()) => json!("auto"),
        None => json!("none"),
    };
    let history = messages
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .map(Vec::len)
        .sum::<usize>();
    let or = |k: &str, default: Value| req.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    json!({"tools": tools, "tool_choice": choice, "parallel_tool_calls": or("parallel_tool_calls", json!(true)),
           "include_reasoning": or("include_reasoning", json!(true)), "chat_template_kwargs": kwargs,
           "history_tool_call_cnt": history})
}

/// The structured output a request forces: its own (`response_format`, `structured_outputs`),
/// or the tool parser's grammar for a forced call (and for GLM's triggered calls).
fn structured_outputs(app: &App, req: &Map<String, Value>) -> Option<Value> {
    let mut so = json!({"json": null, "regex": null, "choice": null, "grammar": null, "json_object": null,
        "disable_any_whitespace": false, "disable_additional_properties": false, "whitespace_pattern": null,
        "structural_tag": null, "_backend": null, "_backend_was_auto": false});
    if let Some(c) = Constraint::of_request(req) {
        match c {
            Constraint::Schema(s) => so["json"] = s,
            Constraint::Object => so["json_object"] = json!(true),
            Constraint::Choice(c) => so["choice"] = json!(c),
            Constraint::Regex(r) => so["regex"] = json!(r),
        }
        return Some(so);
    }
    let tools = req.get("tools").and_then(Value::as_array).filter(|t| !t.is_empty())?;
    let choice = req.get("tool_choice").filter(|c| !c.is_null());
    let forced = matches!(choice, Some(Value::Object(_))) || choice == Some(&json!("required"));
    let auto = choice.is_none_or(|c| c == "auto");
    // A forced call is constrained on both profiles; GLM's parser also triggers on its tag.
    let triggered = auto && app.template == Template::Glm;
    if !(forced || triggered) {
        return None;
    }
    let names: Vec<&str> = tools.iter().filter_map(crate::sim::tools::tool_name).collect();
    let opener = crate::sim::model::syntax(app.template).opener();
    let tag = json!({"type": "structural_tag", "format": {"type": if forced { "sequence" } else { "triggered_tags" },
        "triggers": [opener], "tags": names.iter().map(|n| json!({"type": "tag", "begin": format!("{opener}{n}")})).collect::<Vec<_>>()}});
    so["structural_tag"] = json!(tag.to_string());
    Some(so)
}

/// `SamplingParams` as its msgspec struct writes it: the fields vLLM always sets, the ones the
/// request moved off their defaults, and `max_tokens` (a default 16 is omitted; from 0.34 it
/// goes last, as `GenerateRequest`'s serializer adds it back).
fn sampling_params(req: &Map<String, Value>, max_tokens: usize, stream: bool, chat: bool, so: Option<Value>) -> Value {
    let num = |k: &str, default: f64| req.get(k).and_then(Value::as_f64).unwrap_or(default);
    let set = |k: &str| req.get(k).filter(|v| !v.is_null()).cloned();
    let mut sp = Map::new();
    if let Some(n) = set("n").filter(|n| n.as_u64() != Some(1)) {
        sp.insert("n".into(), n);
    }
    for (k, default) in [
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
        ("temperature", 1.0),
    ] {
        sp.insert(k.into(), json!(num(k, default)));
    }
    // Greedy sampling resets the nucleus settings to their defaults (then omitted).
    if num("temperature", 1.0) != 0.0 {
        sp.insert("top_p".into(), json!(num("top_p", 1.0)));
        if let Some(k) = set("top_k").filter(|k| k.as_i64().is_some_and(|k| k > 0)) {
            sp.insert("top_k".into(), k);
        }
        sp.insert("min_p".into(), json!(num("min_p", 0.0)));
    }
    if let Some(seed) = set("seed") {
        sp.insert("seed".into(), seed);
    }
    sp.insert("stop".into(), json!(request::stop_strings(req)));
    sp.insert("stop_token_ids".into(), set("stop_token_ids").unwrap_or(json!([])));
    if req.get("ignore_eos") == Some(&Value::Bool(true)) {
        sp.insert("ignore_eos".into(), json!(true));
    }
    if max_tokens != 16 {
        sp.insert("max_tokens".into(), json!(max_tokens));
    }
    if let Some(m) = set("min_tokens").filter(|m| m.as_u64().is_some_and(|m| m > 0)) {
        sp.insert("min_tokens".into(), m);
    }
    let logprobs = match chat {
        true => (req.get("logprobs") == Some(&Value::Bool(true))).then(|| set("top_logprobs").unwrap_or(json!(0))),
        false => set("logprobs"),
    };
    if let Some(lp) = logprobs {
        sp.insert("logprobs".into(), lp);
    }
    if chat {
        sp.insert("skip_special_tokens".into(), json!(false));
    }
    sp.insert("output_kind".into(), json!(if stream { 1 } else { 2 }));
    sp.insert("skip_clone".into(), json!(true));
    if let Some(so) = so {
        sp.insert("structured_outputs".into(), so);
    }
    sp.insert("bad_words".into(), json!([]));
    sp.insert("skip_reading_prefix_cache".into(), json!(false));
    if max_tokens == 16 && since(Change::RenderKeepsDefaultMaxTokens) {
        sp.insert("max_tokens".into(), json!(16));
    }
    Value::Object(sp)
}
