//! FastAPI/pydantic request validation the way vLLM 0.33 renders it: lax coercion of field
//! types (`"yes"` is a boolean, `"5"` an integer), every field error collected in the model's
//! field order, and the message `N validation error(s):\n  {'type': …, 'loc': 'body.x', 'msg': …,
//! 'input': …}` with Python's `repr` and vLLM's size-bounded input summary; `param` is the
//! first error's location.

use serde_json::{Map, Value};

use super::{validation_error_raw, ApiError};

/// One pydantic error.
#[derive(Debug, Clone)]
pub(crate) struct PyErr {
    pub(crate) kind: &'static str,
    pub(crate) loc: String,
    pub(crate) msg: String,
    pub(crate) input: Value,
    /// The inside of the `ctx` dict, already in Python's rendering.
    pub(crate) ctx: Option<String>,
}

/// Python's `repr` of a string.
pub(crate) fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str` of a JSON value (`True`, `None`, `-1.0`, `[1, 'x']`).
pub(crate) fn py_str(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 && f.abs() < 1e16 {
                format!("{f:.1}")
            } else {
                format!("{f}")
            }
        }
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        // A container's `str` is its `repr`.
        other => py_repr(other),
    }
}

/// Python's `repr` of a JSON value (`{'a': [1, True, None]}`).
pub(crate) fn py_repr(v: &Value) -> String {
    match v {
        Value::String(s) => repr_str(s),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!("{}: {}", repr_str(k), py_repr(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => py_str(other),
    }
}

/// vLLM's `_summarize_error_input`, then `repr`.
fn summarise(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > 200 => {
            repr_str(&format!("{}...[truncated]", s.chars().take(200).collect::<String>()))
        }
        Value::String(s) => repr_str(s),
        Value::Array(a) => repr_str(&format!("<list of {} items>", a.len())),
        Value::Object(m) => repr_str(&format!("<dict of {} items>", m.len())),
        other => repr_str(&py_str(other)),
    }
}

impl PyErr {
    pub(crate) fn new(kind: &'static str, loc: &str, msg: &str, input: &Value) -> PyErr {
        PyErr {
            kind,
            loc: loc.to_owned(),
            msg: msg.to_owned(),
            input: input.clone(),
            ctx: None,
        }
    }

    fn render(&self) -> String {
        let mut s = format!(
            "{{'type': {}, 'loc': {}, 'msg': {}, 'input': {}",
            repr_str(self.kind),
            repr_str(&self.loc),
            repr_str(&self.msg),
            summarise(&self.input)
        );
        if let Some(ctx) = &self.ctx {
            s.push_str(&format!(", 'ctx': {{{ctx}}}"));
        }
        s.push('}');
        // vLLM's `_MAX_ERROR_CHARS`: one error's text is cut at 1 000 characters.
        if s.chars().count() > 1000 {
            s = s.chars().take(1000).collect::<String>() + "...[truncated]";
        }
        s
    }
}

/// The 400 `Bad Request` answer for a list of errors.
pub(crate) fn to_error(errors: &[PyErr]) -> ApiError {
    let label = if errors.len() == 1 { "error" } else { "errors" };
    let lines: String = errors.iter().take(10).map(|e| format!("\n  {}", e.render())).collect();
    let mut message = format!("{} validation {label}:{lines}", errors.len());
    if errors.len() > 10 {
        message.push_str(&format!("\n  ...and {} more {label}", errors.len() - 10));
    }
    validation_error_raw(&message, errors.first().map(|e| e.loc.as_str()))
}

/// A required field that is absent: pydantic's `missing` (the input is the whole body).
pub(crate) fn missing(field: &str, body: &Map<String, Value>) -> PyErr {
    PyErr::new(
        "missing",
        &format!("body.{field}"),
        "Field required",
        &Value::Object(body.clone()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reprs_follow_python() {
        assert_eq!(repr_str("hot"), "'hot'");
        assert_eq!(repr_str("Input should be 'a'"), "\"Input should be 'a'\"");
        assert_eq!(py_str(&json!(-1.0)), "-1.0");
        assert_eq!(py_str(&json!(true)), "True");
    }
}
