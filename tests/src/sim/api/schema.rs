//! vLLM's request models per release, derived from the real frontend's own `/openapi.json`
//! (captured per release in `tests/sim-schema/`, checked against the live frontend by every `diff-fuzz` run) and the
//! facts pydantic knows that the schema does not say (`…-kinds.json`, written by
//! `capture_kinds.py`: each class's error for an input that is not a mapping, the tag a union
//! adds to an error's location, whether unknown keys are refused). Each route's body is one
//! [`Ty`] tree; `check` validates a body against it the way pydantic's lax mode does.

mod check;

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Map, Value};
use sparkgate_config::VllmRelease;

pub(crate) use check::{check_body, conforms};

/// The fields of `body` that `POST path`'s model declares (pydantic drops the rest of an
/// extra-allowing model before the request becomes sampling parameters).
pub(crate) fn declared(path: &str, body: &Map<String, Value>) -> Map<String, Value> {
    let Some(Ty::Ref(name)) = schema().body(path) else {
        return body.clone();
    };
    let Some(Component::Model(m)) = schema().component(name) else {
        return body.clone();
    };
    body.iter()
        .filter(|(k, _)| m.fields.iter().any(|f| f.0 == **k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Each release's captured `/openapi.json` and kinds.
const CAPTURED: [(VllmRelease, &str, &str); 2] = [
    (
        VllmRelease::V0_33,
        include_str!("../../../sim-schema/vllm-0.33.0-openapi.json"),
        include_str!("../../../sim-schema/vllm-0.33.0-kinds.json"),
    ),
    (
        VllmRelease::V0_34,
        include_str!("../../../sim-schema/vllm-0.34.0-openapi.json"),
        include_str!("../../../sim-schema/vllm-0.34.0-kinds.json"),
    ),
];

/// Numeric bounds (`Field(ge=…, gt=…, le=…, lt=…)`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Bounds {
    pub(crate) ge: Option<f64>,
    pub(crate) gt: Option<f64>,
    pub(crate) le: Option<f64>,
    pub(crate) lt: Option<f64>,
}

/// A field's type, as pydantic validates it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ty {
    Any,
    Int(Bounds),
    Float(Bounds),
    Bool,
    Str {
        min: Option<u64>,
        max: Option<u64>,
    },
    Bytes,
    List {
        item: Box<Ty>,
        min: Option<u64>,
        max: Option<u64>,
    },
    Dict(Box<Ty>),
    /// `Literal[…]` (inline `enum` or `const`).
    Lit(Vec<Value>),
    /// A Python `Enum` class (a component holding an `enum`).
    Enum(Vec<Value>),
    Nullable(Box<Ty>),
    /// A smart union: every member fails before the union does.
    Union(Vec<Ty>),
    /// A discriminated union: the `key`'s value picks the member.
    Tagged {
        key: String,
        members: Vec<(String, Ty)>,
    },
    /// A component, resolved when validated (models refer to themselves).
    Ref(String),
}

/// What pydantic knows about a class that the schema does not say.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClassFacts {
    /// The error for an input that is not a mapping: (type, msg, rendered ctx).
    pub(crate) not_a_mapping: (String, String, Option<String>),
    /// The segment a union adds to an error's location for this member.
    pub(crate) union_tag: String,
    pub(crate) forbids_extra: bool,
}

/// A model, typed dict or dataclass.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelTy {
    /// The component's name (what [`FIELD_VALIDATORS`] are keyed by).
    pub(crate) name: String,
    pub(crate) facts: ClassFacts,
    /// Fields in declaration order (the order pydantic reports errors in).
    pub(crate) fields: Vec<(String, Ty, bool)>,
}

/// A component of the schema.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Component {
    Model(ModelTy),
    Alias(Ty),
}

/// A `field_validator` (mode "after"): run on a field that passed its type; `Some(message)`
/// is pydantic's `value_error`, "Value error, {message}".
pub(crate) type FieldValidator = fn(&Value) -> Option<&'static str>;

/// The field validators the schema cannot show, by (model, field), each ported from vLLM.
pub(crate) const FIELD_VALIDATORS: &[(&str, &str, FieldValidator)] = &[
    // anthropic/protocol.py, AnthropicMessagesRequest.validate_model / validate_max_tokens.
    ("AnthropicMessagesRequest", "model", model_required),
    ("AnthropicMessagesRequest", "max_tokens", max_tokens_positive),
    // anthropic/protocol.py, AnthropicCountTokensRequest.validate_model.
    ("AnthropicCountTokensRequest", "model", model_required),
];

/// A `model_validator(mode="before")` on a nested model: run on its raw mapping before its
/// fields; `Some(message)` is pydantic's `value_error`.
pub(crate) type ModelValidator = fn(&Map<String, Value>) -> Option<String>;

/// The nested models' before-validators, by model, each ported from vLLM.
pub(crate) const MODEL_VALIDATORS: &[(&str, ModelValidator)] = &[
    // anthropic/protocol.py (0.34), AnthropicTool.reject_anthropic_defined_tools.
    ("AnthropicTool", anthropic_defined_tool),
];

