//! vLLM 0.33's request checks in its order: the request models' `mode="before"` validators,
//! then pydantic's field types (`pydantic`), then — after the model check and rendering —
//! `SamplingParams` verification. The field tables list each model's simple fields in
//! declaration order (the order pydantic reports errors in).

use serde_json::{Map, Value};

use super::pydantic::{self, Field, Kind};
use super::{bad_request, ApiError, App};

const EFFORT: Kind = Kind::Lit(&["none", "minimal", "low", "medium", "high", "xhigh", "max"]);

/// A request model's simple fields in declaration order, as runs of tables.
pub(crate) type Model = &'static [&'static [Field]];

/// `ChatCompletionRequest`'s simple fields.
pub(crate) const CHAT: Model = &[CHAT_HEAD, SAMPLING, CHAT_TAIL];

/// `CompletionRequest`'s simple fields.
pub(crate) const COMPLETION: Model = &[COMPLETION_HEAD, SAMPLING, COMPLETION_TAIL];

const CHAT_HEAD: &[Field] = &[
    ("messages", Kind::List, false),
    ("model", Kind::Str, true),
    ("frequency_penalty", Kind::Float, true),
    ("logit_bias", Kind::Dict, true),
    ("logprobs", Kind::Bool, true),
    ("top_logprobs", Kind::Int, false),
    ("max_tokens", Kind::Int, true),
    ("max_completion_tokens", Kind::Int, true),
    ("n", Kind::Int, true),
    ("presence_penalty", Kind::Float, true),
    ("response_format", Kind::Any, true),
    ("seed", Kind::Int, true),
    ("stream", Kind::Bool, true),
    ("temperature", Kind::Float, true),
    ("top_p", Kind::Float, true),
    ("tools", Kind::List, true),
    ("reasoning_effort", EFFORT, true),
    ("thinking_token_budget", Kind::Int, true),
    ("include_reasoning", Kind::Bool, false),
    ("parallel_tool_calls", Kind::Bool, true),
    ("user", Kind::Str, true),
];

/// The sampling fields both models declare, in their shared order.
const SAMPLING: &[Field] = &[];

const COMPLETION_TAIL: &[Field] = &[];

const CHAT_TAIL: &[Field] = &[
    ("spaces_between_special_tokens", Kind::Bool, false),
    ("echo", Kind::Bool, false),
    ("add_generation_prompt", Kind::Bool, false),
    ("continue_final_message", Kind::Bool, false),
    ("add_special_tokens", Kind::Bool, false),
    ("chat_template", Kind::Str, true),
    ("chat_template_kwargs", Kind::Dict, true),
    ("priority", Kind::Int, false),
    ("request_id", Kind::Str, false),
    ("cache_salt", Kind::Str, true),
];

const COMPLETION_HEAD: &[Field] = &[
    ("model", Kind::Str, true),
    ("echo", Kind::Bool, true),
    ("frequency_penalty", Kind::Float, true),
    ("logit_bias", Kind::Dict, true),
    ("logprobs", Kind::Int, true),
    ("max_tokens", Kind::Int, true),
    ("n", Kind::Int, false),
    ("presence_penalty", Kind::Float, true),
    ("seed", Kind::Int, true),
    ("stream", Kind::Bool, true),
    ("suffix", Kind::Str, true),
    ("temperature", Kind::Float, true),
    ("top_p", Kind::Float, true),
    ("user", Kind::Str, true),
    ("use_beam_search", Kind::Bool, false),
    ("top_k", Kind::Int, true),
    ("min_p", Kind::Float, true),
    ("repetition_penalty", Kind::Float, true),
    ("length_penalty", Kind::Float, false),
    ("stop_token_ids", Kind::List, true),
    ("include_stop_str_in_output", Kind::Bool, false),
    ("ignore_eos", Kind::Bool, false),
    ("min_tokens", Kind::Int, false),
    ("skip_special_tokens", Kind::Bool, true),
    ("add_special_tokens", Kind::Bool, false),
    ("response_format", Kind::Any, true),
    ("priority", Kind::Int, false),
    ("request_id", Kind::Str, false),
];

/// Python truthiness of a raw JSON value (`data.get(x)` in a before-validator).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// The `mode="before"` validators shared by chat and completions (stream options).
pub(crate) fn stream_options_need_stream(req: &Map<String, Value>) -> Result<(), ApiError> {
    if truthy(req.get("stream_options")) && !truthy(req.get("stream")) {
        return Err(bad_request(
            "Stream options can only be defined when `stream=True`.",
            Some("stream_options"),
            None,
        ));
    }
    Ok(())
}

