//! The OpenAI family's error forms as vLLM 0.33 writes them: the envelope
//! `{"error":{"message","type","param","code"}}` (an HTTP body, and a chat stream's last chunk
//! before `[DONE]`) and the Responses API's `error` event.

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
