//! The fault matrix's clients: one raw HTTP/1.1 exchange per request (nothing retried, nothing
//! hidden by a client library) and its classification — completed, an explicit error (an
//! envelope status, or an in-stream error with the route's end marker), silently truncated,
//! hung past its deadline, lost (accepted, then no answer), or refused (nothing accepted).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::sse;

/// What a client loop sends, in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    ChatStream,
    CompletionsStream,
    ResponsesStream,
    MessagesStream,
}

impl Kind {
    /// Streams the gateway continues when they are cut (docs/resume.md; the Messages and
    /// Responses streams at temperature 0, by replay): each must complete, with the text of an
    /// uninterrupted run.
    pub fn resumable(self) -> bool {
        self != Kind::Chat
    }

    pub const ALL: [Kind; 5] = [
        Kind::Chat,
        Kind::ChatStream,
        Kind::CompletionsStream,
        Kind::ResponsesStream,
        Kind::MessagesStream,
    ];

    fn request(self, model: &str, max_tokens: u32) -> (&'static str, Value) {
        let user = json!([{"role": "user", "content": "Explain tensor parallel inference."}]);
        let off = json!({"enable_thinking": false});
        match self {
            Kind::Chat => (
                "/v1/chat/completions",
                json!({"messages": user, "max_tokens": max_tokens, "ignore_eos": true, "chat_template_kwargs": off}),
            ),
            Kind::ChatStream => (
                "/v1/chat/completions",
                json!({"messages": user, "max_tokens": max_tokens, "ignore_eos": true, "stream": true, "chat_template_kwargs": off}),
            ),
            Kind::CompletionsStream => (
                "/v1/completions",
                json!({"prompt": "Tensor parallel inference", "max_tokens": max_tokens, "ignore_eos": true, "stream": true}),
            ),
            Kind::ResponsesStream => (
                "/v1/responses",
                json!({"input": "Explain tensor parallel inference.", "max_output_tokens": max_tokens, "stream": true,
                       "reasoning": {"effort": "low"}, "temperature": 0}),
            ),
            Kind::MessagesStream => (
                "/v1/messages",
                json!({"model": model, "messages": user, "max_tokens": max_tokens, "stream": true, "temperature": 0}),
            ),
        }
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// A status with its error envelope, or an in-stream error followed by the end marker.
    ExplicitError {
        status: u16,
        message: String,
    },
    /// The answer ended without its end marker and without an error.
    Truncated(String),
    /// No complete answer within the deadline.
    Hung,
    /// The request was accepted, then the connection closed with no answer at all (how: the
    /// write failed, a reset, or a close).
    Lost(&'static str),
    /// The connection was refused: nothing was accepted (the gateway was down).
    Refused,
}

/// Sends one request of `kind` and classifies its end.
pub fn exchange(addr: SocketAddr, kind: Kind, model: &str, max_tokens: u32, deadline: Duration) -> Outcome {
    exchange_text(addr, kind, model, max_tokens, deadline).0
}

/// [`exchange`], with the text a completed stream of a resumable kind carried (its reasoning,
/// content or completion text, concatenated).
pub fn exchange_text(
    addr: SocketAddr,
    kind: Kind,
    model: &str,
    max_tokens: u32,
    deadline: Duration,
) -> (Outcome, Option<String>) {
    let (path, body) = kind.request(model, max_tokens);
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (Outcome::Refused, None);
    };
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body.as_bytes()))
        .is_err()
    {
        return (Outcome::Lost("the request could not be written"), None);
    }
    let until = Instant::now() + deadline;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let mut reset = false;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (Outcome::Hung, None);
        }
        let _ = s.set_read_timeout(Some(left.min(Duration::from_secs(1))));
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => {
                reset = e.kind() == std::io::ErrorKind::ConnectionReset;
                break;
            }
        }
    }
    let outcome = match classify(kind, &raw) {
        Outcome::Lost(_) if reset => Outcome::Lost("reset before any byte of an answer"),
        other => other,
    };
    let text = (outcome == Outcome::Completed && kind.resumable()).then(|| streamed_text(&raw));
    (outcome, text)
}

/// The text of a whole raw stream answer: every event's reasoning, content and completion text.
fn streamed_text(raw: &[u8]) -> String {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = dechunk(&head, &raw[(split + 4).min(raw.len())..]).unwrap_or_default();
    let mut text = String::new();
    for e in sse::events(&body).iter().filter(|e| !sse::is_done(e)) {
        let data = sse::json(e);
        let choice = &data["choices"][0];
        // Chat, completions, Anthropic's text and thinking deltas, Responses' text deltas.
        for part in [
            &choice["delta"]["reasoning"],
            &choice["delta"]["content"],
            &choice["text"],
            &data["delta"]["text"],
            &data["delta"]["thinking"],
            &data["delta"],
        ] {
            text += part.as_str().unwrap_or("");
        }
    }
    text
}

