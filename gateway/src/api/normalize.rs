//! Request normalisation, in this order: flatten a stray `extra_body` the way the OpenAI SDK
//! would have sent it, resolve `model`, validate and translate `reasoning_effort` and
//! `chat_template_kwargs` for the profile's chat template. Pure functions on the JSON body.

use std::collections::HashMap;

use serde_json::{Map, Value};
use sparkgate_config::{ProfileId, VllmRelease};

use crate::api::error::GatewayError;
use crate::api::family::Api;
use crate::api::lax::{lax_bool, lax_integer};
use crate::api::models::alias_matches;
use crate::api::releases::Rule;
use crate::observe::Repair;

/// How deep a literal `extra_body` may nest inside another.
const EXTRA_BODY_DEPTH: usize = 4;
/// Bounds on `chat_template_kwargs`: it reaches a Jinja template, keep it small.
const KWARGS_MAX_KEYS: usize = 64;
const KWARGS_MAX_BYTES: usize = 16 * 1024;

mod fields;
pub(crate) use fields::Fields;

/// A normalised request, ready for admission and the upstream.
#[derive(Debug)]
pub(crate) struct Normalized {
    pub(crate) body: Map<String, Value>,
    pub(crate) stream: bool,
    /// Sequences the request runs upstream: the permits it takes and what the fair queue charges.
    pub(crate) sequences: Sequences,
    /// The listed repairs made to the body (`Repair`).
    pub(crate) repairs: Vec<Repair>,
    /// `(as sent, as forwarded)` when an effort was translated.
    pub(crate) effort_mapping: Option<(String, String)>,
    /// The gateway added `stream_options.include_usage` for its own accounting; the usage chunk
    /// must not reach the client.
    pub(crate) usage_injected: bool,
    /// The model name as the client sent it (for the log line); the served name is shared, not
    /// copied, since nearly every request sends it.
    pub(crate) model: Option<std::sync::Arc<str>>,
    /// How a cut stream of this request can be continued exactly (`body::prepare_now` decides).
    pub(crate) resume: Option<ResumeSpec>,
    /// The model it is for (`models::Catalog`; the only one without MODELS).
    pub(crate) model_id: crate::api::models::ModelId,
}

pub(crate) use crate::api::resume::ResumeSpec;

/// The sequences a request makes vLLM run at once — each holds one of MAX_NUM_SEQS: `n` per
/// prompt of a completion (and of a completions-shaped `/invocations`), one per conversation of
/// a batch (vLLM refuses a batch's `n` but 1), `n` per request everywhere else that has `n`
/// (Messages and Responses have none). Beam search runs `n` beams, so `n` counts it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sequences {
    pub(crate) n: u32,
    pub(crate) per: Per,
}

/// What `n` multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Per {
    Request,
    Prompts(u32),
    Conversations(u32),
}

impl Sequences {
    /// The one count, from the normalised body (and the prompt count read from the raw one).
    fn of(api: Api, body: &Map<String, Value>, prompts: Option<u32>) -> Result<Sequences, GatewayError> {
        // Only the OpenAI request models with `n` read it (Messages and Responses have none);
        // a batch refuses any `n` but 1 itself (vLLM's `check_batch_mode`), so it runs one
        // sequence per conversation.
        let n = match api {
            Api::Chat | Api::Completions => lax_count(body.field("n")),
            _ => 1,
        };
        let per = match (api, body.field("messages")) {
            (Api::Batch, Some(Value::Array(conversations))) if !conversations.is_empty() => {
                Per::Conversations(u32::try_from(conversations.len()).unwrap_or(u32::MAX))
            }
            (Api::Batch, _) => {
                return Err(GatewayError::bad_request(
                    "`messages` must be a non-empty list of conversations",
                    "messages",
                ))
            }
            (Api::Completions, _) => Per::Prompts(prompts.unwrap_or(1)),
            _ => Per::Request,
        };
        Ok(Sequences { n, per })
    }