fn anthropic_defined_tool(tool: &Map<String, Value>) -> Option<String> {
    if !crate::sim::changes::since(crate::sim::changes::Change::AnthropicDefinedToolsRefused) {
        return None;
    }
    match tool.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) if t == "custom" => None,
        Some(other) => Some(format!(
            "tool type {} is not supported; only custom tools with an input_schema are supported",
            super::pydantic::py_repr(other)
        )),
    }
}

fn model_required(v: &Value) -> Option<&'static str> {
    (v.as_str() == Some("")).then_some("Model is required")
}

fn max_tokens_positive(v: &Value) -> Option<&'static str> {
    (v.as_f64().is_some_and(|n| n <= 0.0)).then_some("max_tokens must be positive")
}

/// Every component and each route's body type.
#[derive(Debug)]
pub(crate) struct Schema {
    components: HashMap<String, Component>,
    bodies: HashMap<String, Ty>,
}

/// Each release's captured schema, read once.
static SCHEMAS: LazyLock<Vec<(VllmRelease, Schema)>> = LazyLock::new(|| {
    CAPTURED
        .iter()
        .map(|(release, openapi, kinds)| {
            let openapi: Value = serde_json::from_str(openapi).expect("captured openapi.json");
            let kinds: Value = serde_json::from_str(kinds).expect("captured kinds.json");
            (*release, Schema::build(&openapi, &kinds))
        })
        .collect()
});

/// `release`'s request models.
pub(crate) fn of(release: VllmRelease) -> &'static Schema {
    &SCHEMAS
        .iter()
        .find(|(r, _)| *r == release)
        .expect("every release is captured")
        .1
}

/// The request models of the release the simulator plays.
pub(crate) fn schema() -> &'static Schema {
    of(crate::sim::release())
}

impl Schema {
    pub(crate) fn build(openapi: &Value, kinds: &Value) -> Schema {
        let empty = Map::new();
        let schemas = openapi
            .pointer("/components/schemas")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let components = schemas
            .iter()
            .map(|(name, s)| (name.clone(), component(name, s, kinds)))
            .collect();
        let mut bodies = HashMap::new();
        for (path, item) in openapi.get("paths").and_then(Value::as_object).unwrap_or(&empty) {
            let body = item
                .pointer("/post/requestBody/content")
                .and_then(Value::as_object)
                .and_then(|c| c.values().next())
                .and_then(|c| c.get("schema"));
            if let Some(body) = body {
                bodies.insert(path.clone(), ty(body));
            }
        }
        Schema { components, bodies }
    }

    /// The body type of `POST path`.
    pub(crate) fn body(&self, path: &str) -> Option<&Ty> {
        self.bodies.get(path)
    }

    pub(crate) fn component(&self, name: &str) -> Option<&Component> {
        self.components.get(name)
    }
}

/// The class facts for a component name (`module__Class` when pydantic had to qualify it,
/// `-Input`/`-Output` when its two modes differ).
fn facts(name: &str, kinds: &Value) -> ClassFacts {
    let bare = name.trim_end_matches("-Input").trim_end_matches("-Output");
    let short = bare.rsplit("__").next().unwrap_or(bare);
    let entry = kinds
        .pointer(&format!("/classes/{bare}"))
        .or_else(|| kinds.pointer(&format!("/classes/{short}")));
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    match entry {
        Some(e) => {
            let ctx = e
                .pointer("/not_a_mapping/ctx")
                .and_then(Value::as_object)
                .filter(|c| !c.is_empty())
                .map(|c| {
                    c.iter()
                        .map(|(k, v)| format!("'{k}': {}", super::pydantic::repr_str(v.as_str().unwrap_or_default())))
                        .collect::<Vec<_>>()
                        .join(", ")
                });
            ClassFacts {
                not_a_mapping: (
                    text(e.pointer("/not_a_mapping/type")),
                    text(e.pointer("/not_a_mapping/msg")),
                    ctx,
                ),
                union_tag: e.get("union_tag").and_then(Value::as_str).unwrap_or(short).to_owned(),
                forbids_extra: e.get("forbids_extra").and_then(Value::as_bool).unwrap_or(false),
            }
        }
        // A class no request reaches by pydantic (only by the schema): a plain model.
        None => ClassFacts {
            not_a_mapping: (
                "model_attributes_type".into(),
                "Input should be a valid dictionary or object to extract fields from".into(),
                None,
            ),
            union_tag: short.to_owned(),
            forbids_extra: false,
        },
    }
}

