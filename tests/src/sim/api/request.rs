//! Request parsing shared by the generation routes, with vLLM's validation order and messages:
//! content type and JSON first (400 `Bad Request`), field rules, then the model check (404).

use axum::http::{HeaderMap, StatusCode};
use serde_json::{Map, Value};

use super::{error, pydantic, validation_error, ApiError, App};

/// vLLM's `ReasoningEffort` literal set.
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh", "max"];

pub(crate) fn random_hex(len: usize) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut rng = crate::sim::text::Rng::new(
        nanos
            ^ COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ u64::from(std::process::id()),
    );
    let mut s = String::with_capacity(len);
    while s.len() < len {
        s.push_str(&format!("{:016x}", rng.next()));
    }
    s.truncate(len);
    s
}

/// Python's repr of a summarised pydantic input.
fn summarise(v: &Value) -> String {
    match v {
        Value::Object(m) => format!("'<dict of {} items>'", m.len()),
        Value::Array(a) => format!("'<list of {} items>'", a.len()),
        Value::String(s) => format!("'{}'", s.chars().take(200).collect::<String>()),
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        other => other.to_string(),
    }
}

/// A pydantic-style validation failure for field `loc` of the body.
pub(crate) fn invalid(kind: &str, field: &str, msg: &str, input: &Value) -> ApiError {
    let loc = format!("body.{field}");
    validation_error(
        &format!(
            "{{'type': '{kind}', 'loc': '{loc}', 'msg': \"{msg}\", 'input': {}}}",
            summarise(input)
        ),
        Some(&loc),
    )
}

/// Python's `json` message for a decode error serde reports (the family clients see).
fn python_json_error(e: &serde_json::Error) -> &'static str {
    use serde_json::error::Category;
    let text = e.to_string();
    match e.classify() {
        Category::Eof if text.contains("string") => "Unterminated string starting at",
        Category::Syntax if text.contains("key must be a string") => {
            "Expecting property name enclosed in double quotes"
        }
        Category::Syntax if text.contains("expected `,` or `}`") => "Expecting ',' delimiter",
        Category::Syntax if text.contains("expected `:`") => "Expecting ':' delimiter",
        Category::Syntax if text.contains("trailing characters") => "Extra data",
        _ => "Expecting value",
    }
}

/// The bytes Python's `json.loads` parses (`json.detect_encoding`, Lib/json/__init__.py): UTF-8
/// past a byte-order mark; UTF-16 or UTF-32 by their mark, or by where the first NUL bytes fall.
/// Text that does not decode is left as it came, for the JSON error to report.
fn python_json_text(b: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    // (bytes to skip, code unit width, big-endian)
    let (skip, width, big) = match b {
        [0, 0, 0xfe, 0xff, ..] => (4, 4, true),
        [0xff, 0xfe, 0, 0, ..] => (4, 4, false),
        [0xfe, 0xff, ..] => (2, 2, true),
        [0xff, 0xfe, ..] => (2, 2, false),
        [0xef, 0xbb, 0xbf, ..] => return Cow::Borrowed(&b[3..]),
        [0, 0, _, _, ..] => (0, 4, true),
        [0, _, _, _, ..] | [0, _] => (0, 2, true),
        [_, 0, 0, 0, ..] => (0, 4, false),
        [_, 0, _, _, ..] | [_, 0] => (0, 2, false),
        _ => return Cow::Borrowed(b),
    };
    let units = b[skip..].chunks(width).map(|c| {
        let word = c.iter().fold(0u32, |acc, byte| (acc << 8) | u32::from(*byte));
        if big || width == 1 {
            word
        } else if width == 2 {
            u32::from(u16::swap_bytes(word as u16))
        } else {
            word.swap_bytes()
        }
    });
    let text: Option<String> = if width == 2 {
        char::decode_utf16(units.map(|u| u as u16))
            .collect::<Result<_, _>>()
            .ok()
    } else {
        units.map(char::from_u32).collect()
    };
    match text {
        Some(t) if (b.len() - skip) % width == 0 => Cow::Owned(t.into_bytes()),
        _ => Cow::Borrowed(b),
    }
}

/// The body as a JSON object, after vLLM's content-type check.
pub(crate) fn json_object(headers: &HeaderMap, body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    // vLLM's `validate_json_request` (serve/utils/api_utils.py): lower-cased, cut at the first
    // `;`, compared as is.
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.split(';').next() != Some("application/json") {
        return Err(validation_error(
            "Unsupported Media Type: Only 'application/json' is allowed",
            None,
        ));
    }
    let text = python_json_text(body);
    let body: &[u8] = &text;
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(pydantic::to_error(&[pydantic::PyErr::new(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            &other,
        )])),
        Err(e) => {
            // Python reports the character offset where decoding stopped.
            let line_start: usize = body
                .split(|b| *b == b'\n')
                .take(e.line().saturating_sub(1))
                .map(|l| l.len() + 1)
                .sum();
            let offset = String::from_utf8_lossy(&body[..(line_start + e.column()).min(body.len())])
                .chars()
                .count();
            let mut err = pydantic::PyErr::new(
                "json_invalid",
                &format!("body.{offset}"),
                "JSON decode error",
                &Value::Object(Map::new()),
            );
            err.ctx = Some(format!("'error': {}", pydantic::repr_str(python_json_error(&e))));
            Err(pydantic::to_error(&[err]))
        }
    }
}