    /// Every sequence at once.
    pub(crate) fn total(&self) -> u32 {
        let per = match self.per {
            Per::Request => 1,
            Per::Prompts(p) | Per::Conversations(p) => p,
        };
        self.n.saturating_mul(per)
    }

    /// The 400 for a request that needs more sequences at once than the model runs.
    pub(crate) fn refusal(&self, capacity: u32) -> GatewayError {
        let (what, param) = match self.per {
            Per::Request => (format!("n={}", self.n), "n"),
            Per::Prompts(p) => (format!("{p} prompt(s) × n={}", self.n), "prompt"),
            Per::Conversations(c) => (format!("{c} conversation(s)"), "messages"),
        };
        GatewayError::TooManySequences {
            message: format!(
                "{what} needs {} sequences at once, more than the model runs at once (MAX_NUM_SEQS={capacity})",
                self.total()
            ),
            param,
        }
    }
}

/// `n` read as vLLM reads it (`lax_integer`); anything else, or below 1, is vLLM's to refuse
/// and counts as 1 here.
fn lax_count(value: Option<&Value>) -> u32 {
    value
        .and_then(lax_integer)
        .filter(|n| *n >= 1)
        .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// What the profile's template accepts, resolved once from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct Normalizer {
    profile: ProfileId,
    served: String,
    /// `served`, shared by every request that names it.
    served_shared: std::sync::Arc<str>,
    /// RESUME_TIMEOUT is set: streams that can be continued ask vLLM for their token ids.
    pub(crate) resume_streams: bool,
    aliases: Vec<String>,
    effort_map: HashMap<String, String>,
}

/// An effort the template understands.
#[derive(Debug, Clone, PartialEq)]
enum Effort {
    Named(&'static str),
    Int(u8),
    Off,
}

impl Effort {
    fn label(&self) -> String {
        match self {
            Effort::Named(n) => (*n).to_owned(),
            Effort::Int(v) => v.to_string(),
            Effort::Off => "none".to_owned(),
        }
    }
}

impl Normalizer {
    pub(crate) fn new(profile: ProfileId, served: &str, aliases: &[String], effort_map: &[(String, String)]) -> Self {
        Self {
            profile,
            served: served.to_owned(),
            served_shared: served.into(),
            resume_streams: false,
            aliases: aliases.to_vec(),
            effort_map: effort_map.iter().cloned().collect(),
        }
    }

    pub(crate) fn served(&self) -> &str {
        &self.served
    }

    pub(crate) fn aliases(&self) -> &[String] {
        &self.aliases
    }

    pub(crate) fn profile(&self) -> ProfileId {
        self.profile
    }

    /// Normalises `body`; `prompts` is how many prompts a completions `prompt` holds (read
    /// from the raw body, `body::prompt_count`).
    pub(crate) fn normalize(
        &self,
        api: Api,
        release: VllmRelease,
        mut body: Map<String, Value>,
        prompts: Option<u32>,
    ) -> Result<Normalized, GatewayError> {
        let api = api.for_body(body.has("messages"));
        let mut repairs = Vec::new();
        if flatten_extra_body(&mut body)? {
            repairs.push(Repair::ExtraBody);
        }
        if api == Api::Chat && Rule::DropEmptyTools.holds(release) && drop_empty_tools(&mut body) {
            repairs.push(Repair::EmptyTools);
        }
        let model = body.field("model").and_then(Value::as_str).map(|m| {
            if m == self.served {
                self.served_shared.clone()
            } else {
                m.into()
            }
        });
        self.resolve_model(&mut body)?;
        // With kwargs that are not an object vLLM refuses the request: nothing to translate.
        let kwargs_valid = matches!(
            body.field("chat_template_kwargs"),
            None | Some(Value::Null | Value::Object(_))
        );
        let effort_mapping = match api {
            _ if !kwargs_valid => None,
            Api::Chat => self.chat_effort(&mut body)?,
            Api::Responses => self.responses_effort(&mut body)?,
            Api::Batch => self.chat_effort(&mut body)?,
            Api::Messages => self.messages_effort(&mut body)?,
            // `/tokenize` renders chat messages too: the same kwargs rules.
            Api::Utility => {
                self.kwargs(&mut body)?;
                None
            }
            Api::Completions | Api::Opaque | Api::Invocations => None,
        };
        // Read as vLLM reads it; a value it would refuse is its to refuse, as a whole answer here.
        let stream = body.field("stream").and_then(lax_bool).unwrap_or(false);
        let sequences = Sequences::of(api, &body, prompts)?;
        let usage_injected = stream && matches!(api, Api::Chat | Api::Completions) && inject_usage(&mut body);
        Ok(Normalized {
            body,
            stream,
            sequences,
            repairs,
            effort_mapping,
            usage_injected,
            model,
            resume: None,
            model_id: crate::api::models::ModelId::default(),
        })
    }

