//! The Anthropic Messages family's error forms: its error type for an HTTP status, the envelope
//! `{"type":"error","error":{"type","message"}}` (no `param`, no `code`) as a body and as the
//! stream's `error` event.

use bytes::Bytes;
use serde_json::{json, Value};

/// Anthropic's error type for an answer's HTTP status.
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        504 => "timeout_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error envelope.
pub(crate) fn envelope(status: u16, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// A Messages stream's end on an error: the envelope as its `error` event.
pub(crate) fn stream_error(status: u16, message: &str) -> Vec<Bytes> {
    vec![Bytes::from(format!(
        "event: error\ndata: {}\n\n",
        envelope(status, message)
    ))]
}
