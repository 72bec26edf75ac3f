//! The OpenAI family's error forms as vLLM 0.33 writes them: the envelope
//! `{"error":{"message","type","param","code"}}` (an HTTP body, and a chat stream's last chunk
//! before `[DONE]`) and the Responses API's `error` event; and `/v1/models`' list as vLLM
//! writes it, for the gateway that answers it itself (MODELS).

use bytes::Bytes;
use serde_json::{json, Value};

/// vLLM's error envelope.
pub(crate) fn envelope(message: &str, kind: &str, param: Option<&str>, code: u16) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// A chat or completions stream's end on an error: the envelope as a chunk, then `[DONE]`
/// (the stream's own end marker, which clients wait for).
pub(crate) fn chat_stream_error(message: &str, kind: &str, code: u16) -> Vec<Bytes> {
    let e = envelope(message, kind, None, code);
    vec![
        Bytes::from(format!("data: {e}\n\n")),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ]
}

/// A Responses stream's end on an error: its `error` event (the stream ends with the
/// connection).
pub(crate) fn responses_stream_error(message: &str, kind: &str) -> Vec<Bytes> {
    let e = json!({"type": "error", "code": kind, "message": message, "param": null});
    vec![Bytes::from(format!("event: error\ndata: {e}\n\n"))]
}

/// One model as `/v1/models` lists it: its id (the served name), `root` (the model path
/// `vllm serve` is given) and context limit.
#[derive(Debug, Clone)]
pub(crate) struct ModelCard {
    pub(crate) id: String,
    pub(crate) root: String,
    pub(crate) max_model_len: u32,
}

/// vLLM's `/v1/models` answer for `cards`: each `ModelCard` with `created` now and a fresh
/// permission id, as vLLM builds them per answer.
pub(crate) fn model_list<'a>(cards: impl Iterator<Item = &'a ModelCard>, now: u64) -> Value {
    let data: Vec<Value> = cards
        .enumerate()
        .map(|(i, c)| {
            json!({
                "id": c.id, "object": "model", "created": now, "owned_by": "vllm",
                "root": c.root, "parent": null, "max_model_len": c.max_model_len,
                "permission": [{
                    "id": format!("modelperm-{:016x}{:016x}", now ^ 0x9e37_79b9_7f4a_7c15, i as u64 + 1),
                    "object": "model_permission", "created": now, "allow_create_engine": false,
                    "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
                    "allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": null,
                    "is_blocking": false
                }]
            })
        })
        .collect();
    json!({"object": "list", "data": data})
}