    /// Aliases become the served name; absent, null or empty means the served name.
    fn resolve_model(&self, body: &mut Map<String, Value>) -> Result<(), GatewayError> {
        match body.field("model") {
            // Already the served name: nothing to write.
            Some(Value::String(m)) if *m == self.served => return Ok(()),
            None | Some(Value::Null) => {}
            Some(Value::String(m)) if m.is_empty() || self.aliases.iter().any(|a| alias_matches(a, m)) => {}
            Some(Value::String(m)) => {
                let mut valid = vec![self.served.clone()];
                valid.extend(self.aliases.iter().cloned());
                return Err(GatewayError::ModelNotFound {
                    model: m.clone(),
                    valid: valid.join(", "),
                });
            }
            // Not a string: vLLM's validation refuses it, in its own words.
            Some(_) => return Ok(()),
        }
        body.insert("model".into(), Value::String(self.served.clone()));
        Ok(())
    }

    /// The names the template renders: its own, and the one it falls back to (GLM's `max`).
    fn names(&self) -> impl Iterator<Item = &'static str> {
        let facts = self.profile.reasoning();
        let fallback = facts
            .unknown_renders_as
            .filter(|u| !facts.named.iter().any(|(n, _)| n == u));
        facts.named.iter().map(|(n, _)| *n).chain(fallback)
    }

    /// The integer efforts the template takes, if any (from the profile's reasoning facts).
    fn integer(&self, v: u64) -> Option<Effort> {
        let (lo, hi) = self.profile.reasoning().integer_range?;
        (u64::from(lo)..=u64::from(hi))
            .contains(&v)
            .then_some(Effort::Int(v as u8))
    }

    fn accepted(&self) -> String {
        let names = self.names().collect::<Vec<_>>().join(", ");
        let mut s = match self.profile.reasoning().integer_range {
            Some((lo, hi)) => format!("{names}, none or an integer {lo}-{hi}"),
            None => format!("{names} or none"),
        };
        if !self.effort_map.is_empty() {
            let mut pairs: Vec<String> = self.effort_map.iter().map(|(f, t)| format!("{f}={t}")).collect();
            pairs.sort();
            s.push_str(&format!(
                " ({} are mapped: {})",
                self.effort_map.keys().cloned().collect::<Vec<_>>().join(", "),
                pairs.join(", ")
            ));
        }
        s
    }

    fn named(&self, s: &str) -> Option<Effort> {
        if s == "none" {
            return Some(Effort::Off);
        }
        if let Some(n) = self.names().find(|n| *n == s) {
            return Some(Effort::Named(n));
        }
        s.parse::<u64>().ok().and_then(|v| self.integer(v))
    }