/// `ChatCompletionRequest`'s `mode="before"` validators.
pub(crate) fn chat_before(req: &Map<String, Value>) -> Result<(), ApiError> {
    stream_options_need_stream(req)?;
    if let Some(top) = req.get("top_logprobs").filter(|v| !v.is_null()) {
        let Some(n) = top.as_f64() else {
            return Err(bad_request(
                "`top_logprobs` must be an integer.",
                Some("top_logprobs"),
                Some(&pydantic::py_str(top)),
            ));
        };
        if n < 0.0 && n != -1.0 {
            return Err(bad_request(
                "`top_logprobs` must be a positive value or -1.",
                Some("top_logprobs"),
                Some(&pydantic::py_str(top)),
            ));
        }
        if (n == -1.0 || n > 0.0) && !truthy(req.get("logprobs")) {
            return Err(bad_request(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                Some("top_logprobs"),
                None,
            ));
        }
    }
    if req.get("tools") == Some(&Value::Array(Vec::new())) {
        return Err(bad_request(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            Some("tools"),
            None,
        ));
    }
    match req.get("tool_choice") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s == "none" => Ok(()),
        Some(_) if req.get("tools").is_none_or(Value::is_null) => Err(bad_request(
            "When using `tool_choice`, `tools` must be set.",
            Some("tool_choice"),
            None,
        )),
        Some(Value::String(s)) if s == "auto" || s == "required" => Ok(()),
        Some(Value::Object(_)) => Ok(()),
        Some(other) => Err(bad_request(
            &format!(
                "Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or \"required\" are supported.",
                pydantic::py_str(other)
            ),
            Some("tool_choice"),
            None,
        )),
    }
}

/// Pydantic's pass over the fields (coercing in place); `required` fields must be present.
pub(crate) fn fields(req: &mut Map<String, Value>, model: &[&[Field]], required: &[&str]) -> Result<(), ApiError> {
    let table: Vec<Field> = model.concat();
    let table = table.as_slice();
    let mut errors = Vec::new();
    for (name, _, _) in table {
        if required.contains(name) && !req.contains_key(*name) {
            errors.push(pydantic::missing(name, req));
        }
    }
    errors.extend(pydantic::check_fields(req, table));
    if table.iter().any(|f| f.0 == "response_format") {
        errors.extend(response_format(req));
    }
    // pydantic reports in field declaration order.
    errors.sort_by_key(|e| {
        let field = e.loc.strip_prefix("body.").unwrap_or(&e.loc);
        let field = field.split('.').next().unwrap_or(field);
        table.iter().position(|f| f.0 == field)
    });
    if errors.is_empty() {
        Ok(())
    } else {
        Err(pydantic::to_error(&errors))
    }
}

fn number(req: &Map<String, Value>, name: &str) -> Option<f64> {
    req.get(name).and_then(Value::as_f64)
}

/// Python's rendering of a float field's value (`2.0`, `-1.0`).
fn float_str(v: f64) -> String {
    pydantic::py_str(&Value::from(v))
}

/// `SamplingParams` verification, in vLLM's order, for the given max-tokens field names.
pub(crate) fn sampling(app: &App, req: &Map<String, Value>, max_names: &[&str]) -> Result<(), ApiError> {
    if let Some(n) = req.get("n").and_then(Value::as_i64) {
        if n < 1 {
            return Err(bad_request(&format!("n must be at least 1, got {n}."), None, None));
        }
    }
    if let Some(t) = number(req, "temperature") {
        let v = float_str(t);
        if t < 0.0 {
            return Err(bad_request(
                &format!("temperature must be non-negative, got {v}."),
                Some("temperature"),
                Some(&v),
            ));
        }
        if t > 2.0 {
            return Err(bad_request(
                &format!("temperature must be in [0, 2], got {v}."),
                Some("temperature"),
                Some(&v),
            ));
        }
    }
    if let Some(p) = number(req, "top_p") {
        if !(p > 0.0 && p <= 1.0) {
            let v = float_str(p);
            return Err(bad_request(
                &format!("top_p must be in (0, 1], got {v}."),
                Some("top_p"),
                Some(&v),
            ));
        }
    }
    let max = max_names
        .iter()
        .find_map(|n| req.get(*n).and_then(Value::as_i64).map(|v| (*n, v)));
    if let Some((_, m)) = max {
        if m < 1 {
            return Err(bad_request(
                &format!("max_tokens must be at least 1, got {m}."),
                Some("max_tokens"),
                Some(&m.to_string()),
            ));
        }
        let limit = app.args.max_model_len as i64;
        if m > limit {
            return Err(bad_request(
                &format!(
                    "max_tokens={m} cannot be greater than max_model_len={limit}. Please request fewer output tokens."
                ),
                Some("max_tokens"),
                Some(&m.to_string()),
            ));
        }
    }
    Ok(())
}

/// `response_format` is a union of `{type: text|json_object|json_schema}` and two structural-tag
/// forms; an unknown `type` fails every branch, and pydantic lists them all.
fn response_format(req: &Map<String, Value>) -> Vec<pydantic::PyErr> {
    let Some(Value::Object(rf)) = req.get("response_format") else {
        return Vec::new();
    };
    let kind = rf.get("type").cloned().unwrap_or(Value::Null);
    if ["text", "json_object", "json_schema", "structural_tag"]
        .iter()
        .any(|t| kind == *t)
    {
        return Vec::new();
    }
    let loc = "body.response_format.type";
    let lit = |options: &str| {
        let mut e = pydantic::PyErr::new("literal_error", loc, &format!("Input should be {options}"), &kind);
        e.ctx = Some(format!("'expected': {}", pydantic::repr_str(options)));
        e
    };
    let whole = Value::Object(rf.clone());
    let missing = |field: &str| {
        pydantic::PyErr::new(
            "missing",
            &format!("body.response_format.{field}"),
            "Field required",
            &whole,
        )
    };
    vec![
        lit("'text', 'json_object' or 'json_schema'"),
        lit("'structural_tag'"),
        missing("format"),
        lit("'structural_tag'"),
        missing("structures"),
        missing("triggers"),
    ]
}