fn component(name: &str, s: &Value, kinds: &Value) -> Component {
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        let required: Vec<&str> = s
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let fields = props
            .iter()
            .map(|(k, v)| (k.clone(), ty(v), required.contains(&k.as_str())))
            .collect();
        return Component::Model(ModelTy {
            name: name.to_owned(),
            facts: facts(name, kinds),
            fields,
        });
    }
    if s.get("type").and_then(Value::as_str) == Some("object") && s.get("additionalProperties").is_none() {
        // A model with no fields.
        return Component::Model(ModelTy {
            name: name.to_owned(),
            facts: facts(name, kinds),
            fields: Vec::new(),
        });
    }
    match s.get("enum").and_then(Value::as_array) {
        Some(values) => Component::Alias(Ty::Enum(values.clone())),
        None => Component::Alias(ty(s)),
    }
}

fn num(s: &Value, key: &str) -> Option<f64> {
    s.get(key).and_then(Value::as_f64)
}

fn count(s: &Value, key: &str) -> Option<u64> {
    s.get(key).and_then(Value::as_u64)
}

/// The type a JSON schema node describes.
pub(crate) fn ty(s: &Value) -> Ty {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        return Ty::Ref(r.rsplit('/').next().unwrap_or(r).to_owned());
    }
    if let Some(v) = s.get("const") {
        return Ty::Lit(vec![v.clone()]);
    }
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        return Ty::Lit(values.clone());
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(members) = s.get(key).and_then(Value::as_array) {
            return union(s, members);
        }
    }
    let bounds = || Bounds {
        ge: num(s, "minimum"),
        gt: num(s, "exclusiveMinimum"),
        le: num(s, "maximum"),
        lt: num(s, "exclusiveMaximum"),
    };
    match s.get("type").and_then(Value::as_str) {
        Some("integer") => Ty::Int(bounds()),
        Some("number") => Ty::Float(bounds()),
        Some("boolean") => Ty::Bool,
        Some("string")
            if s.get("contentMediaType").is_some() || s.get("format").and_then(Value::as_str) == Some("binary") =>
        {
            Ty::Bytes
        }
        Some("string") => Ty::Str {
            min: count(s, "minLength"),
            max: count(s, "maxLength"),
        },
        Some("array") => Ty::List {
            item: Box::new(s.get("items").map_or(Ty::Any, ty)),
            min: count(s, "minItems"),
            max: count(s, "maxItems"),
        },
        Some("object") => match s.get("additionalProperties") {
            Some(v @ Value::Object(_)) => Ty::Dict(Box::new(ty(v))),
            _ => Ty::Dict(Box::new(Ty::Any)),
        },
        Some("null") => Ty::Lit(vec![Value::Null]),
        _ => Ty::Any,
    }
}

fn union(s: &Value, members: &[Value]) -> Ty {
    let nullable = members
        .iter()
        .any(|m| m.get("type").and_then(Value::as_str) == Some("null"));
    let rest: Vec<&Value> = members
        .iter()
        .filter(|m| m.get("type").and_then(Value::as_str) != Some("null"))
        .collect();
    let inner = if let Some(d) = s.get("discriminator") {
        let key = d
            .get("propertyName")
            .and_then(Value::as_str)
            .unwrap_or("type")
            .to_owned();
        // The schema sorts the mapping by tag; pydantic lists tags in the union's own order,
        // which `oneOf` keeps.
        let order: Vec<&Value> = s
            .get("oneOf")
            .and_then(Value::as_array)
            .map(|o| o.iter().filter_map(|m| m.get("$ref")).collect())
            .unwrap_or_default();
        let mut mapping: Vec<(&String, &Value)> = d
            .get("mapping")
            .and_then(Value::as_object)
            .map(|m| m.iter().collect())
            .unwrap_or_default();
        mapping.sort_by_key(|(_, r)| order.iter().position(|o| o == r).unwrap_or(usize::MAX));
        let members = mapping
            .into_iter()
            .map(|(tag, r)| (tag.clone(), ty(&serde_json::json!({ "$ref": r }))))
            .collect();
        Ty::Tagged { key, members }
    } else if rest.len() == 1 {
        ty(rest[0])
    } else {
        Ty::Union(rest.into_iter().map(ty).collect())
    };
    if nullable {
        Ty::Nullable(Box::new(inner))
    } else {
        inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_captured_schema_has_every_route_the_sim_validates() {
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/responses",
            "/tokenize",
            "/detokenize",
        ] {
            assert!(schema().body(path).is_some(), "{path}");
        }
        let Some(Component::Model(chat)) = schema().component("ChatCompletionRequest") else {
            panic!("chat model");
        };
        let field = |n: &str| chat.fields.iter().find(|f| f.0 == n).cloned().unwrap();
        assert!(field("messages").2);
        assert_eq!(field("include_reasoning").1, Ty::Bool);
        assert_eq!(
            field("stop").1,
            Ty::Nullable(Box::new(Ty::Union(vec![
                Ty::Str { min: None, max: None },
                Ty::List {
                    item: Box::new(Ty::Str { min: None, max: None }),
                    min: None,
                    max: Some(4)
                }
            ])))
        );
        let Some(Component::Model(format)) = schema().component("ResponseFormat") else {
            panic!("response_format model");
        };
        assert!(format.facts.union_tag.starts_with("function-wrap"));
    }
}