    /// One effort value as the client sent it → what the template takes.
    fn parse_effort(&self, value: &Value, param: &'static str) -> Result<Effort, GatewayError> {
        let refuse = |shown: String| {
            GatewayError::bad_request(
                format!(
                    "{param} {shown} is not accepted by {}; use {}",
                    self.profile,
                    self.accepted()
                ),
                param,
            )
        };
        match value {
            Value::String(s) => {
                let s = s.trim();
                if let Some(e) = self.named(s) {
                    return Ok(e);
                }
                match self.effort_map.get(s).and_then(|to| self.named(to)) {
                    Some(e) => Ok(e),
                    None => Err(refuse(format!("`{s}`"))),
                }
            }
            Value::Number(n) if self.profile.reasoning().integer_range.is_some() => {
                match n.as_u64().and_then(|v| self.integer(v)) {
                    Some(e) => Ok(e),
                    None => Err(refuse(format!("`{n}`"))),
                }
            }
            other => Err(refuse(format!("`{other}`"))),
        }
    }

    /// Validates `chat_template_kwargs` (object, boolean switches, no template overrides, size).
    fn kwargs<'a>(&self, body: &'a mut Map<String, Value>) -> Result<Option<&'a mut Map<String, Value>>, GatewayError> {
        match body.field_mut("chat_template_kwargs") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(kw)) => {
                for key in ["chat_template", "tokenize"] {
                    if kw.has(key) {
                        return Err(GatewayError::bad_request(
                            format!("chat_template_kwargs.{key} is not allowed"),
                            "chat_template_kwargs",
                        ));
                    }
                }
                for key in ["enable_thinking", "thinking"] {
                    if kw.get(key).is_some_and(|v| !v.is_boolean()) {
                        return Err(GatewayError::bad_request(
                            format!("chat_template_kwargs.{key} must be true or false"),
                            "chat_template_kwargs",
                        ));
                    }
                }
                let size = serialized_len(kw);
                if kw.len() > KWARGS_MAX_KEYS || size > KWARGS_MAX_BYTES {
                    return Err(GatewayError::bad_request(
                        format!(
                            "chat_template_kwargs is limited to {KWARGS_MAX_KEYS} keys and {KWARGS_MAX_BYTES} bytes"
                        ),
                        "chat_template_kwargs",
                    ));
                }
                Ok(Some(kw))
            }
            // Not an object: vLLM's validation refuses it, in its own words.
            Some(_) => Ok(None),
        }
    }

    /// Chat: top-level `reasoning_effort` wins over `chat_template_kwargs.reasoning_effort`, as in
    /// vLLM. Names stay top-level (vLLM forwards them to the template); integers go into the
    /// kwargs (vLLM's field only takes its literal set); `none` turns thinking off.
    fn chat_effort(&self, body: &mut Map<String, Value>) -> Result<Option<(String, String)>, GatewayError> {
        let top = match body.field("reasoning_effort") {
            None | Some(Value::Null) => None,
            Some(v) => Some((v.clone(), self.parse_effort(v, "reasoning_effort")?)),
        };
        let in_kwargs = self.kwargs_effort(body)?;
        let Some((original, effort)) = top.or(in_kwargs) else {
            return Ok(None);
        };
        body.remove("reasoning_effort");
        if let Some(Value::Object(kw)) = body.field_mut("chat_template_kwargs") {
            kw.remove("reasoning_effort");
        }
        match &effort {
            Effort::Named(n) => {
                body.insert("reasoning_effort".into(), Value::String((*n).to_owned()));
            }
            other => effort_in_kwargs(body, other),
        }
        Ok(mapping(&original, &effort))
    }

    /// Responses: `reasoning.effort` under the same rules. OpenAI's field takes only OpenAI's
    /// names, so `max` and integers travel in `chat_template_kwargs`.
    fn responses_effort(&self, body: &mut Map<String, Value>) -> Result<Option<(String, String)>, GatewayError> {
        self.kwargs(body)?;
        let value = match body.field("reasoning") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(r)) => r.field("effort").cloned().filter(|e| !e.is_null()),
            // Not an object: vLLM's validation refuses it, in its own words.
            Some(_) => return Ok(None),
        };
        let Some(value) = value else { return Ok(None) };
        let effort = self.parse_effort(&value, "reasoning.effort")?;
        let reasoning = body
            .field_mut("reasoning")
            .and_then(Value::as_object_mut)
            .expect("checked above");
        reasoning.remove("effort");
        match &effort {
            Effort::Named(n @ ("low" | "high")) => {
                reasoning.insert("effort".into(), Value::String((*n).to_owned()));
            }
            other => effort_in_kwargs(body, other),
        }
        Ok(mapping(&value, &effort))
    }
}

