//! The request models' `mode="before"` validators, which vLLM 0.33 runs on the raw body before
//! pydantic checks a single field type (so their refusals win over the schema's). Pydantic runs a
//! class's before-validators last-defined first; each list below is in that order, each entry
//! naming the vLLM function it ports (chat_completion/protocol.py, completion/protocol.py,
//! generate/base/protocol.py).

use serde_json::{json, Map, Value};

use super::pydantic::{py_repr, py_str};
use super::{bad_request, internal_error, ApiError};
use crate::sim::changes::{since, Change};

type Body = Map<String, Value>;

/// One before-validator.
pub(crate) type Before = fn(&mut Body) -> Result<(), ApiError>;

/// `ChatCompletionRequest`'s, in the order they run.
pub(crate) const CHAT: &[Before] = &[
    check_system_message_content_type,
    check_generation_prompt,
    check_tool_usage,
    chat_structured_outputs_count,
    chat_check_logprobs,
    validate_stream_options,
    validate_response_format,
    check_cache_salt_support,
];

/// `CompletionRequest`'s, in the order they run.
pub(crate) const COMPLETION: &[Before] = &[
    validate_prompt_and_prompt_embeds,
    validate_stream_options,
    completion_check_logprobs,
    completion_structured_outputs_count,
    validate_response_format,
    check_cache_salt_support,
];

/// `ResponsesRequest`'s that the fuzzer reaches (responses/protocol.py).
pub(crate) const RESPONSES: &[Before] = &[
    responses_tool_usage,
    check_custom_tool_format,
    super::responses::input::input_item_parsing,
    validate_prompt,
    validate_background,
    check_cache_salt_support,
];

/// The field validators that raise `VLLMValidationError`, which is no `ValueError`: pydantic
/// does not collect it, so it ends validation the moment the field is reached and wins over
/// every type error pydantic has collected (in field order).
pub(crate) const CHAT_FIELDS: &[Before] = &[thinking_token_budget, structured_outputs_constraint];
pub(crate) const COMPLETION_FIELDS: &[Before] = &[thinking_token_budget, structured_outputs_constraint];
pub(crate) const RESPONSES_FIELDS: &[Before] = &[responses_thinking_token_budget, structured_outputs_constraint];

/// Runs `list` on `body`; the first refusal.
pub(crate) fn run(list: &[Before], body: &mut Body) -> Result<(), ApiError> {
    list.iter().try_for_each(|check| check(body))
}

/// Python truthiness of `data.get(key)`.
fn truthy(body: &Body, key: &str) -> bool {
    match body.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

fn present<'a>(body: &'a Body, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

/// Python's type name, as an `AttributeError` on a non-dict names it.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// `check_generation_prompt`.
fn check_generation_prompt(body: &mut Body) -> Result<(), ApiError> {
    if truthy(body, "continue_final_message") && truthy(body, "add_generation_prompt") {
        return Err(bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            None,
            None,
        ));
    }
    Ok(())
}

/// `check_tool_usage`. From 0.34 an empty `tools` list without a named tool reads as no tools,
/// and `auto` or `required` then as `none` (0.33 refused the list).
fn check_tool_usage(body: &mut Body) -> Result<(), ApiError> {
    if body.get("tools") == Some(&Value::Array(Vec::new())) {
        if !since(Change::EmptyToolsAreNoTools) {
            return Err(bad_request(
                "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
                Some("tools"),
                None,
            ));
        }
        // A named tool keeps the empty list, so the match below names the mismatch.
        if !body.get("tool_choice").is_some_and(Value::is_object) {
            body.insert("tools".into(), Value::Null);
            if matches!(
                body.get("tool_choice").and_then(Value::as_str),
                Some("auto" | "required")
            ) {
                body.insert("tool_choice".into(), json!("none"));
            }
        }
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) if s == "none" => return Ok(()),
        Some(c) => c,
    };
    if present(body, "tools").is_none() {
        return Err(bad_request(
            "When using `tool_choice`, `tools` must be set.",
            Some("tool_choice"),
            None,
        ));
    }
    match choice {
        Value::String(s) if s == "auto" || s == "required" => Ok(()),
        Value::Object(named) => {
            let name = check_named_tool(named)?;
            named_tool_listed(body, name)
        }
        other => Err(bad_request(
            &format!(
                "Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or \"required\" are supported.",
                py_str(other)
            ),
            Some("tool_choice"),
            None,
        )),
    }
}

const CORRECT_USAGE: &str = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";