/// The classification of a whole raw answer.
pub fn classify(kind: Kind, raw: &[u8]) -> Outcome {
    if raw.is_empty() {
        return Outcome::Lost("closed before any byte of an answer");
    }
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Outcome::Truncated("no complete response head".into());
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let Some(body) = dechunk(&head, &raw[split + 4..]) else {
        return Outcome::Truncated(format!("HTTP {status}: the body's framing was cut"));
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    if status >= 400 {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let message = v["error"]["message"].as_str().map(str::to_owned);
        return match message {
            Some(message) => Outcome::ExplicitError { status, message },
            None => Outcome::Truncated(format!("HTTP {status} without an envelope: {text}")),
        };
    }
    if kind == Kind::Chat {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        return if v["choices"][0]["message"].is_object() {
            Outcome::Completed
        } else {
            Outcome::Truncated(format!("HTTP {status}: {text}"))
        };
    }
    stream_outcome(kind, status, &text)
}

/// A stream's end: its route's end marker, with or without an in-stream error before it. The
/// events are eventsource-stream's; an event cut before its blank line counts as the last one,
/// so a stream cut inside its end marker still ends with it.
fn stream_outcome(kind: Kind, status: u16, text: &str) -> Outcome {
    let (mut events, cut) = sse::events_and_cut(text.as_bytes());
    events.extend(cut);
    let last = events.last();
    let error = events.iter().find(|e| {
        matches!(e.event.as_str(), "error" | "response.failed")
            || (e.event == sse::UNNAMED && sse::json(e)["error"].is_object())
    });
    let named = |names: &[&str]| last.is_some_and(|e| names.contains(&e.event.as_str()));
    let ended = match kind {
        Kind::ChatStream | Kind::CompletionsStream => last.is_some_and(sse::is_done),
        Kind::ResponsesStream => named(&["response.completed", "response.incomplete", "response.failed", "error"]),
        Kind::MessagesStream => named(&["message_stop", "error"]),
        Kind::Chat => false,
    };
    match (ended, error) {
        (true, Some(e)) => Outcome::ExplicitError {
            status,
            message: shown(e).chars().take(300).collect(),
        },
        (true, None) => Outcome::Completed,
        (false, _) => Outcome::Truncated(format!(
            "{kind:?} ended with {:?}",
            last.map(shown)
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect::<String>()
        )),
    }
}

/// An event as a report shows it: its name and its data.
fn shown(e: &sse::Event) -> String {
    format!("event: {}, data: {}", e.event, e.data)
}

/// The body, de-chunked when the head says chunked; `None` when the chunked framing was cut.
fn dechunk(head: &str, mut rest: &[u8]) -> Option<Vec<u8>> {
    if !head.contains("transfer-encoding: chunked") {
        return Some(rest.to_vec());
    }
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if rest.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(body: &str, terminated: bool) -> Vec<u8> {
        let mut raw =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        raw.extend(format!("{:x}\r\n{body}\r\n", body.len()).into_bytes());
        if terminated {
            raw.extend(b"0\r\n\r\n");
        }
        raw
    }

    #[test]
    fn every_end_is_told_apart() {
        let done = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(classify(Kind::ChatStream, &chunked(done, true)), Outcome::Completed);
        let cut = chunked(done, false);
        assert!(
            matches!(classify(Kind::ChatStream, &cut), Outcome::Truncated(_)),
            "framing cut"
        );
        let no_done = chunked("data: {\"choices\":[]}\n\n", true);
        assert!(matches!(classify(Kind::ChatStream, &no_done), Outcome::Truncated(_)));
        let err = chunked("data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n", true);
        assert!(matches!(
            classify(Kind::ChatStream, &err),
            Outcome::ExplicitError { status: 200, .. }
        ));
        let anthropic = chunked("event: message_start\ndata: {}\n\nevent: error\ndata: {}\n\n", true);
        assert!(matches!(
            classify(Kind::MessagesStream, &anthropic),
            Outcome::ExplicitError { .. }
        ));
        let envelope =
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 27\r\n\r\n{\"error\":{\"message\":\"no\"}}";
        assert!(matches!(
            classify(Kind::Chat, envelope),
            Outcome::ExplicitError { status: 503, .. }
        ));
        assert!(matches!(classify(Kind::Chat, b""), Outcome::Lost(_)));
        let bare = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n";
        assert!(
            matches!(classify(Kind::Chat, bare), Outcome::Truncated(_)),
            "an error without envelope"
        );
    }
}
