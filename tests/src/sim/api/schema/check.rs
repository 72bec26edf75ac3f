//! Pydantic's lax-mode validation of a JSON body against a [`Ty`] tree (pydantic-core 2.50's
//! rules, checked against the venv's pydantic): coercions (`"2"` and `2.0` are integers, `"yes"`
//! a boolean), bounds and lengths, literals and enums, smart and discriminated unions, models
//! with their required fields and the errors in declaration order; the location rendered as
//! vLLM's `clean_loc_for_param` renders it (serve/exception_handling/handlers/validation.py).

use serde_json::{Map, Value};

use super::super::pydantic::{py_str, repr_str, PyErr};
use super::schema;
use super::{Bounds, Component, FieldValidator, ModelTy, Ty, FIELD_VALIDATORS, MODEL_VALIDATORS};
use crate::sim::api::{pydantic, ApiError};

/// Whether `v` validates as the component `name` (a model a before-validator builds from a
/// dict, which pydantic then takes as it is).
pub(crate) fn conforms(name: &str, v: &Value) -> bool {
    let mut errors = Vec::new();
    let out = check(
        &Ty::Ref(name.to_owned()),
        v,
        &mut vec!["body".to_owned()],
        &mut errors,
        Mode::Lax,
    );
    out.is_some() && errors.is_empty()
}

/// Validates `body` as `POST path`'s request model, replacing it with the coerced values.
pub(crate) fn check_body(path: &str, body: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Some(ty) = schema().body(path) else {
        return Ok(());
    };
    let mut errors = Vec::new();
    let mut loc = vec!["body".to_owned()];
    let value = Value::Object(std::mem::take(body));
    let out = check(ty, &value, &mut loc, &mut errors, Mode::Lax);
    *body = match (out, value) {
        (Some(Value::Object(m)), _) | (None, Value::Object(m)) => m,
        _ => Map::new(),
    };
    if errors.is_empty() {
        Ok(())
    } else {
        Err(pydantic::to_error(&errors))
    }
}

/// A smart union tries every member strictly before it tries them laxly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Lax,
}

/// pydantic-core's internal location segments vLLM drops (`_INTERNAL_LOC_MARKERS`), beside any
/// segment with a bracket.
const INTERNAL: &[&str] = &[
    "function-wrap",
    "function-after",
    "function-before",
    "function-plain",
    "json-or-python",
    "lax-or-strict",
    "chain",
    "default",
    "nullable",
    "tagged-union",
    "union",
    "call",
    "arguments",
    "is-instance",
    "is-subclass",
    "callable",
    "str",
    "int",
    "float",
    "bool",
    "bytes",
    "bytearray",
    "list",
    "tuple",
    "dict",
    "set",
    "frozenset",
    "complex",
    "none",
    "nonetype",
];

/// vLLM's `clean_loc_for_param`.
fn clean(loc: &[String]) -> String {
    let kept: Vec<&str> = loc
        .iter()
        .map(String::as_str)
        .filter(|s| !s.contains(['[', ']', '{', '}', '(', ')']) && !INTERNAL.contains(&s.to_ascii_lowercase().as_str()))
        .collect();
    if kept.is_empty() {
        loc.join(".")
    } else {
        kept.join(".")
    }
}

fn push(errors: &mut Vec<PyErr>, loc: &[String], kind: &'static str, msg: String, input: &Value, ctx: Option<String>) {
    let mut e = PyErr::new(kind, &clean(loc), &msg, input);
    e.ctx = ctx;
    errors.push(e);
}

/// Validates `v` as `ty`; the coerced value, or `None` with the errors pushed.
fn check(ty: &Ty, v: &Value, loc: &mut Vec<String>, errors: &mut Vec<PyErr>, mode: Mode) -> Option<Value> {
    match ty {
        Ty::Any => Some(v.clone()),
        Ty::Nullable(_) if v.is_null() => Some(Value::Null),
        Ty::Nullable(inner) => check(inner, v, loc, errors, mode),
        Ty::Ref(name) => match schema().component(name) {
            Some(Component::Model(m)) => model(m, v, loc, errors, mode),
            Some(Component::Alias(t)) => check(t, v, loc, errors, mode),
            None => Some(v.clone()),
        },
        Ty::Union(members) => union(members, v, loc, errors),
        Ty::Tagged { key, members } => tagged(key, members, v, loc, errors, mode),
        Ty::List { item, min, max } => list(item, *min, *max, v, loc, errors, mode),
        Ty::Dict(value) => dict(value, v, loc, errors, mode),
        _ => match scalar(ty, v, mode) {
            Ok(out) => Some(out),
            Err((kind, msg, ctx)) => {
                push(errors, loc, kind, msg, v, ctx);
                None
            }
        },
    }
}