/// `check_tool_usage`'s loop over `tools` for the named tool: each entry is read as
/// `tool["function"]["name"]`, so an entry that is not a mapping with a `function` mapping
/// ends the request with Python's error (a 500, as in vLLM).
fn named_tool_listed(body: &Body, name: &str) -> Result<(), ApiError> {
    for tool in body.get("tools").and_then(Value::as_array).into_iter().flatten() {
        let function = subscript(tool, "function")?;
        if subscript(function, "name")? == &Value::String(name.to_owned()) {
            return Ok(());
        }
    }
    let message = if since(Change::EmptyToolsAreNoTools) {
        format!("The tool `{name}` specified in `tool_choice` does not match any of the specified `tools`")
    } else {
        "The tool specified in `tool_choice` does not match any of the specified `tools`".to_owned()
    };
    Err(bad_request(&message, Some("tool_choice"), None))
}

/// Python's `value[key]` with a string key: the value, or the `KeyError` / `TypeError` text.
fn subscript<'a>(value: &'a Value, key: &str) -> Result<&'a Value, ApiError> {
    match value {
        Value::Object(o) => o.get(key).ok_or_else(|| internal_error(&format!("'{key}'"))),
        Value::Array(_) => Err(internal_error("list indices must be integers or slices, not str")),
        Value::String(_) => Err(internal_error("string indices must be integers, not 'str'")),
        other => Err(internal_error(&format!(
            "'{}' object is not subscriptable",
            type_name(other)
        ))),
    }
}

/// `check_tool_usage`'s named-tool part: the name it names.
fn check_named_tool(named: &Body) -> Result<&str, ApiError> {
    let function = match named.get("function") {
        Some(Value::Object(f)) => f,
        other => {
            let shown = other.map_or_else(|| "None".to_owned(), py_repr);
            return Err(bad_request(
                &format!("Invalid value for `function`: `{shown}` in `tool_choice`! {CORRECT_USAGE}"),
                Some("tool_choice.function"),
                None,
            ));
        }
    };
    match function.get("name") {
        None => Err(bad_request(
            &format!("Expected field `name` in `function` in `tool_choice`! {CORRECT_USAGE}"),
            Some("tool_choice.function.name"),
            None,
        )),
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(other) => Err(bad_request(
            &format!(
                "Invalid `name` in `function`: `{}` in `tool_choice`! {CORRECT_USAGE}",
                py_str(other)
            ),
            Some("tool_choice.function.name"),
            None,
        )),
    }
}

/// How many of `json`, `regex` and `choice` a `structured_outputs` dict sets; a value that is
/// not a dict fails on `.get` with Python's `AttributeError` (a 500, as in vLLM).
fn structured_count(body: &Body) -> Result<usize, ApiError> {
    match present(body, "structured_outputs") {
        None => Ok(0),
        Some(Value::Object(so)) => Ok(["json", "regex", "choice"]
            .iter()
            .filter(|k| present(so, k).is_some())
            .count()),
        Some(other) => Err(internal_error(&format!(
            "'{}' object has no attribute 'get'",
            type_name(other)
        ))),
    }
}

const ONE_KIND: &str = "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').";

/// Chat's `check_structured_outputs_count`.
fn chat_structured_outputs_count(body: &mut Body) -> Result<(), ApiError> {
    let count = structured_count(body)?;
    if count > 1 {
        return Err(bad_request(ONE_KIND, None, None));
    }
    let choice_is_plain = match body.get("tool_choice") {
        None => true,
        Some(Value::String(s)) => ["none", "auto", "required"].contains(&s.as_str()),
        Some(_) => false,
    };
    if count > 0 && !choice_is_plain {
        return Err(bad_request(
            "You can only either use constraints for structured outputs or tools, not both.",
            None,
            None,
        ));
    }
    Ok(())
}

/// Completions' `check_structured_outputs_count`.
fn completion_structured_outputs_count(body: &mut Body) -> Result<(), ApiError> {
    if structured_count(body)? > 1 {
        return Err(bad_request(ONE_KIND, Some("structured_outputs"), None));
    }
    Ok(())
}

/// `isinstance(v, (int, float))`, else "`field` must be an integer."
fn numeric(body: &Body, field: &str) -> Result<Option<f64>, ApiError> {
    match present(body, field) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(f64::from(u8::from(*b)))),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(bad_request(
            &format!("`{field}` must be an integer."),
            Some(field),
            Some(&py_str(other)),
        )),
    }
}

