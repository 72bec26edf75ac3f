//! FastAPI/pydantic request validation the way vLLM 0.33 renders it: lax coercion of field
//! types (`"yes"` is a boolean, `"5"` an integer), every field error collected in the model's
//! field order, and the message `N validation error(s):\n  {'type': …, 'loc': 'body.x', 'msg': …,
//! 'input': …}` with Python's `repr` and vLLM's size-bounded input summary; `param` is the
//! first error's location.

use serde_json::{Map, Value};

use super::{validation_error_raw, ApiError};

/// A field's declared type (the part the simulator checks).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Int,
    Float,
    Bool,
    Str,
    Dict,
    List,
    Lit(&'static [&'static str]),
    /// Anything (a union the simulator does not check).
    Any,
}

/// One field of a request model: name, type, whether `null` is allowed.
pub(crate) type Field = (&'static str, Kind, bool);

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

/// Python's `str` of a JSON scalar (`True`, `None`, `-1.0`).
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
        other => other.to_string(),
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

const TRUE: &[&str] = &["1", "on", "t", "true", "y", "yes"];
const FALSE: &[&str] = &["0", "off", "f", "false", "n", "no"];

/// `"'a', 'b' or 'c'"`, pydantic's way of listing literals.
fn expected(options: &[&str]) -> String {
    let quoted: Vec<String> = options.iter().map(|o| format!("'{o}'")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    }
}

/// Validates `v` as `kind` in lax mode; the coerced value, or the error's (type, msg, ctx).
fn coerce(kind: Kind, v: &Value) -> Result<Value, (&'static str, String, Option<String>)> {
    let err = |t: &'static str, m: &str| Err((t, m.to_owned(), None));
    match (kind, v) {
        (Kind::Int, Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(v.clone()),
        (Kind::Int, Value::Number(n)) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 => Ok(Value::from(f as i64)),
            _ => err(
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part",
            ),
        },
        (Kind::Int, Value::Bool(b)) => Ok(Value::from(i64::from(*b))),
        (Kind::Int, Value::String(s)) => s.trim().parse::<i64>().map(Value::from).or_else(|_| {
            err(
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
        }),
        (Kind::Int, _) => err("int_type", "Input should be a valid integer"),
        (Kind::Float, Value::Number(_)) => Ok(v.clone()),
        (Kind::Float, Value::Bool(b)) => Ok(Value::from(f64::from(u8::from(*b)))),
        (Kind::Float, Value::String(s)) => match s.trim().parse::<f64>() {
            Ok(f) => Ok(Value::from(f)),
            Err(_) => err(
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
            ),
        },
        (Kind::Float, _) => err("float_type", "Input should be a valid number"),
        (Kind::Bool, Value::Bool(_)) => Ok(v.clone()),
        (Kind::Bool, Value::Number(n)) => match n.as_f64() {
            Some(f) if f == 0.0 || f == 1.0 => Ok(Value::Bool(f == 1.0)),
            _ => err(
                "bool_parsing",
                "Input should be a valid boolean, unable to interpret input",
            ),
        },
        (Kind::Bool, Value::String(s)) => {
            let l = s.to_ascii_lowercase();
            if TRUE.contains(&l.as_str()) {
                Ok(Value::Bool(true))
            } else if FALSE.contains(&l.as_str()) {
                Ok(Value::Bool(false))
            } else {
                err(
                    "bool_parsing",
                    "Input should be a valid boolean, unable to interpret input",
                )
            }
        }
        (Kind::Bool, _) => err("bool_type", "Input should be a valid boolean"),
        (Kind::Str, Value::String(_)) => Ok(v.clone()),
        (Kind::Str, _) => err("string_type", "Input should be a valid string"),
        (Kind::Dict, Value::Object(_)) => Ok(v.clone()),
        (Kind::Dict, _) => err("dict_type", "Input should be a valid dictionary"),
        (Kind::List, Value::Array(_)) => Ok(v.clone()),
        (Kind::List, _) => err("list_type", "Input should be a valid list"),
        (Kind::Any, _) => Ok(v.clone()),
        (Kind::Lit(options), Value::String(s)) if options.contains(&s.as_str()) => Ok(v.clone()),
        (Kind::Lit(options), _) => {
            let e = expected(options);
            Err((
                "literal_error",
                format!("Input should be {e}"),
                Some(format!("'expected': {}", repr_str(&e))),
            ))
        }
    }
}

/// Checks (and coerces in place) every listed field of `req`; the errors in field order.
pub(crate) fn check_fields(req: &mut Map<String, Value>, fields: &[Field]) -> Vec<PyErr> {
    let mut errors = Vec::new();
    for &(name, kind, nullable) in fields {
        let Some(v) = req.get(name) else { continue };
        if v.is_null() && nullable {
            continue;
        }
        match coerce(kind, v) {
            Ok(c) => {
                req.insert(name.to_owned(), c);
            }
            Err((t, msg, ctx)) => errors.push(PyErr {
                kind: t,
                loc: format!("body.{name}"),
                msg,
                input: v.clone(),
                ctx,
            }),
        }
    }
    errors
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
        assert_eq!(expected(&["none", "low", "max"]), "'none', 'low' or 'max'");
    }

    #[test]
    fn lax_coercion_and_errors() {
        let mut req = json!({"stream": "yes", "n": "2", "temperature": "hot", "max_tokens": 1.5})
            .as_object()
            .unwrap()
            .clone();
        let fields: &[Field] = &[
            ("max_tokens", Kind::Int, true),
            ("n", Kind::Int, true),
            ("stream", Kind::Bool, true),
            ("temperature", Kind::Float, true),
        ];
        let errors = check_fields(&mut req, fields);
        assert_eq!(req["stream"], json!(true));
        assert_eq!(req["n"], json!(2));
        let kinds: Vec<&str> = errors.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["int_from_float", "float_parsing"]);
        assert_eq!(
            errors[1].render(),
            "{'type': 'float_parsing', 'loc': 'body.temperature', 'msg': 'Input should be a valid number, unable to parse string as a number', 'input': 'hot'}"
        );
    }
}
