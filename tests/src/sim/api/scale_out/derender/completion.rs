//! The streaming completions derender: the chunk's ids decoded through the detokenizer window
//! the client carries (a character whose bytes span chunks shows once complete), as a
//! `text_completion` chunk.

use axum::extract::State as Axum;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::super::super::chat::now_secs;
use super::super::super::{bad_request, request, ApiError, Shared};
use super::super::ok;
use super::{ids_of, one_choice, stream_body, text_ids, usage_of, Models, State};
use crate::sim::vocab;

const MODELS: Models = Models {
    whole: "DerenderCompletionRequest",
    stream: "DerenderCompletionStreamRequest",
    whole_field: "generate_responses",
};

/// vLLM refuses stop strings here: text already sent cannot be cut.
pub(super) const STOP_STRINGS: &str = "stop strings are not supported by streaming derender because text already sent cannot be cut. Use non-streaming derender or output_mode=text on /inference/v1/generate which holds stop strings back.";

/// The text `ids` add after the window: bytes of a character not yet complete stay in the
/// window until its last byte arrives.
pub(super) fn decode_window(state: &mut State, ids: &[u32]) -> String {
    if ids.is_empty() {
        return String::new();
    }
    let pending = state.window.get(state.read_offset as usize..).unwrap_or_default();
    let all: Vec<u32> = pending.iter().chain(ids).copied().collect();
    let (texts, waiting) = vocab::piece_texts(&all);
    if waiting > 0 {
        state.window = all[all.len() - waiting..].to_vec();
        state.read_offset = 0;
    } else {
        state.window = all[all.len() - 1..].to_vec();
        state.read_offset = 1;
    }
    state.prefix_offset = 0;
    texts.concat()
}

pub(crate) async fn completions(
    Axum(app): Axum<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let b = stream_body(request::json_object(&headers, &body)?, &MODELS)?;
    request::check_model(&app, &b.req)?;
    let creq = b.req.get("completion_request").and_then(Value::as_object);
    if creq.is_some_and(|r| !request::stop_strings(r).is_empty()) {
        return Err(bad_request(STOP_STRINGS, None, None));
    }
    let max = app.args.max_model_len as usize;
    if let Some(p) = b.prompt_ids.as_ref().filter(|p| p.len() > max) {
        return Err(bad_request(
            &format!("prompt_token_ids length ({}) exceeds max_model_len ({max}).", p.len()),
            None,
            None,
        ));
    }
    let choice = one_choice(&b.chunk, "derender_completion_stream")?;
    let mut state = b.state;
    let rti = creq.and_then(|r| r.get("return_token_ids")) == Some(&Value::Bool(true));
    let choices: Vec<Value> = choice
        .map(|c| {
            let ids = ids_of(c.get("token_ids"));
            let text = decode_window(&mut state, text_ids(&ids, &c, creq));
            state.advance_context(&ids);
            state.logprob_text_offset += text.chars().count() as u64;
            let field = |k: &str| c.get(k).cloned().unwrap_or(Value::Null);
            let prompt_ids = b.chunk.get("prompt_token_ids").cloned().filter(|_| rti);
            json!({"index": field("index"), "text": text, "logprobs": null, "finish_reason": field("finish_reason"),
                   "stop_reason": field("stop_reason"), "prompt_token_ids": prompt_ids,
                   "token_ids": if rti { field("token_ids") } else { Value::Null }, "weight_versions": null})
        })
        .into_iter()
        .collect();
    let chunk = chunk_object(&app, &b.req, &b.chunk, choices);
    Ok(ok(&json!({"chunk": chunk, "stream_state": state.to_json()})))
}

fn chunk_object(
    app: &super::super::super::App,
    req: &Map<String, Value>,
    gen: &Map<String, Value>,
    choices: Vec<Value>,
) -> Value {
    let model = req
        .get("model")
        .filter(|m| m.as_str().is_some_and(|m| !m.is_empty()))
        .cloned()
        .unwrap_or_else(|| json!(app.args.served_name()));
    let prompt_tokens = req.get("prompt_tokens").and_then(Value::as_u64);
    json!({"id": gen.get("request_id").cloned().unwrap_or(Value::Null), "object": "text_completion", "created": now_secs(),
           "model": model, "choices": choices, "usage": usage_of(gen, prompt_tokens), "system_fingerprint": null,
           "metrics": null, "kv_transfer_params": null})
}