/// `effort` where the chat template reads it: a name or an integer as `reasoning_effort`, off as
/// `enable_thinking: false` (unless the client set it).
fn effort_in_kwargs(body: &mut Map<String, Value>, effort: &Effort) {
    let kwargs = kwargs_entry(body);
    match effort {
        Effort::Named(n) => {
            kwargs.insert("reasoning_effort".into(), Value::String((*n).to_owned()));
        }
        Effort::Int(v) => {
            kwargs.insert("reasoning_effort".into(), Value::from(*v));
        }
        Effort::Off => {
            kwargs.entry("enable_thinking").or_insert(Value::Bool(false));
        }
    }
}

impl Normalizer {
    /// Anthropic: `output_config.effort` and `chat_template_kwargs.reasoning_effort` under
    /// chat's rules, `output_config.effort` first (vLLM sets the request's effort from it, over
    /// the kwargs). Names stay in `output_config.effort` (Anthropic's literal takes low,
    /// medium, high, xhigh and max), integers travel in `chat_template_kwargs`, `none` becomes
    /// thinking disabled.
    fn messages_effort(&self, body: &mut Map<String, Value>) -> Result<Option<(String, String)>, GatewayError> {
        let top = match body.field("output_config") {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => o.field("effort").cloned().filter(|e| !e.is_null()),
            // Not an object: vLLM's validation refuses it, in its own words.
            Some(_) => return Ok(None),
        };
        let top = match top {
            Some(v) => Some((v.clone(), self.parse_effort(&v, "output_config.effort")?)),
            None => None,
        };
        let in_kwargs = self.kwargs_effort(body)?;
        let Some((original, effort)) = top.or(in_kwargs) else {
            return Ok(None);
        };
        if let Some(Value::Object(config)) = body.field_mut("output_config") {
            config.remove("effort");
        }
        if let Some(Value::Object(kw)) = body.field_mut("chat_template_kwargs") {
            kw.remove("reasoning_effort");
        }
        match &effort {
            Effort::Named(n) => {
                let config = body.entry("output_config").or_insert_with(|| Value::Object(Map::new()));
                if !config.is_object() {
                    *config = Value::Object(Map::new());
                }
                if let Value::Object(config) = config {
                    config.insert("effort".into(), Value::String((*n).to_owned()));
                }
            }
            Effort::Int(v) => {
                kwargs_entry(body).insert("reasoning_effort".into(), Value::from(*v));
            }
            Effort::Off => {
                body.insert("thinking".into(), serde_json::json!({"type": "disabled"}));
            }
        }
        Ok(mapping(&original, &effort))
    }

    /// `chat_template_kwargs.reasoning_effort`, validated, with the kwargs' own checks.
    fn kwargs_effort(&self, body: &mut Map<String, Value>) -> Result<Option<(Value, Effort)>, GatewayError> {
        match self.kwargs(body)?.and_then(|kw| kw.field("reasoning_effort").cloned()) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let effort = self.parse_effort(&v, "chat_template_kwargs.reasoning_effort")?;
                Ok(Some((v, effort)))
            }
        }
    }
}

fn kwargs_entry(body: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let entry = body
        .entry("chat_template_kwargs")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut().expect("just made an object")
}