/// A smart union: the first member that takes the value strictly, else laxly; else every
/// member's errors, each under the member's tag.
fn union(members: &[Ty], v: &Value, loc: &mut Vec<String>, errors: &mut Vec<PyErr>) -> Option<Value> {
    for mode in [Mode::Strict, Mode::Lax] {
        for m in members {
            let mut scratch = Vec::new();
            if let Some(out) = check(m, v, loc, &mut scratch, mode) {
                return Some(out);
            }
        }
    }
    for m in members {
        loc.push(tag(m));
        check(m, v, loc, errors, Mode::Lax);
        loc.pop();
    }
    None
}

/// The location segment a union member adds (a class's own tag; a bracketed type name, which
/// the rendering drops, for the rest).
fn tag(m: &Ty) -> String {
    match m {
        Ty::Ref(name) => match schema().component(name) {
            Some(Component::Model(model)) => model.facts.union_tag.clone(),
            _ => "[alias]".into(),
        },
        _ => "[type]".into(),
    }
}

fn tagged(
    key: &str,
    members: &[(String, Ty)],
    v: &Value,
    loc: &mut Vec<String>,
    errors: &mut Vec<PyErr>,
    mode: Mode,
) -> Option<Value> {
    let Value::Object(obj) = v else {
        push(
            errors,
            loc,
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from".into(),
            v,
            None,
        );
        return None;
    };
    let expected = members.iter().map(|(t, _)| repr_str(t)).collect::<Vec<_>>().join(", ");
    let Some(found) = obj.get(key) else {
        let ctx = format!("'discriminator': {}", repr_str(&repr_str(key)));
        let msg = format!("Unable to extract tag using discriminator {}", repr_str(key));
        push(errors, loc, "union_tag_not_found", msg, v, Some(ctx));
        return None;
    };
    let tag = py_str(found);
    match members.iter().find(|(t, _)| *t == tag) {
        Some((t, member)) => {
            loc.push(t.clone());
            let out = check(member, v, loc, errors, mode);
            loc.pop();
            out
        }
        None => {
            let msg = format!(
                "Input tag {} found using {} does not match any of the expected tags: {expected}",
                repr_str(&tag),
                repr_str(key)
            );
            let ctx = format!(
                "'discriminator': {}, 'tag': {}, 'expected_tags': {}",
                repr_str(&repr_str(key)),
                repr_str(&tag),
                repr_str(&expected)
            );
            push(errors, loc, "union_tag_invalid", msg, v, Some(ctx));
            None
        }
    }
}

fn field_validator(model: &str, field: &str) -> Option<FieldValidator> {
    FIELD_VALIDATORS
        .iter()
        .find(|(m, f, _)| *m == model && *f == field)
        .map(|(_, _, v)| *v)
}