/// vLLM's `validate_request_mm_kwargs` (generate/base/protocol.py), run by the renderer: the
/// simulator, like vLLM by default, does not trust per-request multimodal kwargs.
pub(crate) fn untrusted_mm_kwargs(req: &Map<String, Value>) -> Result<(), ApiError> {
    let set = |k: &str| req.get(k).and_then(Value::as_object).is_some_and(|m| !m.is_empty());
    for (field, what) in [
        ("mm_processor_kwargs", "preprocessing"),
        ("media_io_kwargs", "media loading"),
    ] {
        if set(field) {
            let kind = field.trim_end_matches("_kwargs");
            return Err(super::bad_request(
                &format!(
                    "Per-request {kind}_kwargs are disabled by default because they can change multimodal {what} resource usage. Start the server with --trust-request-mm-kwargs only when clients are trusted."
                ),
                Some(field),
                None,
            ));
        }
    }
    Ok(())
}

/// The engine's input check (v1/engine/input_processor.py): `routed_experts_prompt_start`
/// within the prompt.
pub(crate) fn routed_experts_start(req: &Map<String, Value>, prompt_len: usize) -> Result<(), ApiError> {
    match req.get("routed_experts_prompt_start").and_then(Value::as_i64) {
        Some(start) if start < 0 || start as usize > prompt_len => Err(super::bad_request(
            &format!("routed_experts_prompt_start must be between 0 and the prompt length ({prompt_len}), inclusive."),
            Some("routed_experts_prompt_start"),
            Some(&start.to_string()),
        )
        .in_stream_if(streaming(req))),
        _ => Ok(()),
    }
}

/// The renderer's truncation bound (renderers/base.py): `truncate_prompt_tokens` no larger than
/// the context.
pub(crate) fn truncation(app: &App, req: &Map<String, Value>) -> Result<(), ApiError> {
    let Some(t) = req.get("truncate_prompt_tokens").and_then(Value::as_i64) else {
        return Ok(());
    };
    let limit = app.args.max_model_len as i64;
    if t > limit {
        return Err(super::bad_request(
            &format!(
                "truncate_prompt_tokens={t} cannot be greater than max_model_len = {limit}. Please request a smaller truncation size."
            ),
            Some("truncate_prompt_tokens"),
            Some(&t.to_string()),
        ));
    }
    Ok(())
}

/// Whether the (schema-coerced) request asked for a stream.
pub(crate) fn streaming(req: &Map<String, Value>) -> bool {
    req.get("stream") == Some(&Value::Bool(true))
}

/// The engine's input check (after the sampling parameters): a prompt truncated to nothing.
/// Raised inside a stream that has begun.
pub(crate) fn empty_decoder_prompt(req: &Map<String, Value>) -> Result<(), ApiError> {
    if req.get("truncate_prompt_tokens").and_then(Value::as_i64) == Some(0) {
        return Err(super::bad_request("The decoder prompt cannot be empty", None, None).in_stream_if(streaming(req)));
    }
    Ok(())
}

/// 404 for a model that is not one of the served names; absent, null or empty is fine.
pub(crate) fn check_model(app: &App, req: &Map<String, Value>) -> Result<(), ApiError> {
    match req.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m.is_empty() || app.args.served_model_names.contains(m) => Ok(()),
        Some(Value::String(m)) => Err(error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            &format!(
                "The model `{m}` does not exist. Valid aliases: {}.",
                app.args.served_model_names.join(", ")
            ),
            Some("model"),
        )),
        Some(other) => Err(invalid("string_type", "model", "Input should be a valid string", other)),
    }
}

/// The id the response carries: header `X-Request-Id`, else body `request_id`, else random.
pub(crate) fn request_id(headers: &HeaderMap, req: &Map<String, Value>) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.get("request_id").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| random_hex(16))
}

/// The chat template kwargs after vLLM's merge: request kwargs, overridden by the top-level
/// `reasoning_effort` (and the `enable_thinking` it implies), over the server defaults.
pub(crate) fn template_kwargs(app: &App, req: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let effort = match req.get("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Some(e.clone()),
        Some(other) => {
            return Err(invalid(
                "literal_error",
                "reasoning_effort",
                "Input should be 'none', 'minimal', 'low', 'medium', 'high', 'xhigh' or 'max'",
                other,
            ))
        }
    };
    let mut kwargs = match req.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(invalid(
                "dict_type",
                "chat_template_kwargs",
                "Input should be a valid dictionary",
                other,
            ))
        }
    };
    if let Some(effort) = effort {
        if !kwargs.contains_key("enable_thinking") {
            kwargs.insert("enable_thinking".into(), Value::Bool(effort != "none"));
        }
        kwargs.insert("reasoning_effort".into(), Value::String(effort));
    }
    let mut merged = app.args.default_chat_template_kwargs.clone();
    for (k, v) in kwargs {
        if !v.is_null() && v != Value::String("auto".into()) {
            merged.insert(k, v);
        }
    }
    Ok(merged)
}