/// The length of `value` as JSON, counted without building it.
fn serialized_len(value: &Map<String, Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// `Some((as sent, as forwarded))` when the value changed on the way.
fn mapping(original: &Value, effort: &Effort) -> Option<(String, String)> {
    let sent = match original {
        Value::String(s) => s.trim().to_owned(),
        other => other.to_string(),
    };
    let to = effort.label();
    let unchanged = sent == to && !matches!((original, effort), (Value::String(_), Effort::Int(_)));
    (!unchanged).then_some((sent, to))
}

/// Asks vLLM for the final usage chunk of a stream the client did not ask it of, for the
/// gateway's own accounting (the relay drops that chunk); true when it did. As vLLM's
/// `should_include_usage`: usage is on when `stream_options.include_usage` is (lax) true, and
/// `continuous_usage_stats` counts only then — so it is turned off with the injection, and the
/// client gets no usage anywhere, as from vLLM. `stream_options` that vLLM would refuse (not an
/// object, a value that is no boolean) is left as sent.
fn inject_usage(body: &mut Map<String, Value>) -> bool {
    let opts = match body.field_mut("stream_options") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(_) => return false,
    };
    let Some(opts) = opts else {
        body.insert("stream_options".into(), serde_json::json!({"include_usage": true}));
        return true;
    };
    let flag = |o: &Map<String, Value>, key: &str| match o.field(key) {
        None | Some(Value::Null) => Some(false),
        Some(v) => lax_bool(v),
    };
    match (flag(opts, "include_usage"), flag(opts, "continuous_usage_stats")) {
        (Some(false), Some(continuous)) => {
            opts.insert("include_usage".into(), Value::Bool(true));
            if continuous {
                opts.insert("continuous_usage_stats".into(), Value::Bool(false));
            }
            true
        }
        _ => false,
    }
}

/// LiteLLM's Responses bridge sends chat completions with `tools: []`, which vLLM 0.33 refuses
/// ("`tools` must not be an empty array"; `releases::Rule::DropEmptyTools`): the list is dropped, with a `tool_choice` of `auto`
/// or `none`, which mean the same without it. `required` or a named tool, with nothing to
/// choose from, stays for vLLM to refuse.
fn drop_empty_tools(body: &mut Map<String, Value>) -> bool {
    if !matches!(body.field("tools"), Some(Value::Array(tools)) if tools.is_empty()) {
        return false;
    }
    match body.field("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(choice)) if choice == "auto" || choice == "none" => {
            body.shift_remove("tool_choice");
        }
        Some(_) => return false,
    }
    body.shift_remove("tools");
    true
}

/// Merges `value` into `target`: objects merge key by key (recursively), anything else replaces.
fn deep_merge(target: &mut Value, value: Value) {
    match (target, value) {
        (Value::Object(t), Value::Object(v)) => {
            for (k, v) in v {
                match t.get_mut(&k) {
                    Some(existing) => deep_merge(existing, v),
                    None => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (t, v) => *t = v,
    }
}

/// Flattens a literal `extra_body` object into the body, as the OpenAI SDK does on the client:
/// its keys override top-level keys, objects deep-merge, a nested `extra_body` is flattened in
/// turn (up to EXTRA_BODY_DEPTH). `null` counts as absent.
fn flatten_extra_body(body: &mut Map<String, Value>) -> Result<bool, GatewayError> {
    let mut rounds = 0;
    // Looked for before removing: a remove hashes, and the field is rarely there.
    while let Some(extra) = body.has("extra_body").then(|| body.remove("extra_body")).flatten() {
        let extra = match extra {
            Value::Null => continue,
            Value::Object(o) => o,
            _ => return Err(GatewayError::bad_request("extra_body must be an object", "extra_body")),
        };
        rounds += 1;
        if rounds > EXTRA_BODY_DEPTH {
            return Err(GatewayError::bad_request(
                format!("extra_body is nested more than {EXTRA_BODY_DEPTH} levels deep"),
                "extra_body",
            ));
        }
        for (k, v) in extra {
            match body.get_mut(&k) {
                Some(existing) if k != "extra_body" => deep_merge(existing, v),
                _ => {
                    body.insert(k, v);
                }
            }
        }
    }
    Ok(rounds > 0)
}

#[cfg(test)]
mod tests;