fn model(m: &ModelTy, v: &Value, loc: &mut Vec<String>, errors: &mut Vec<PyErr>, mode: Mode) -> Option<Value> {
    let Value::Object(obj) = v else {
        let (kind, msg, ctx) = &m.facts.not_a_mapping;
        push(errors, loc, static_kind(kind), msg.clone(), v, ctx.clone());
        return None;
    };
    let validator = MODEL_VALIDATORS.iter().find(|(name, _)| *name == m.name);
    if let Some(msg) = validator.and_then(|(_, f)| f(obj)) {
        let ctx = format!("'error': ValueError({})", repr_str(&msg));
        push(errors, loc, "value_error", format!("Value error, {msg}"), v, Some(ctx));
        return None;
    }
    let before = errors.len();
    let mut out = obj.clone();
    for (name, ty, required) in &m.fields {
        loc.push(name.clone());
        match obj.get(name) {
            Some(value) => {
                if let Some(c) = check(ty, value, loc, errors, mode) {
                    match field_validator(&m.name, name).and_then(|f| f(&c)) {
                        Some(msg) => {
                            let ctx = format!("'error': ValueError({})", repr_str(msg));
                            push(
                                errors,
                                loc,
                                "value_error",
                                format!("Value error, {msg}"),
                                value,
                                Some(ctx),
                            );
                        }
                        None => {
                            out.insert(name.clone(), c);
                        }
                    }
                }
            }
            None if *required => push(errors, loc, "missing", "Field required".into(), v, None),
            None => {}
        }
        loc.pop();
    }
    if m.facts.forbids_extra {
        for (k, value) in obj {
            if !m.fields.iter().any(|f| f.0 == *k) {
                loc.push(k.clone());
                push(
                    errors,
                    loc,
                    "extra_forbidden",
                    "Extra inputs are not permitted".into(),
                    value,
                    None,
                );
                loc.pop();
            }
        }
    }
    (errors.len() == before).then_some(Value::Object(out))
}

/// The captured not-a-mapping error types, as the `'static` names errors carry.
fn static_kind(kind: &str) -> &'static str {
    ["dict_type", "model_attributes_type", "dataclass_type", "model_type"]
        .into_iter()
        .find(|k| *k == kind)
        .unwrap_or("model_type")
}

fn list(
    item: &Ty,
    min: Option<u64>,
    max: Option<u64>,
    v: &Value,
    loc: &mut Vec<String>,
    errors: &mut Vec<PyErr>,
    mode: Mode,
) -> Option<Value> {
    let Value::Array(items) = v else {
        push(errors, loc, "list_type", "Input should be a valid list".into(), v, None);
        return None;
    };
    let len = items.len() as u64;
    let plural = |n: u64| if n == 1 { "item" } else { "items" };
    if let Some(max) = max.filter(|m| len > *m) {
        let msg = format!(
            "List should have at most {max} {} after validation, not {len}",
            plural(max)
        );
        let ctx = format!("'field_type': 'List', 'max_length': {max}, 'actual_length': {len}");
        push(errors, loc, "too_long", msg, v, Some(ctx));
        return None;
    }
    let before = errors.len();
    let mut out = Vec::with_capacity(items.len());
    for (i, x) in items.iter().enumerate() {
        loc.push(i.to_string());
        out.extend(check(item, x, loc, errors, mode));
        loc.pop();
    }
    if let Some(min) = min.filter(|m| len < *m) {
        let msg = format!(
            "List should have at least {min} {} after validation, not {len}",
            plural(min)
        );
        let ctx = format!("'field_type': 'List', 'min_length': {min}, 'actual_length': {len}");
        push(errors, loc, "too_short", msg, v, Some(ctx));
    }
    (errors.len() == before).then_some(Value::Array(out))
}

fn dict(value: &Ty, v: &Value, loc: &mut Vec<String>, errors: &mut Vec<PyErr>, mode: Mode) -> Option<Value> {
    let Value::Object(obj) = v else {
        push(
            errors,
            loc,
            "dict_type",
            "Input should be a valid dictionary".into(),
            v,
            None,
        );
        return None;
    };
    let before = errors.len();
    let mut out = Map::new();
    for (k, x) in obj {
        loc.push(k.clone());
        if let Some(c) = check(value, x, loc, errors, mode) {
            out.insert(k.clone(), c);
        }
        loc.pop();
    }
    (errors.len() == before).then_some(Value::Object(out))
}

