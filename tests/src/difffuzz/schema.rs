//! The request schemas of the real frontend, read from its own `/openapi.json`: for each POST
//! route the fuzzer drives, the top-level properties of its body model (after `$ref`, and the
//! first object of an `anyOf`/`oneOf` union), each with the JSON schema pydantic wrote for it.

use serde_json::{Map, Value};

/// One property of a request model.
#[derive(Debug, Clone)]
pub struct Prop {
    pub name: String,
    /// Its schema with `$ref`s resolved one level (enough for types, enums and bounds).
    pub schema: Value,
}

/// A route's body model.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub props: Vec<Prop>,
    pub required: Vec<String>,
}

/// The body model of `POST path` in `openapi`, or `None` when the route takes none.
pub fn model(openapi: &Value, path: &str) -> Option<Model> {
    let body = openapi
        .pointer(&format!("/paths/{}/post/requestBody/content", escape(path)))?
        .as_object()?
        .values()
        .next()?
        .get("schema")?;
    let object = object_schema(openapi, body)?;
    let props = object
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .map(|(name, schema)| Prop {
                    name: name.clone(),
                    schema: resolve(openapi, schema),
                })
                .collect()
        })
        .unwrap_or_default();
    let required = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    Some(Model { props, required })
}

/// A JSON pointer segment (`/` and `~` escaped).
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The object schema behind `schema`: itself, its `$ref`, or the first object of a union.
fn object_schema(openapi: &Value, schema: &Value) -> Option<Map<String, Value>> {
    let resolved = resolve(openapi, schema);
    if resolved.get("properties").is_some() {
        return resolved.as_object().cloned();
    }
    ["anyOf", "oneOf", "allOf"]
        .iter()
        .filter_map(|k| resolved.get(*k).and_then(Value::as_array))
        .flatten()
        .find_map(|s| object_schema(openapi, s))
}

/// `schema` with a top-level `$ref` replaced by its target, and each `anyOf` member's too.
pub fn resolve(openapi: &Value, schema: &Value) -> Value {
    let target = |s: &Value| {
        s.get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|p| openapi.pointer(p))
            .cloned()
    };
    let mut out = target(schema).unwrap_or_else(|| schema.clone());
    if let Some(members) = out.get_mut("anyOf").and_then(Value::as_array_mut) {
        for m in members.iter_mut() {
            if let Some(t) = target(m) {
                *m = t;
            }
        }
    }
    out
}

/// The JSON types a property schema admits (`null` included), from `type` or its union.
pub fn types(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match schema.get("type") {
        Some(Value::String(t)) => out.push(t.clone()),
        Some(Value::Array(ts)) => out.extend(ts.iter().filter_map(Value::as_str).map(str::to_owned)),
        _ => {}
    }
    for key in ["anyOf", "oneOf"] {
        for member in schema.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.extend(types(member));
        }
    }
    if schema.get("enum").is_some() || schema.get("const").is_some() {
        out.push("string".into());
    }
    out.sort();
    out.dedup();
    out
}

/// The literal values a property admits (`enum`, `const`, in the schema or its union).
pub fn literals(schema: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = schema
        .get("enum")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    out.extend(schema.get("const").cloned());
    for key in ["anyOf", "oneOf"] {
        for member in schema.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.extend(literals(member));
        }
    }
    out
}

/// The numeric bounds a property declares, in its schema or its union: (minimum, maximum),
/// exclusive bounds as the nearest inclusive ones are not knowable for floats, so as given.
pub fn bounds(schema: &Value) -> Vec<f64> {
    let mut out = Vec::new();
    for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        out.extend(schema.get(key).and_then(Value::as_f64));
    }
    for key in ["anyOf", "oneOf"] {
        for member in schema.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.extend(bounds(member));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn openapi() -> Value {
        json!({
            "paths": {"/v1/x": {"post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/X"}}}}}}},
            "components": {"schemas": {
                "X": {"type": "object", "required": ["a"], "properties": {
                    "a": {"type": "string"},
                    "b": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
                    "c": {"anyOf": [{"$ref": "#/components/schemas/E"}, {"type": "null"}]}
                }},
                "E": {"type": "string", "enum": ["low", "high"]}
            }}
        })
    }

    #[test]
    fn a_route_model_reads_from_its_ref_with_types_literals_and_bounds() {
        let doc = openapi();
        let m = model(&doc, "/v1/x").unwrap();
        assert_eq!(m.required, vec!["a"]);
        let prop = |n: &str| m.props.iter().find(|p| p.name == n).unwrap().schema.clone();
        assert_eq!(types(&prop("b")), vec!["integer", "null"]);
        assert_eq!(bounds(&prop("b")), vec![1.0]);
        assert_eq!(literals(&prop("c")), vec![json!("low"), json!("high")]);
        assert!(model(&doc, "/v1/y").is_none());
    }
}