/// The shared tail of both `check_logprobs`: `prompt_logprobs` and one per-token field.
fn logprob_ranges(body: &Body, token_field: &str, needs_logprobs: bool) -> Result<(), ApiError> {
    let prompt = numeric(body, "prompt_logprobs")?;
    let token = numeric(body, token_field)?;
    let shown = |f: &str| body.get(f).map(py_str);
    if let Some(p) = prompt {
        if truthy(body, "stream") && (p > 0.0 || p == -1.0) {
            return Err(bad_request(
                "`prompt_logprobs` are not available when `stream=True`.",
                Some("prompt_logprobs"),
                None,
            ));
        }
        if p < 0.0 && p != -1.0 {
            return Err(bad_request(
                "`prompt_logprobs` must be a positive value or -1.",
                Some("prompt_logprobs"),
                shown("prompt_logprobs").as_deref(),
            ));
        }
    }
    if let Some(t) = token {
        if t < 0.0 && t != -1.0 {
            return Err(bad_request(
                &format!("`{token_field}` must be a positive value or -1."),
                Some(token_field),
                shown(token_field).as_deref(),
            ));
        }
        if needs_logprobs && (t == -1.0 || t > 0.0) && !truthy(body, "logprobs") {
            return Err(bad_request(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                Some("top_logprobs"),
                None,
            ));
        }
    }
    Ok(())
}

fn no_ids_with_beam_search(body: &Body) -> Result<(), ApiError> {
    if truthy(body, "logprob_token_ids") && truthy(body, "use_beam_search") {
        return Err(bad_request(
            "`logprob_token_ids` is not supported with beam search.",
            Some("logprob_token_ids"),
            None,
        ));
    }
    Ok(())
}

/// Chat's `check_logprobs`.
fn chat_check_logprobs(body: &mut Body) -> Result<(), ApiError> {
    no_ids_with_beam_search(body)?;
    if truthy(body, "logprob_token_ids") && !truthy(body, "logprobs") {
        return Err(bad_request(
            "when using `logprob_token_ids`, `logprobs` must be set to true.",
            Some("logprob_token_ids"),
            None,
        ));
    }
    logprob_ranges(body, "top_logprobs", true)
}

/// Completions' `check_logprobs`.
fn completion_check_logprobs(body: &mut Body) -> Result<(), ApiError> {
    no_ids_with_beam_search(body)?;
    if truthy(body, "use_beam_search") && truthy(body, "echo") && present(body, "logprobs").is_some() {
        return Err(bad_request(
            "`echo` with `logprobs` is not supported with beam search because beam search does not compute prompt logprobs.",
            Some("echo"),
            None,
        ));
    }
    let max_zero = body.get("max_tokens").and_then(Value::as_f64) == Some(0.0);
    if truthy(body, "logprob_token_ids") && truthy(body, "echo") && max_zero {
        return Err(bad_request(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output tokens are generated.",
            Some("logprob_token_ids"),
            None,
        ));
    }
    if truthy(body, "logprob_token_ids") && present(body, "logprobs").is_none() {
        return Err(bad_request(
            "when using `logprob_token_ids`, `logprobs` must be set.",
            Some("logprob_token_ids"),
            None,
        ));
    }
    logprob_ranges(body, "logprobs", false)
}

/// `validate_stream_options`.
pub(crate) fn validate_stream_options(body: &mut Body) -> Result<(), ApiError> {
    if truthy(body, "stream_options") && !truthy(body, "stream") {
        return Err(bad_request(
            "Stream options can only be defined when `stream=True`.",
            Some("stream_options"),
            None,
        ));
    }
    Ok(())
}

/// `validate_response_format` (the structural-tag check is left to the schema).
fn validate_response_format(body: &mut Body) -> Result<(), ApiError> {
    let Some(Value::Object(rf)) = present(body, "response_format") else {
        return Ok(());
    };
    if rf.get("type").and_then(Value::as_str) == Some("json_schema") && present(rf, "json_schema").is_none() {
        return Err(bad_request(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            Some("response_format"),
            None,
        ));
    }
    Ok(())
}

/// `validate_cache_salt` (generate/base/protocol.py).
fn check_cache_salt_support(body: &mut Body) -> Result<(), ApiError> {
    match present(body, "cache_salt") {
        None => Ok(()),
        Some(Value::String(s)) if !s.is_empty() => {
            if s.chars().count() > 128 || s.contains(['@', '/', '\\', '\0']) {
                return Err(bad_request(
                    "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
                    Some("cache_salt"),
                    None,
                ));
            }
            Ok(())
        }
        Some(_) => Err(bad_request(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
            Some("cache_salt"),
            None,
        )),
    }
}

/// `validate_prompt_and_prompt_embeds`.
fn validate_prompt_and_prompt_embeds(body: &mut Body) -> Result<(), ApiError> {
    let prompt_empty = match present(body, "prompt") {
        None => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    };
    let embeds_empty = match present(body, "prompt_embeds") {
        None => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    if prompt_empty && embeds_empty {
        return Err(bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty.",
            Some("prompt"),
            None,
        ));
    }
    Ok(())
}

/// Responses' `validate_prompt`.
fn validate_prompt(body: &mut Body) -> Result<(), ApiError> {
    if present(body, "prompt").is_some() {
        return Err(bad_request("prompt template is not supported", Some("prompt"), None));
    }
    Ok(())
}

