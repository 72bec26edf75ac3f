//! `POST /v1/chat/completions/derender` and `/v1/completions/derender` (streaming, `stream:
//! true`): one chunk of `/inference/v1/generate` and the state the client carries between calls
//! in, the chat or completions chunk and the next state out. The body is validated as FastAPI
//! validates vLLM's union of the non-streaming and the streaming request models.

mod chat;
mod completion;

pub(crate) use chat::chat;
pub(crate) use completion::completions;

use serde_json::{json, Map, Value};

use super::super::pydantic::{self, PyErr};
use super::super::{bad_request, ApiError, App};
use crate::sim::changes::{since, Change};
use crate::sim::vocab;

/// The two request models of a derender route.
struct Models {
    whole: &'static str,
    stream: &'static str,
    /// The non-streaming model's required field.
    whole_field: &'static str,
}

/// A streaming derender body, validated.
struct StreamBody {
    req: Map<String, Value>,
    chunk: Map<String, Value>,
    state: State,
    prompt_ids: Option<Vec<u32>>,
}

/// Non-negative integers as ids (a value past u32 reads as an id outside the vocabulary).
fn ids_of(v: Option<&Value>) -> Vec<u32> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
                .collect()
        })
        .unwrap_or_default()
}

/// The errors of the streaming model's fields (`loc` under `body.<model>`).
fn stream_errors(req: &Map<String, Value>, model: &str) -> Vec<PyErr> {
    let mut errors = Vec::new();
    let at = |f: &str| format!("body.{model}.{f}");
    match req.get("generate_chunk") {
        None => errors.push(pydantic::missing(&format!("{model}.generate_chunk"), req)),
        Some(Value::Object(c)) if !c.get("choices").is_some_and(Value::is_array) => {
            errors.push(pydantic::missing(&format!("{model}.generate_chunk.choices"), c));
        }
        Some(Value::Object(_)) => {}
        Some(other) => errors.push(PyErr::new(
            "model_attributes_type",
            &at("generate_chunk"),
            "Input should be a valid dictionary or object to extract fields from",
            other,
        )),
    }
    if let Some(Value::Object(s)) = req.get("stream_state") {
        let (ids, lens) = (s.get("output_token_ids"), s.get("output_chunk_lens"));
        let len = ids.and_then(Value::as_array).map_or(0, Vec::len);
        let sum: u64 = lens
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .sum();
        if sum != len as u64 {
            let msg = format!(
                "output_chunk_lens must sum to len(output_token_ids) (got sum={sum}, len(output_token_ids)={len})"
            );
            let mut e = PyErr::new(
                "value_error",
                &at("stream_state"),
                &format!("Value error, {msg}"),
                &Value::Object(s.clone()),
            );
            e.ctx = Some(format!("'error': ValueError({})", pydantic::repr_str(&msg)));
            errors.push(e);
        }
    }
    if let Some(p) = req.get("prompt_token_ids").filter(|p| !p.is_null()) {
        if !p.as_array().is_some_and(|a| a.iter().all(Value::is_u64)) {
            errors.push(PyErr::new(
                "list_type",
                &at("prompt_token_ids"),
                "Input should be a valid list of non-negative integers",
                p,
            ));
        }
    }
    errors
}

/// The body as the streaming model, or the union's errors (both members' when neither fits).
fn stream_body(req: Map<String, Value>, models: &Models) -> Result<StreamBody, ApiError> {
    let stream = req.get("stream");
    if stream != Some(&Value::Bool(true)) {
        if req.contains_key(models.whole_field) && stream.is_none_or(|s| s == &Value::Bool(false)) {
            return Err(bad_request(
                "vllm-sim does not simulate non-streaming derender; send stream: true",
                None,
                None,
            ));
        }
        let mut errors = vec![pydantic::missing(
            &format!("{}.{}", models.whole, models.whole_field),
            &req,
        )];
        errors.push(match stream {
            None => pydantic::missing(&format!("{}.stream", models.stream), &req),
            Some(s) => {
                let mut e = PyErr::new(
                    "literal_error",
                    &format!("body.{}.stream", models.stream),
                    "Input should be True",
                    s,
                );
                e.ctx = Some("'expected': 'True'".into());
                e
            }
        });
        return Err(pydantic::to_error(&errors));
    }
    let branch = stream_errors(&req, models.stream);
    if !branch.is_empty() {
        let mut e = PyErr::new(
            "literal_error",
            &format!("body.{}.stream", models.whole),
            "Input should be False",
            &Value::Bool(true),
        );
        e.ctx = Some("'expected': 'False'".into());
        let mut errors = vec![e];
        if !req.contains_key(models.whole_field) {
            errors.push(pydantic::missing(
                &format!("{}.{}", models.whole, models.whole_field),
                &req,
            ));
        }
        errors.extend(branch);
        return Err(pydantic::to_error(&errors));
    }
    let chunk = req
        .get("generate_chunk")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let state = State::read(req.get("stream_state"));
    let prompt_ids = req
        .get("prompt_token_ids")
        .filter(|p| !p.is_null())
        .map(|p| ids_of(Some(p)));
    Ok(StreamBody {
        req,
        chunk,
        state,
        prompt_ids,
    })
}

/// The chunk's single choice (vLLM derenders one choice per call).
fn one_choice(chunk: &Map<String, Value>, what: &str) -> Result<Option<Map<String, Value>>, ApiError> {
    let choices = chunk
        .get("choices")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if choices.len() > 1 {
        return Err(bad_request(
            &format!("{what} expects at most one choice per chunk (got {})", choices.len()),
            None,
            None,
        ));
    }
    Ok(choices.into_iter().next().and_then(|c| c.as_object().cloned()))
}