type Refusal = (&'static str, String, Option<String>);

fn refuse(kind: &'static str, msg: &str) -> Result<Value, Refusal> {
    Err((kind, msg.to_owned(), None))
}

/// A scalar type's validation (and its bounds).
fn scalar(ty: &Ty, v: &Value, mode: Mode) -> Result<Value, Refusal> {
    match ty {
        Ty::Int(b) => int(v, mode).and_then(|out| bounded(out, b, true)),
        Ty::Float(b) => float(v, mode).and_then(|out| bounded(out, b, false)),
        Ty::Bool => boolean(v, mode),
        Ty::Str { min, max } => string(v, *min, *max),
        Ty::Bytes => match v {
            Value::String(_) => Ok(v.clone()),
            _ => refuse("bytes_type", "Input should be a valid bytes"),
        },
        Ty::Lit(options) | Ty::Enum(options) => literal(ty, options, v),
        _ => Ok(v.clone()),
    }
}

const INT_TOO_BIG: &str = "Unable to parse input string as an integer, exceeded maximum size";
const INT_PARSING: &str = "Input should be a valid integer, unable to parse string as an integer";

fn int(v: &Value, mode: Mode) -> Result<Value, Refusal> {
    match v {
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(v.clone()),
        Value::Number(_) if mode == Mode::Strict => refuse("int_type", "Input should be a valid integer"),
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() != 0.0 {
                refuse(
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part",
                )
            } else if f.abs() >= 9.223_372_036_854_776e18 {
                refuse("int_parsing_size", INT_TOO_BIG)
            } else {
                Ok(Value::from(f as i64))
            }
        }
        Value::Bool(b) if mode == Mode::Lax => Ok(Value::from(i64::from(*b))),
        Value::String(s) if mode == Mode::Lax => int_from_str(s),
        _ => refuse("int_type", "Input should be a valid integer"),
    }
}

/// Python's `int(str)` as pydantic-core reads it: whitespace and `_` between digits allowed,
/// a `.0…` fraction dropped.
fn int_from_str(s: &str) -> Result<Value, Refusal> {
    let t = s.trim();
    let t = match t.split_once('.') {
        Some((whole, frac)) if !whole.is_empty() && !frac.is_empty() && frac.bytes().all(|b| b == b'0') => whole,
        _ => t,
    };
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    let well_formed = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    if !well_formed {
        return refuse("int_parsing", INT_PARSING);
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    match clean.parse::<i64>() {
        Ok(i) => Ok(Value::from(i)),
        Err(_) => match clean.parse::<u64>() {
            Ok(u) => Ok(Value::from(u)),
            Err(_) => refuse("int_parsing_size", INT_TOO_BIG),
        },
    }
}

fn float(v: &Value, mode: Mode) -> Result<Value, Refusal> {
    match v {
        Value::Number(_) => Ok(v.clone()),
        Value::Bool(b) if mode == Mode::Lax => Ok(Value::from(f64::from(u8::from(*b)))),
        Value::String(s) if mode == Mode::Lax => {
            let t: String = s.trim().chars().filter(|c| *c != '_').collect();
            let lower = t.to_ascii_lowercase();
            let special = [
                "nan",
                "+nan",
                "-nan",
                "inf",
                "+inf",
                "-inf",
                "infinity",
                "+infinity",
                "-infinity",
            ];
            if special.contains(&lower.as_str()) {
                // JSON has no NaN: the value only has to pass; keep the string.
                return Ok(v.clone());
            }
            match t.parse::<f64>() {
                Ok(f) if !t.is_empty() => Ok(Value::from(f)),
                _ => refuse(
                    "float_parsing",
                    "Input should be a valid number, unable to parse string as a number",
                ),
            }
        }
        _ => refuse("float_type", "Input should be a valid number"),
    }
}

const TRUE: &[&str] = &["1", "on", "t", "true", "y", "yes"];
const FALSE: &[&str] = &["0", "off", "f", "false", "n", "no"];
const BOOL_PARSING: &str = "Input should be a valid boolean, unable to interpret input";

fn boolean(v: &Value, mode: Mode) -> Result<Value, Refusal> {
    match v {
        Value::Bool(_) => Ok(v.clone()),
        _ if mode == Mode::Strict => refuse("bool_type", "Input should be a valid boolean"),
        Value::Number(n) if n.is_i64() || n.is_u64() => match n.as_i64() {
            Some(0) => Ok(Value::Bool(false)),
            Some(1) => Ok(Value::Bool(true)),
            _ => refuse("bool_parsing", BOOL_PARSING),
        },
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(Value::Bool(false)),
            Some(1.0) => Ok(Value::Bool(true)),
            _ => refuse("bool_type", "Input should be a valid boolean"),
        },
        Value::String(s) => {
            let l = s.trim().to_ascii_lowercase();
            if TRUE.contains(&l.as_str()) {
                Ok(Value::Bool(true))
            } else if FALSE.contains(&l.as_str()) {
                Ok(Value::Bool(false))
            } else {
                refuse("bool_parsing", BOOL_PARSING)
            }
        }
        _ => refuse("bool_type", "Input should be a valid boolean"),
    }
}

