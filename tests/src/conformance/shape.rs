//! The structure of an HTTP answer, as the conformance suite compares it: status, the headers
//! clients read, and the body reduced to its shape — JSON key sets and value types, the values
//! clients branch on (object, type, role, finish reason, param, code, …), error-message families,
//! SSE event sequences (runs of identical events collapsed: token counts are the engine's), and
//! metric family names with their types.

use serde_json::{json, Map, Value};

use crate::http::HttpResponse;

/// Keys whose values clients branch on: compared literally, not just by type.
const LITERAL_KEYS: &[&str] = &[
    "object",
    "type",
    "role",
    "finish_reason",
    "stop_reason",
    "param",
    "code",
    "status",
    "event",
    "model",
    "stop_sequence",
];

/// An error message's family: its text with every digit run replaced by `#` (token counts and
/// offsets are the tokenizer's).
pub fn message_family(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut in_digits = false;
    for c in message.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

/// The shape of a JSON value; `key` is the key it sits under.
pub fn shape(v: &Value, key: Option<&str>) -> Value {
    let literal = key.is_some_and(|k| LITERAL_KEYS.contains(&k));
    match v {
        Value::Null => json!("null"),
        Value::Bool(b) if literal => json!(b),
        Value::Bool(_) => json!("bool"),
        Value::Number(n) if literal => Value::Number(n.clone()),
        Value::Number(n) if n.is_f64() => json!("float"),
        Value::Number(_) => json!("int"),
        Value::String(s) if literal => json!(s),
        Value::String(s) if key == Some("message") => json!(format!("message: {}", message_family(s))),
        Value::String(_) => json!("str"),
        Value::Array(items) => {
            let mut shapes: Vec<Value> = Vec::new();
            for item in items {
                let s = match item {
                    // Completions' top logprobs are maps keyed by token text.
                    Value::Object(m) if key == Some("top_logprobs") && m.values().all(Value::is_number) => {
                        json!({"<token>": "float"})
                    }
                    _ => shape(item, None),
                };
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
            Value::Array(shapes)
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), shape(&m[k], Some(k)));
            }
            Value::Object(out)
        }
    }
}

/// Server-sent events as `{event, data}` shapes (an unnamed event's name is `null`), read by
/// eventsource-stream, consecutive repeats collapsed into one; an event cut before its blank
/// line still shows, followed by a note that the stream was cut.
pub fn sse_shape(body: &str) -> Value {
    let (read, cut) = crate::sse::events_and_cut(body.as_bytes());
    let mut events: Vec<Value> = Vec::new();
    for e in read.iter().chain(&cut) {
        let name = if e.event == crate::sse::UNNAMED {
            Value::Null
        } else {
            json!(e.event)
        };
        let data = match serde_json::from_str::<Value>(&e.data) {
            Ok(v) => shape(&v, None),
            Err(_) => json!(e.data),
        };
        let event = json!({"event": name, "data": data});
        if events.last() != Some(&event) {
            events.push(event);
        }
    }
    if !body.is_empty() && !body.ends_with("\n\n") {
        events.push(json!("<stream does not end with a blank line>"));
    }
    Value::Array(events)
}

/// Prometheus exposition: the `# TYPE` lines, sorted (family name and type).
pub fn metrics_shape(body: &str) -> Value {
    let mut families: Vec<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(str::to_owned)
        .collect();
    families.sort();
    json!(families)
}

/// Everything the suite compares about one answer.
pub fn response_shape(r: &HttpResponse) -> Value {
    let content_type = r.header("content-type").map(|c| c.to_ascii_lowercase());
    let text = String::from_utf8_lossy(&r.body);
    let body = match content_type.as_deref() {
        Some(c) if c.starts_with("text/event-stream") => sse_shape(&text),
        Some(c) if c.starts_with("text/plain") && text.contains("# TYPE ") => metrics_shape(&text),
        _ if r.body.is_empty() => json!("<empty>"),
        _ => match serde_json::from_slice::<Value>(&r.body) {
            Ok(v) => shape(&v, None),
            Err(_) => json!(format!("<text: {}>", message_family(&text))),
        },
    };
    json!({
        "status": r.status,
        "content-type": content_type,
        "x-request-id": r.header("x-request-id").is_some(),
        "body": body,
    })
}

/// Where two shapes differ, one line per difference (`path: real … / sim …`).
pub fn diff(real: &Value, sim: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_at("", real, sim, &mut out);
    out
}

fn diff_at(path: &str, real: &Value, sim: &Value, out: &mut Vec<String>) {
    match (real, sim) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => diff_at(&format!("{path}.{k}"), va, vb, out),
                    None => out.push(format!("{path}.{k}: only in real ({va})")),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(format!("{path}.{k}: only in sim ({vb})"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff_at(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if real != sim => out.push(format!("{path}: real {real} / sim {sim}")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_reduce_to_types_except_the_ones_clients_branch_on() {
        let v = json!({"id": "x", "object": "chat.completion", "created": 1, "temperature": 0.5,
            "choices": [{"finish_reason": "stop", "logprobs": null}, {"finish_reason": "stop", "logprobs": null}]});
        assert_eq!(
            shape(&v, None),
            json!({"choices": [{"finish_reason": "stop", "logprobs": "null"}], "created": "int",
                "id": "str", "object": "chat.completion", "temperature": "float"})
        );
    }

    #[test]
    fn messages_compare_by_family() {
        let a = shape(&json!({"message": "at least 4097 input tokens"}), None);
        let b = shape(&json!({"message": "at least 12 input tokens"}), None);
        let c = shape(&json!({"message": "at most 12 input tokens"}), None);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn sse_runs_collapse_and_a_cut_stream_shows() {
        let body = "data: {\"a\":\"x\"}\n\ndata: {\"a\":\"y\"}\n\ndata: [DONE]\n\n";
        assert_eq!(
            sse_shape(body),
            json!([{"event": null, "data": {"a": "str"}}, {"event": null, "data": "[DONE]"}])
        );
        let cut = "event: message_start\ndata: {}\n\ndata: {\"a\":1}";
        assert_eq!(sse_shape(cut).as_array().unwrap().len(), 3);
    }

    #[test]
    fn diff_names_the_path() {
        let d = diff(&json!({"a": {"b": "int", "c": "str"}}), &json!({"a": {"b": "str"}}));
        assert_eq!(
            d,
            vec![".a.b: real \"int\" / sim \"str\"", ".a.c: only in real (\"str\")"]
        );
    }
}
