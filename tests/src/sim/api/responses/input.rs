//! `ResponsesRequest.input_item_parsing` (responses/protocol.py), a before-validator: input
//! items that pydantic could not tell apart, or that lack fields the SDK's models require, are
//! filled in and parsed as `ResponseFunctionToolCall`, `ResponseReasoningItem` or
//! `ResponseOutputMessage`; an item that still does not parse is left for pydantic to refuse.

use serde_json::{json, Map, Value};

use super::super::request::random_hex;
use super::super::{schema, ApiError};
use crate::sim::changes::{since, Change};

type Body = Map<String, Value>;

/// The before-validator (never refuses: what it cannot parse it leaves as it was).
pub(crate) fn input_item_parsing(body: &mut Body) -> Result<(), ApiError> {
    let Some(Value::Array(items)) = body.get_mut("input") else {
        return Ok(());
    };
    for item in items.iter_mut() {
        if let Some(parsed) = parsed(item) {
            *item = parsed;
        }
    }
    Ok(())
}

/// `item` as the model its type names, when it parses as one.
fn parsed(item: &Value) -> Option<Value> {
    let Value::Object(original) = item else { return None };
    let filled = if since(Change::OpenResponsesInputItems) {
        open_responses(original)
    } else {
        legacy(original)
    };
    let model = match filled.get("type").and_then(Value::as_str) {
        Some("function_call") => "ResponseFunctionToolCall",
        Some("reasoning") => "ResponseReasoningItem",
        Some("message") if filled.get("role") == Some(&json!("assistant")) => {
            if !filled.get("content").is_some_and(Value::is_array) {
                return None;
            }
            "ResponseOutputMessage"
        }
        _ => return Some(Value::Object(filled)),
    };
    let filled = Value::Object(filled);
    schema::conforms(model, &filled).then_some(filled)
}

/// 0.33: a reasoning item gets an id; an assistant message with a content list gets an id, a
/// status and empty annotations on its output_text parts.
fn legacy(item: &Body) -> Body {
    let mut out = item.clone();
    match item.get("type").and_then(Value::as_str) {
        Some("reasoning") if !item.contains_key("id") => {
            out.insert("id".into(), json!(format!("rs_{}", random_hex(32))));
        }
        Some("message")
            if item.get("role") == Some(&json!("assistant")) && item.get("content").is_some_and(Value::is_array) =>
        {
            out.entry("id")
                .or_insert_with(|| json!(format!("msg_{}", random_hex(32))));
            out.entry("status").or_insert_with(|| json!("completed"));
            annotate(&mut out);
        }
        _ => {}
    }
    out
}

/// 0.34 (`_normalize_openresponses_input_item`): `type` defaults to `message`; a reasoning
/// item or an assistant message gets its type stamped, an id and a status where they are
/// missing or empty, a reasoning item an empty summary, a message's output_text parts empty
/// annotations.
fn open_responses(item: &Body) -> Body {
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message").to_owned();
    let assistant = item.get("role") == Some(&json!("assistant"));
    if !(kind == "reasoning" || (kind == "message" && assistant)) {
        return item.clone();
    }
    let empty = |v: Option<&Value>| matches!(v, None | Some(Value::Null)) || v == Some(&json!(""));
    let mut out = item.clone();
    out.insert("type".into(), json!(kind));
    if empty(out.get("id")) {
        let prefix = if kind == "reasoning" { "rs" } else { "msg" };
        out.insert("id".into(), json!(format!("{prefix}_{}", random_hex(32))));
    }
    if empty(out.get("status")) {
        out.insert("status".into(), json!("completed"));
    }
    if kind == "reasoning" && out.get("summary").is_none_or(Value::is_null) {
        out.insert("summary".into(), json!([]));
    }
    if kind == "message" {
        annotate(&mut out);
    }
    out
}

/// `annotations: []` on each output_text part that has none.
fn annotate(message: &mut Body) {
    for part in message
        .get_mut("content")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Value::Object(p) = part {
            if p.get("type") == Some(&json!("output_text")) && !p.contains_key("annotations") {
                p.insert("annotations".into(), json!([]));
            }
        }
    }
}