fn string(v: &Value, min: Option<u64>, max: Option<u64>) -> Result<Value, Refusal> {
    let Value::String(s) = v else {
        return refuse("string_type", "Input should be a valid string");
    };
    let len = s.chars().count() as u64;
    let unit = |n: u64| if n == 1 { "character" } else { "characters" };
    if let Some(min) = min.filter(|m| len < *m) {
        let msg = format!("String should have at least {min} {}", unit(min));
        return Err(("string_too_short", msg, Some(format!("'min_length': {min}"))));
    }
    if let Some(max) = max.filter(|m| len > *m) {
        let msg = format!("String should have at most {max} {}", unit(max));
        return Err(("string_too_long", msg, Some(format!("'max_length': {max}"))));
    }
    Ok(v.clone())
}

/// A literal's rendering in pydantic's messages (`'a'`, `3`, `None`).
fn literal_repr(v: &Value) -> String {
    match v {
        Value::String(s) => repr_str(s),
        other => py_str(other),
    }
}

fn literal(ty: &Ty, options: &[Value], v: &Value) -> Result<Value, Refusal> {
    if options.contains(v) {
        return Ok(v.clone());
    }
    let reprs: Vec<String> = options.iter().map(literal_repr).collect();
    let expected = match reprs.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => reprs.join(""),
    };
    let kind = if matches!(ty, Ty::Enum(_)) {
        "enum"
    } else {
        "literal_error"
    };
    Err((
        kind,
        format!("Input should be {expected}"),
        Some(format!("'expected': {}", repr_str(&expected))),
    ))
}

/// A bound's rendering: in the message as pydantic-core's Rust `Display` writes it, in the
/// context as Python's `repr` (an integer field's bounds are integers).
fn bound_text(b: f64, integer: bool) -> (String, String) {
    if integer || b.fract() == 0.0 && b.abs() < 1e16 {
        let whole = if b >= 9.2e18 {
            i64::MAX.to_string()
        } else if b <= -9.2e18 {
            i64::MIN.to_string()
        } else {
            format!("{}", b as i64)
        };
        let ctx = if integer { whole.clone() } else { format!("{whole}.0") };
        (whole, ctx)
    } else {
        (format!("{b}"), format!("{b}"))
    }
}

fn bounded(out: Value, b: &Bounds, integer: bool) -> Result<Value, Refusal> {
    // A float field keeps "nan" and "inf" as the strings they came as.
    let special = out
        .as_str()
        .map(|s| s.trim().to_ascii_lowercase().replace("infinity", "inf").parse::<f64>());
    let Some(x) = out.as_f64().or(special.and_then(Result::ok)) else {
        return Ok(out);
    };
    // (bound, ctx key, error type, message words, whether the value passes)
    type Check<'a> = (Option<f64>, &'a str, &'static str, &'a str, fn(f64, f64) -> bool);
    // pydantic-core's order (a NaN fails the first bound it meets).
    let checks: [Check; 4] = [
        (b.le, "le", "less_than_equal", "less than or equal to", |x, b| x <= b),
        (b.lt, "lt", "less_than", "less than", |x, b| x < b),
        (b.ge, "ge", "greater_than_equal", "greater than or equal to", |x, b| {
            x >= b
        }),
        (b.gt, "gt", "greater_than", "greater than", |x, b| x > b),
    ];
    for (bound, key, kind, words, ok) in checks {
        if let Some(bound) = bound {
            if !ok(x, bound) {
                let (shown, ctx) = bound_text(bound, integer);
                return Err((
                    kind,
                    format!("Input should be {words} {shown}"),
                    Some(format!("'{key}': {ctx}")),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