/// The ids whose text shows: the one that stopped the output leaves (vLLM's
/// `_drop_stop_token`: the end-of-sequence token after a `stop` finish, unless `ignore_eos`).
fn text_ids<'a>(ids: &'a [u32], choice: &Map<String, Value>, req: Option<&Map<String, Value>>) -> &'a [u32] {
    let stopped = choice.get("finish_reason").and_then(Value::as_str) == Some("stop")
        && !choice.get("stop_reason").is_some_and(Value::is_string)
        && ids.last() == Some(&vocab::eos_id())
        && req.and_then(|r| r.get("ignore_eos")) != Some(&Value::Bool(true));
    if stopped {
        &ids[..ids.len() - 1]
    } else {
        ids
    }
}

/// The prompt, the output so far and this chunk within the context (vLLM's bound on the
/// work a call may ask for).
fn check_bounds(app: &App, prompt: usize, prior: usize, delta: usize) -> Result<(), ApiError> {
    let max = app.args.max_model_len as usize;
    if prompt + prior + delta > max {
        return Err(bad_request(
            &format!(
                "prompt_token_ids length ({prompt}) plus output_token_ids length ({prior}) plus delta ({delta}) exceeds max_model_len ({max})."
            ),
            None,
            None,
        ));
    }
    Ok(())
}

/// The usage of a generate chunk that carried one, with the caller's prompt count.
fn usage_of(chunk: &Map<String, Value>, prompt_tokens: Option<u64>) -> Value {
    match chunk.get("usage").and_then(Value::as_object) {
        Some(u) => {
            let pt = prompt_tokens
                .or_else(|| u.get("prompt_tokens").and_then(Value::as_u64))
                .unwrap_or(0);
            let ct = u.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0);
            super::usage_info(pt as usize, ct as usize)
        }
        None => Value::Null,
    }
}

/// The client-carried `DerenderStreamState`.
#[derive(Debug, Clone, Default)]
struct State {
    /// The detokenizer's window (`prev_token_ids`; 0.33 carries its token strings).
    window: Vec<u32>,
    prefix_offset: u64,
    read_offset: u64,
    role_sent: bool,
    logprob_context: Vec<Value>,
    logprob_text_offset: u64,
    output_ids: Vec<u32>,
    chunk_lens: Vec<usize>,
    tools_streamed: bool,
    tool_ids: Vec<String>,
}

/// A window id as 0.33's `prev_tokens` holds it: its text, or a byte as `<0xNN>`.
fn token_string(id: u32) -> String {
    match id {
        0..=255 => format!("<0x{id:02X}>"),
        _ => vocab::piece_texts(&[id]).0.concat(),
    }
}

fn token_from_string(s: &str) -> Option<u32> {
    match s.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => vocab::id_of(s),
    }
}

impl State {
    fn read(v: Option<&Value>) -> State {
        let Some(s) = v.and_then(Value::as_object) else {
            return State::default();
        };
        let num = |k: &str| s.get(k).and_then(Value::as_u64).unwrap_or(0);
        let window = match s.get("prev_tokens").and_then(Value::as_array) {
            Some(strings) => strings
                .iter()
                .filter_map(Value::as_str)
                .filter_map(token_from_string)
                .collect(),
            None => ids_of(s.get("prev_token_ids")),
        };
        State {
            window,
            prefix_offset: num("prefix_offset"),
            read_offset: num("read_offset"),
            role_sent: s.get("role_sent") == Some(&Value::Bool(true)),
            logprob_context: s
                .get("logprob_context_token_ids")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            logprob_text_offset: num("logprob_text_offset"),
            output_ids: ids_of(s.get("output_token_ids")),
            chunk_lens: s
                .get("output_chunk_lens")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).map(|n| n as usize).collect())
                .unwrap_or_default(),
            tools_streamed: s.get("tools_streamed") == Some(&Value::Bool(true)),
            tool_ids: s
                .get("last_tool_call_ids")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default(),
        }
    }

    /// The logprob context after `ids`: the last four sampled ids.
    fn advance_context(&mut self, ids: &[u32]) {
        self.logprob_context.extend(ids.iter().map(|i| json!(i)));
        let extra = self.logprob_context.len().saturating_sub(4);
        self.logprob_context.drain(..extra);
    }

    fn to_json(&self) -> Value {
        let window = if since(Change::DerenderWindowIds) {
            ("prev_token_ids", json!(self.window))
        } else {
            (
                "prev_tokens",
                json!(self.window.iter().map(|i| token_string(*i)).collect::<Vec<_>>()),
            )
        };
        let mut s = Map::new();
        s.insert(window.0.into(), window.1);
        s.insert("prefix_offset".into(), json!(self.prefix_offset));
        s.insert("read_offset".into(), json!(self.read_offset));
        s.insert("role_sent".into(), json!(self.role_sent));
        s.insert("logprob_context_token_ids".into(), json!(self.logprob_context));
        s.insert("logprob_text_offset".into(), json!(self.logprob_text_offset));
        s.insert("output_token_ids".into(), json!(self.output_ids));
        s.insert("output_chunk_lens".into(), json!(self.chunk_lens));
        s.insert("tools_streamed".into(), json!(self.tools_streamed));
        s.insert("last_tool_call_ids".into(), json!(self.tool_ids));
        Value::Object(s)
    }
}
