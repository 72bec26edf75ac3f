//! Structured outputs: what the simulated model writes when the request constrains it, as
//! vLLM's grammar backends would force — a JSON value valid under the schema
//! (`response_format` json_schema, `structured_outputs.json`, Responses `text.format`,
//! Anthropic `output_config.format`), a JSON object (`json_object`), the first `choice`, or a
//! string matching `regex`.

use serde_json::{json, Map, Value};

/// A structured-output request, as the routes hand it over.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Constraint {
    Schema(Value),
    Object,
    Choice(Vec<String>),
    Regex(String),
}

impl Constraint {
    /// The constraint of a chat/completions body (`structured_outputs` wins over
    /// `response_format`, as in vLLM).
    pub(crate) fn of_request(req: &Map<String, Value>) -> Option<Constraint> {
        if let Some(so) = req.get("structured_outputs").and_then(Value::as_object) {
            if let Some(schema) = so.get("json").filter(|v| !v.is_null()) {
                let schema = match schema {
                    Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
                    other => other.clone(),
                };
                return Some(Constraint::Schema(schema));
            }
            if let Some(choices) = so.get("choice").and_then(Value::as_array) {
                return Some(Constraint::Choice(
                    choices.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
                ));
            }
            if let Some(r) = so.get("regex").and_then(Value::as_str) {
                return Some(Constraint::Regex(r.to_owned()));
            }
            if so.get("json_object").and_then(Value::as_bool) == Some(true) {
                return Some(Constraint::Object);
            }
        }
        let rf = req.get("response_format")?;
        match rf.get("type").and_then(Value::as_str)? {
            "json_schema" => Some(Constraint::Schema(
                rf.pointer("/json_schema/schema").cloned().unwrap_or(json!({})),
            )),
            "json_object" => Some(Constraint::Object),
            _ => None,
        }
    }

    /// The text the model writes.
    pub(crate) fn output(&self) -> String {
        match self {
            Constraint::Schema(s) => instance(s, s, 0).to_string(),
            Constraint::Object => json!({"answer": "yes"}).to_string(),
            Constraint::Choice(c) => c.first().cloned().unwrap_or_default(),
            Constraint::Regex(r) => regex_instance(r),
        }
    }
}

fn resolve<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        Some(pointer) => root.pointer(pointer).map_or(schema, |s| resolve(s, root)),
        None => schema,
    }
}

/// A small value valid under `schema` (types, properties, items, enums, consts, unions, refs,
/// numeric minimums and string lengths).
pub(crate) fn instance(schema: &Value, root: &Value, depth: usize) -> Value {
    let schema = resolve(schema, root);
    if depth > 12 {
        return Value::Null;
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let pick = options
                .iter()
                .find(|o| resolve(o, root).get("type") != Some(&json!("null")))
                .or(options.first());
            if let Some(o) = pick {
                return instance(o, root, depth + 1);
            }
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "string",
    };
    match kind {
        "object" => {
            let props = schema.get("properties").and_then(Value::as_object);
            let mut out = Map::new();
            for (k, v) in props.into_iter().flatten() {
                out.insert(k.clone(), instance(v, root, depth + 1));
            }
            Value::Object(out)
        }
        "array" => {
            let item = instance(
                schema.get("items").unwrap_or(&json!({"type": "string"})),
                root,
                depth + 1,
            );
            let n = schema.get("minItems").and_then(Value::as_u64).unwrap_or(1).max(1);
            Value::Array(vec![item; n as usize])
        }
        "integer" => json!(schema.get("minimum").and_then(Value::as_i64).unwrap_or(0)),
        "number" => json!(schema.get("minimum").and_then(Value::as_f64).unwrap_or(0.0)),
        "boolean" => json!(true),
        "null" => Value::Null,
        _ => {
            if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                return json!(regex_instance(p));
            }
            let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema
                .get("maxLength")
                .and_then(Value::as_u64)
                .map_or(usize::MAX, |m| m as usize);
            let mut s = "Paris".repeat(min / 5 + 1);
            s.truncate(min.max(5).min(max));
            json!(s)
        }
    }
}

/// A short string matching `pattern` (literals, escapes, classes, groups, alternation and the
/// quantifiers `? * + {n} {n,m}`; anchors are dropped).
pub(crate) fn regex_instance(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut pos = 0;
    sequence(&chars, &mut pos)
}

fn sequence(p: &[char], pos: &mut usize) -> String {
    let mut out = String::new();
    let mut branch_done = false;
    while *pos < p.len() {
        let c = p[*pos];
        if c == ')' {
            break;
        }
        if c == '|' {
            // Keep the first alternative; skip the rest of this group.
            branch_done = true;
            *pos += 1;
            let _ = sequence(p, pos);
            continue;
        }
        if branch_done {
            *pos += 1;
            continue;
        }
        let atom = atom(p, pos);
        let times = quantifier(p, pos);
        out.push_str(&atom.repeat(times));
    }
    out
}

fn atom(p: &[char], pos: &mut usize) -> String {
    let c = p[*pos];
    *pos += 1;
    match c {
        '^' | '$' => String::new(),
        '.' => "a".into(),
        '\\' => {
            let e = p.get(*pos).copied().unwrap_or('\\');
            *pos += 1;
            match e {
                'd' => "0".into(),
                'w' => "a".into(),
                's' => " ".into(),
                other => other.to_string(),
            }
        }
        '[' => {
            let negate = p.get(*pos) == Some(&'^');
            let first = p.get(*pos + usize::from(negate)).copied().unwrap_or('a');
            while *pos < p.len() && p[*pos] != ']' {
                *pos += if p[*pos] == '\\' { 2 } else { 1 };
            }
            *pos += 1;
            if negate {
                "a".into()
            } else if first == '\\' {
                "0".into()
            } else {
                first.to_string()
            }
        }
        '(' => {
            if p.get(*pos) == Some(&'?') {
                *pos += 2; // (?: …
            }
            let inner = sequence(p, pos);
            *pos += 1;
            inner
        }
        other => other.to_string(),
    }
}

fn quantifier(p: &[char], pos: &mut usize) -> usize {
    let n = match p.get(*pos) {
        Some('?') | Some('*') => 0,
        Some('+') => 1,
        Some('{') => {
            let end = p[*pos..].iter().position(|c| *c == '}').map_or(p.len(), |e| *pos + e);
            let body: String = p[*pos + 1..end].iter().collect();
            *pos = end;
            body.split(',').next().and_then(|n| n.trim().parse().ok()).unwrap_or(1)
        }
        _ => return 1,
    };
    *pos += 1;
    if p.get(*pos) == Some(&'?') {
        *pos += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_instances_have_every_property_with_its_type() {
        let s = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 3},
            "tags": {"type": "array", "items": {"type": "string"}}, "kind": {"enum": ["a", "b"]},
            "child": {"$ref": "#/$defs/c"}}, "$defs": {"c": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}});
        assert_eq!(
            instance(&s, &s, 0),
            json!({"name": "Paris", "age": 3, "tags": ["Paris"], "kind": "a", "child": {"ok": true}})
        );
    }

    #[test]
    fn regex_instances_match() {
        assert_eq!(regex_instance("[0-9]{3}-[a-z]+"), "000-a");
        assert_eq!(regex_instance("^(yes|no)$"), "yes");
        assert_eq!(regex_instance(r"\d+\.\d{2}"), "0.00");
    }
}