/// Responses' `validate_background`: `data.get("store", True)`.
fn validate_background(body: &mut Body) -> Result<(), ApiError> {
    let store = body.get("store").is_none_or(|_| truthy(body, "store"));
    if truthy(body, "background") && !store {
        return Err(bad_request(
            "background can only be used when `store` is true",
            Some("background"),
            None,
        ));
    }
    Ok(())
}

/// `validate_thinking_token_budget` (sampling_params.py), the field's `BeforeValidator`: an
/// integer, -1 or at least 0 (a boolean or a float is refused).
fn thinking_token_budget(body: &mut Body) -> Result<(), ApiError> {
    let Some(v) = present(body, "thinking_token_budget") else {
        return Ok(());
    };
    match v.as_i64() {
        Some(n) if n >= -1 && !v.is_f64() => Ok(()),
        _ => Err(bad_request(
            "`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
            Some("thinking_token_budget"),
            Some(&py_str(v)),
        )),
    }
}

/// `ResponsesRequest.thinking_token_budget`, a field from 0.34 (an unknown key before).
fn responses_thinking_token_budget(body: &mut Body) -> Result<(), ApiError> {
    if since(Change::ResponsesThinkingTokenBudget) {
        thinking_token_budget(body)?;
    }
    Ok(())
}

/// `StructuredOutputsParams.__post_init__` (sampling_params.py): a `structured_outputs` that
/// sets none of the constraints is refused, its fields shown as Python's `__dict__`. It runs
/// where the request becomes sampling parameters, after the schema.
fn structured_outputs_constraint(body: &mut Body) -> Result<(), ApiError> {
    let Some(Value::Object(so)) = present(body, "structured_outputs") else {
        return Ok(());
    };
    const CONSTRAINTS: &[&str] = &["json", "regex", "choice", "grammar", "json_object", "structural_tag"];
    if CONSTRAINTS.iter().any(|k| present(so, k).is_some()) {
        return Ok(());
    }
    let field = |k: &str, default: Value| format!("'{k}': {}", py_repr(so.get(k).unwrap_or(&default)));
    let fields = [
        field("json", Value::Null),
        field("regex", Value::Null),
        field("choice", Value::Null),
        field("grammar", Value::Null),
        field("json_object", Value::Null),
        field("disable_any_whitespace", Value::Bool(false)),
        field("disable_additional_properties", Value::Bool(false)),
        field("whitespace_pattern", Value::Null),
        field("structural_tag", Value::Null),
        "'_backend': None".to_owned(),
        "'_backend_was_auto': False".to_owned(),
    ];
    Err(bad_request(
        &format!(
            "You must use one kind of structured outputs constraint but none are specified: {{{}}}",
            fields.join(", ")
        ),
        None,
        None,
    ))
}

/// Responses' `check_tool_usage`: `len(tools)` (a `TypeError` for a number or a boolean, which
/// vLLM answers 400), then a tool choice that needs tools.
fn responses_tool_usage(body: &mut Body) -> Result<(), ApiError> {
    let has_tools = match present(body, "tools") {
        None => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(other) => {
            let msg = format!("object of type '{}' has no len()", type_name(other));
            return Err(bad_request(&msg, None, None));
        }
    };
    if has_tools {
        return Ok(());
    }
    let named = body
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .is_some_and(|t| t == "function" || t == "custom");
    let refusal = match body.get("tool_choice") {
        Some(Value::String(s)) if s == "required" => "Tool choice 'required' must be specified with 'tools' parameter.",
        _ if named => "Tool choice 'function' not found in 'tools' parameter.",
        _ => return Ok(()),
    };
    Err(bad_request(refusal, Some("tool_choice"), None))
}

/// Responses' `check_custom_tool_format`.
fn check_custom_tool_format(body: &mut Body) -> Result<(), ApiError> {
    let Some(Value::Array(tools)) = body.get("tools") else {
        return Ok(());
    };
    let grammar = tools.iter().any(|t| {
        t.get("type").is_some_and(|k| k == "custom")
            && t.get("format")
                .and_then(|f| f.get("type"))
                .is_some_and(|k| k == "grammar")
    });
    if grammar {
        return Err(bad_request(
            "Custom tools with a grammar format are not supported; only free-form text custom tools are accepted.",
            Some("tools"),
            None,
        ));
    }
    Ok(())
}

/// `check_system_message_content_type`: `for msg in data.get("messages", [])` — a `TypeError`
/// (answered 400) for a value Python cannot iterate.
fn check_system_message_content_type(body: &mut Body) -> Result<(), ApiError> {
    match body.get("messages") {
        Some(v @ (Value::Null | Value::Bool(_) | Value::Number(_))) => Err(bad_request(
            &format!("'{}' object is not iterable", type_name(v)),
            None,
            None,
        )),
        _ => Ok(()),
    }
}