/// Refuses a request-supplied chat template (vLLM needs `--trust-request-chat-template`).
pub(crate) fn refuse_chat_template(app: &App, req: &Map<String, Value>) -> Result<(), ApiError> {
    let in_kwargs = req
        .get("chat_template_kwargs")
        .and_then(Value::as_object)
        .is_some_and(|k| k.contains_key("chat_template"));
    if (req.get("chat_template").is_some_and(|v| !v.is_null()) || in_kwargs) && !app.args.trust_request_chat_template {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.",
            None,
        ));
    }
    Ok(())
}

/// Streaming switches: `stream` (bool), and `stream_options` only when streaming.
pub(crate) struct StreamOptions {
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) continuous_usage: bool,
}

pub(crate) fn stream_options(app: &App, req: &Map<String, Value>) -> Result<StreamOptions, ApiError> {
    // The schema has made `stream` a boolean and the before-validator has refused options
    // without a stream (`validate_stream_options`).
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let opts = req.get("stream_options").filter(|v| !v.is_null());
    let flag = |k: &str| opts.and_then(|o| o.get(k)).and_then(Value::as_bool).unwrap_or(false);
    let force = app.args.enable_force_include_usage;
    Ok(StreamOptions {
        stream,
        include_usage: flag("include_usage") || force,
        continuous_usage: flag("continuous_usage_stats") || force,
    })
}

/// `max_tokens` (or `max_completion_tokens`): a positive integer no larger than max_model_len.
pub(crate) fn max_tokens(app: &App, req: &Map<String, Value>, names: &[&str]) -> Result<Option<u64>, ApiError> {
    for name in names {
        match req.get(*name) {
            None | Some(Value::Null) => continue,
            Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v >= 1) => {
                let v = n.as_u64().unwrap_or(1);
                if v > app.args.max_model_len {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        "BadRequestError",
                        &format!(
                            "{name}={v} cannot be greater than max_model_len={}. Please request fewer output tokens.",
                            app.args.max_model_len
                        ),
                        Some(name),
                    ));
                }
                return Ok(Some(v));
            }
            // SamplingParams' `_verify_args`, under its own name for the field.
            Some(Value::Number(n)) if n.as_i64().is_some() => {
                let v = n.as_i64().unwrap_or(0);
                return Err(super::bad_request(
                    &format!("max_tokens must be at least 1, got {v}."),
                    Some("max_tokens"),
                    Some(&v.to_string()),
                ));
            }
            Some(other) => {
                return Err(invalid(
                    "greater_than_equal",
                    name,
                    "Input should be greater than or equal to 1",
                    other,
                ))
            }
        }
    }
    Ok(None)
}

/// `n` (default 1), already checked by `validate`.
pub(crate) fn n_choices(req: &Map<String, Value>) -> Result<usize, ApiError> {
    Ok(req.get("n").and_then(Value::as_u64).unwrap_or(1).max(1) as usize)
}

/// What rendering refuses: DeepSeek's encoder checks roles and the effort; GLM's template
/// cannot render an empty conversation.
pub(crate) fn render_checks(app: &App, messages: &[Value], kwargs: &Map<String, Value>) -> Result<(), ApiError> {
    use crate::sim::text::Template;
    let refuse = |m: &str| Err(super::bad_request(m, None, None));
    match app.template {
        Template::DeepSeek => {
            for m in messages {
                let role = m.get("role").unwrap_or(&Value::Null);
                if !["system", "developer", "user", "assistant", "tool"]
                    .iter()
                    .any(|r| role == r)
                {
                    return refuse(&format!("Invalid role: {}", pydantic::py_str(role)));
                }
            }
        }
        Template::Glm if messages.is_empty() => {
            return refuse("Cannot apply chat template to an empty conversation. Provide at least one message.")
        }
        Template::Glm => {}
    }
    app.template.check(kwargs).or_else(refuse)
}

/// The context-length check on the rendered prompt.
pub(crate) fn check_prompt_length(app: &App, prompt_tokens: usize) -> Result<(), ApiError> {
    if prompt_tokens as u64 > app.args.max_model_len {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            &format!(
                "This model's maximum context length is {} tokens. However, your prompt contains at least {} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={})",
                app.args.max_model_len,
                app.args.max_model_len + 1,
                app.args.max_model_len + 1,
            ),
            Some("input_tokens"),
        ));
    }
    Ok(())
}

/// `stop`: one string or a list of them.
pub(crate) fn stop_strings(req: &Map<String, Value>) -> Vec<String> {
    match req.get("stop") {
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}
