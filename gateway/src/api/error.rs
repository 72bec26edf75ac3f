//! `GatewayError`: every error the gateway itself makes, and the one place they become HTTP —
//! vLLM 0.33's envelope `{"error":{"message","type","param","code"}}` plus `Retry-After` where a
//! client should come back.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::family::{Family, Framing};
use crate::api::{anthropic, openai};
use crate::observe::{Rejection, StreamEnd};

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<&'static str>,
    },
    /// More sequences at once than the model runs (`normalize::Sequences::refusal` says which).
    #[error("{message}")]
    TooManySequences { message: String, param: &'static str },
    /// Admission's own refusal of more permits than its capacity, before the request's
    /// sequences name themselves (`Sequences::refusal`).
    #[error("{asked} sequences at once are more than the model runs at once (MAX_NUM_SEQS={capacity})")]
    OverCapacity { asked: u32, capacity: u32 },
    #[error("1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed")]
    UnsupportedMediaType,
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("The model `{model}` does not exist. Valid aliases: {valid}.")]
    ModelNotFound { model: String, valid: String },
    #[error("request body exceeds {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("missing or invalid API key")]
    Unauthorized,
    #[error("missing or invalid admin token (ADMIN_TOKEN)")]
    AdminUnauthorized,
    #[error("{0}")]
    Forbidden(&'static str),
    /// The console's sign-in or session (`control::sessions`): a wrong token, a cookie that
    /// names no live session.
    #[error("{0}")]
    SignIn(&'static str),
    /// Too many failed sign-ins (or admin tokens) from one address.
    #[error("too many failed sign-ins from this address; retry in {}s", retry_after.as_secs().max(1))]
    SignInThrottled { retry_after: Duration },
    #[error("rate limit of {limit} requests per minute reached; retry in {}s", retry_after.as_secs().max(1))]
    RateLimited { limit: u32, retry_after: Duration },
    #[error("this API key's {limit} quota ({quota}) is used up; retry in {}s", retry_after.as_secs().max(1))]
    QuotaExceeded {
        limit: &'static str,
        quota: u64,
        retry_after: Duration,
    },
    #[error("the queue for a generation slot is full ({depth} waiting); retry later")]
    QueueFull { depth: usize },
    #[error("the queue for a generation slot holds its byte budget (QUEUE_MAX_BYTES={limit}); retry later")]
    QueueBytesFull { limit: usize },
    #[error("no generation slot became free within {}s; retry later", waited.as_secs())]
    QueueTimeout { waited: Duration },
    #[error("the prompt's prefill needs about {need_gib:.2} GiB of the nodes' memory and {room_gib:.2} GiB is free above MEM_GUARD_GIB (the memory guard, PREFILL_BYTES_PER_TOKEN); it waited {}s for the memory to come back; retry later or send a shorter prompt", waited.as_secs())]
    MemoryHeld {
        waited: Duration,
        need_gib: f64,
        room_gib: f64,
    },
    #[error("the model is restarting; retry later")]
    Restarting,
    /// MODELS: the model asked for is not the loaded one, and this request does not load it
    /// (SWAP_POLICY=manual, or a tokenizer route: it runs with its model's ranks).
    #[error("the model `{model}` is not loaded ({loaded} is): {hint}; retry later")]
    ModelNotLoaded {
        model: String,
        loaded: String,
        hint: String,
    },
    /// MODELS: the swap this request waited for did not happen or did not finish.
    #[error("the model `{model}` could not be loaded: {reason}; retry later")]
    SwapFailed { model: String, reason: String },
    /// An API key limited to some models (`models=` in API_KEYS_FILE) asked for another.
    #[error("this API key may not use the model `{model}` (its `models=` setting allows: {allowed})")]
    ModelForbidden { model: String, allowed: String },
    #[error("the model is not running: {0}")]
    NotRunning(String),
    #[error("upstream vLLM at {upstream} is unreachable: {detail}")]
    UpstreamUnreachable { upstream: String, detail: String },
    #[error("upstream vLLM did not answer within {}s", after.as_secs())]
    UpstreamTimeout { after: Duration },
    #[error("no route for {0}")]
    NotFound(String),
    /// A stored response that does not exist, expired, or is another API key's (docs/store.md):
    /// vLLM's own words for an unknown id.
    #[error("Response with id '{0}' not found.")]
    ResponseNotFound(String),
    /// The gateway's store could not be read or written.
    #[error("the response store failed: {0}")]
    StoreFailed(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// An operator's command that conflicts with one under way.
    #[error("{0}")]
    Conflict(String),
    /// A request hyper could not parse (it answers these itself, with an empty body).
    #[error("{}", unparseable_message(*status))]
    UnparseableHttp { status: StatusCode },
    #[error("the request body did not arrive within {}s (BODY_TIMEOUT; {received} bytes came); the connection is closed", after.as_secs())]
    BodyTimeout { after: Duration, received: usize },
    #[error("the request head did not arrive within {}s (HEADER_READ_TIMEOUT)", after.as_secs())]
    HeaderTimeout { after: Duration },
    /// Plain HTTP sent to the port while it serves HTTPS (TLS_CERT).
    #[error("this port serves HTTPS (TLS): send the request to https:// instead of http://")]
    PlainHttpToTls,
    #[error("the gateway has {max} connections open (MAX_CONNECTIONS); retry later")]
    TooManyConnections { max: usize },
    #[error("no response from the model within {}s (FIRST_TOKEN_TIMEOUT); the request was aborted", after.as_secs())]
    FirstTokenTimeout { after: Duration },
    #[error("the model stopped producing tokens for {}s (STREAM_IDLE_TIMEOUT); the request was aborted", after.as_secs())]
    StreamIdle { after: Duration },
    #[error("the connection to the model broke mid-stream")]
    UpstreamBroke,
    #[error("the model's stream ended before it finished")]
    UpstreamTruncated,
    /// Why a cut stream's continuation failed (docs/resume.md), until the relay names the cut.
    #[error("the answer could not be continued: {0}")]
    NotContinued(String),
    /// A cut stream that could not be continued: the cut as it would have ended the stream,
    /// and why the continuation failed.
    #[error("{cut}; the answer could not be continued: {detail}")]
    ResumeFailed { cut: Box<GatewayError>, detail: String },
    #[error("request_crashed_engine: {} (request id {request_id})", match refused { Some(id) => format!("two requests with this body were quarantined for losing the model's engine; it is refused until QUARANTINE_TTL passes or an operator runs `sparkgate quarantine release {id}`"), None => "the model's engine was lost under this request (twice, or at once while it ran alone); it is not sent again".to_owned() })]
    RequestCrashedEngine {
        request_id: String,
        /// Refused at arrival: the quarantined body's id.
        refused: Option<String>,
    },
    #[error("the gateway is shutting down; retry later")]
    ShuttingDown,
    #[error("the gateway shut down: the request was still running after DRAIN_TIMEOUT={}s", drain.as_secs())]
    DrainTimeout { drain: Duration },
    /// A handler panicked: the request ends here, the gateway keeps serving.
    #[error("the gateway failed on this request (an internal error, logged); retry it")]
    Internal,
}

fn unparseable_message(status: StatusCode) -> &'static str {
    match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "the request's headers are too large",
        StatusCode::URI_TOO_LONG => "the request's URI is too long",
        _ => "the request could not be parsed as HTTP",
    }
}

impl GatewayError {
    pub fn bad_request(message: impl Into<String>, param: &'static str) -> Self {
        GatewayError::BadRequest {
            message: message.into(),
            param: Some(param),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest { .. }
            | GatewayError::TooManySequences { .. }
            | GatewayError::OverCapacity { .. }
            | GatewayError::RequestCrashedEngine { .. }
            | GatewayError::UnsupportedMediaType
            | GatewayError::InvalidJson(_) => StatusCode::BAD_REQUEST,
            GatewayError::ModelNotFound { .. } | GatewayError::NotFound(_) | GatewayError::ResponseNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            GatewayError::StoreFailed(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::Unauthorized | GatewayError::AdminUnauthorized | GatewayError::SignIn(_) => {
                StatusCode::UNAUTHORIZED
            }
            GatewayError::Forbidden(_) | GatewayError::ModelForbidden { .. } => StatusCode::FORBIDDEN,
            GatewayError::RateLimited { .. }
            | GatewayError::SignInThrottled { .. }
            | GatewayError::QuotaExceeded { .. }
            | GatewayError::QueueFull { .. }
            | GatewayError::QueueBytesFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::QueueTimeout { .. }
            | GatewayError::MemoryHeld { .. }
            | GatewayError::Restarting
            | GatewayError::ModelNotLoaded { .. }
            | GatewayError::SwapFailed { .. }
            | GatewayError::NotRunning(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::Conflict(_) => StatusCode::CONFLICT,
            GatewayError::UnparseableHttp { status } => *status,
            GatewayError::PlainHttpToTls => StatusCode::BAD_REQUEST,
            GatewayError::HeaderTimeout { .. } | GatewayError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            GatewayError::TooManyConnections { .. }
            | GatewayError::ShuttingDown
            | GatewayError::DrainTimeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::FirstTokenTimeout { .. } | GatewayError::StreamIdle { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::UpstreamBroke | GatewayError::UpstreamTruncated | GatewayError::NotContinued(_) => {
                StatusCode::BAD_GATEWAY
            }
            GatewayError::ResumeFailed { cut, .. } => cut.status(),
            GatewayError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// `error.type`: vLLM's names for request errors, the HTTP phrase for the rest (as vLLM
    /// does for its own 503).
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayError::BadRequest { .. }
            | GatewayError::TooManySequences { .. }
            | GatewayError::OverCapacity { .. }
            | GatewayError::RequestCrashedEngine { .. } => "BadRequestError",
            GatewayError::UnsupportedMediaType | GatewayError::InvalidJson(_) => "Bad Request",
            GatewayError::ModelNotFound { .. } => "NotFoundError",
            GatewayError::ResponseNotFound(_) => "invalid_request_error",
            GatewayError::ResumeFailed { cut, .. } => cut.kind(),
            other => other.status().canonical_reason().unwrap_or("Error"),
        }
    }

    pub fn param(&self) -> Option<&'static str> {
        match self {
            GatewayError::BadRequest { param, .. } => *param,
            GatewayError::TooManySequences { param, .. } => Some(param),
            GatewayError::OverCapacity { .. } => Some("n"),
            GatewayError::ModelNotFound { .. } => Some("model"),
            GatewayError::ResponseNotFound(_) => Some("response_id"),
            GatewayError::InvalidJson(_) => Some("body"),
            _ => None,
        }
    }

    /// Seconds a client should wait before retrying, for the errors that invite a retry. Kept
    /// at or under 120 s, which the OpenAI SDK honours.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            GatewayError::RateLimited { retry_after, .. }
            | GatewayError::QuotaExceeded { retry_after, .. }
            | GatewayError::SignInThrottled { retry_after } => Some(*retry_after),
            GatewayError::QueueFull { .. } | GatewayError::QueueBytesFull { .. } => Some(Duration::from_secs(2)),
            GatewayError::TooManyConnections { .. } => Some(Duration::from_secs(1)),
            GatewayError::ShuttingDown | GatewayError::DrainTimeout { .. } => Some(Duration::from_secs(5)),
            GatewayError::QueueTimeout { .. } | GatewayError::MemoryHeld { .. } => Some(Duration::from_secs(5)),
            GatewayError::Restarting => Some(Duration::from_secs(10)),
            // A swap takes minutes on the pair: ask again in half a minute.
            GatewayError::ModelNotLoaded { .. } | GatewayError::SwapFailed { .. } => Some(Duration::from_secs(30)),
            _ => None,
        }
    }

    /// Why admission refused it, for `sparkgate_admission_rejections_total`; `None` for an
    /// error that is not an admission refusal.
    pub(crate) fn rejection(&self) -> Option<Rejection> {
        Some(match self {
            GatewayError::RateLimited { .. } => Rejection::RateLimit,
            GatewayError::QuotaExceeded { .. } => Rejection::Quota,
            GatewayError::QueueFull { .. } => Rejection::QueueFull,
            GatewayError::QueueBytesFull { .. } => Rejection::QueueBytes,
            GatewayError::QueueTimeout { .. } => Rejection::QueueTimeout,
            GatewayError::MemoryHeld { .. } => Rejection::Memory,
            GatewayError::Restarting => Rejection::Restarting,
            GatewayError::NotRunning(_) => Rejection::NotRunning,
            GatewayError::ModelNotLoaded { .. } | GatewayError::SwapFailed { .. } => Rejection::ModelNotLoaded,
            GatewayError::ModelForbidden { .. } => Rejection::ModelForbidden,
            GatewayError::ShuttingDown => Rejection::ShuttingDown,
            GatewayError::TooManySequences { .. } | GatewayError::OverCapacity { .. } => Rejection::TooManySequences,
            _ => return None,
        })
    }
}

impl GatewayError {
    /// The error as its route's family answers it: vLLM's OpenAI envelope, or Anthropic's
    /// `{"type":"error","error":{"type","message"}}` on `/v1/messages`.
    pub(crate) fn render(self, family: Family) -> Response {
        // vLLM answers a body it cannot read as a request (media type, JSON) with FastAPI's
        // validation error, in its OpenAI envelope, on the Anthropic route too.
        let family = match self {
            GatewayError::UnsupportedMediaType | GatewayError::InvalidJson(_) => Family::OpenAi,
            _ => family,
        };
        match family {
            Family::OpenAi => self.into_response(),
            Family::Anthropic => {
                let body = anthropic::envelope(self.status().as_u16(), &self.to_string());
                self.respond(body)
            }
        }
    }

    fn respond(self, body: serde_json::Value) -> Response {
        let mut resp = (self.status(), [("content-type", "application/json")], body.to_string()).into_response();
        let h = resp.headers_mut();
        for (name, value) in self.retry_headers() {
            h.insert(name, HeaderValue::from(value));
        }
        if let GatewayError::BodyTimeout { .. } = self {
            // The rest of the body is never read: the connection cannot carry another request.
            h.insert("connection", HeaderValue::from_static("close"));
        }
        if let GatewayError::RateLimited { limit, retry_after } = self {
            rate_limit_headers(h, limit, 0);
            let reset = format!("{:.3}s", retry_after.as_secs_f64());
            h.insert(
                "x-ratelimit-reset-requests",
                HeaderValue::from_str(&reset).expect("ascii"),
            );
        }
        resp
    }

    /// `Retry-After` (whole seconds, at least 1) and `retry-after-ms`, for the errors that have one.
    fn retry_headers(&self) -> impl Iterator<Item = (&'static str, u64)> {
        self.retry_after().into_iter().flat_map(|after| {
            let secs = after.as_secs_f64().ceil().clamp(1.0, 120.0) as u64;
            [
                ("retry-after", secs),
                ("retry-after-ms", after.as_millis().clamp(1, 120_000) as u64),
            ]
        })
    }

    /// Why a stream this error ended was cut, as the logs and `sparkgate_stream_errors_total`
    /// name it.
    pub(crate) fn stream_end(&self) -> StreamEnd {
        match self {
            GatewayError::FirstTokenTimeout { .. } => StreamEnd::FirstTokenTimeout,
            GatewayError::StreamIdle { .. } => StreamEnd::IdleTimeout,
            GatewayError::UpstreamBroke | GatewayError::NotContinued(_) => StreamEnd::UpstreamBroken,
            GatewayError::ResumeFailed { cut, .. } => cut.stream_end(),
            GatewayError::UpstreamTruncated => StreamEnd::UpstreamTruncated,
            GatewayError::DrainTimeout { .. } | GatewayError::ShuttingDown => StreamEnd::DrainTimeout,
            _ => StreamEnd::GatewayError,
        }
    }

    /// The error as the last event of a stream in `framing`: OpenAI's error chunk then
    /// `[DONE]`, or `event: error` (Responses; Anthropic with its envelope).
    pub(crate) fn stream_event(&self, framing: Framing) -> Vec<bytes::Bytes> {
        let message = self.to_string();
        match framing {
            Framing::Responses => openai::responses_stream_error(&message, self.kind()),
            Framing::Anthropic => anthropic::stream_error(self.status().as_u16(), &message),
            Framing::Chat => openai::chat_stream_error(&message, self.kind(), self.status().as_u16()),
        }
    }

    fn openai_body(&self) -> serde_json::Value {
        openai::envelope(&self.to_string(), self.kind(), self.param(), self.status().as_u16())
    }

    /// The whole HTTP/1.1 answer, for the connection loop's errors that come before (or instead
    /// of) a request hyper could hand to the router: the same envelope, then the connection closes.
    pub(crate) fn to_http1(&self) -> Vec<u8> {
        use std::fmt::Write as _;
        let status = self.status();
        let body = self.openai_body().to_string();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        );
        for (name, value) in self.retry_headers() {
            let _ = write!(head, "{name}: {value}\r\n");
        }
        head.push_str("\r\n");
        head.push_str(&body);
        head.into_bytes()
    }
}

/// The rate limit's headers (OpenAI's names): on an admitted response (`edge::Allowance`) and on
/// the 429 of a refused one.
pub(crate) fn rate_limit_headers(h: &mut axum::http::HeaderMap, limit: u32, remaining: u32) {
    h.insert("x-ratelimit-limit-requests", HeaderValue::from(limit));
    h.insert("x-ratelimit-remaining-requests", HeaderValue::from(remaining));
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let body = self.openai_body();
        self.respond(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(e: GatewayError) -> (StatusCode, Option<String>, serde_json::Value) {
        let r = e.into_response();
        let status = r.status();
        let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = rt.block_on(axum::body::to_bytes(r.into_body(), 1 << 20)).unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn every_variant_maps_to_the_envelope() {
        /// (error, status, type, param, Retry-After)
        type Case = (
            GatewayError,
            u16,
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                GatewayError::bad_request("x", "reasoning_effort"),
                400,
                "BadRequestError",
                Some("reasoning_effort"),
                None,
            ),
            (GatewayError::UnsupportedMediaType, 400, "Bad Request", None, None),
            (
                GatewayError::InvalidJson("eof".into()),
                400,
                "Bad Request",
                Some("body"),
                None,
            ),
            (
                GatewayError::ModelNotFound {
                    model: "m".into(),
                    valid: "a, b".into(),
                },
                404,
                "NotFoundError",
                Some("model"),
                None,
            ),
            (
                GatewayError::PayloadTooLarge { limit: 10 },
                413,
                "Payload Too Large",
                None,
                None,
            ),
            (GatewayError::Unauthorized, 401, "Unauthorized", None, None),
            (GatewayError::AdminUnauthorized, 401, "Unauthorized", None, None),
            (GatewayError::Forbidden("no"), 403, "Forbidden", None, None),
            (GatewayError::SignIn("no"), 401, "Unauthorized", None, None),
            (
                GatewayError::SignInThrottled {
                    retry_after: Duration::from_secs(7),
                },
                429,
                "Too Many Requests",
                None,
                Some("7"),
            ),
            (
                GatewayError::RateLimited {
                    limit: 1,
                    retry_after: Duration::from_millis(300),
                },
                429,
                "Too Many Requests",
                None,
                Some("1"),
            ),
            (
                GatewayError::QueueFull { depth: 3 },
                429,
                "Too Many Requests",
                None,
                Some("2"),
            ),
            (
                GatewayError::QueueTimeout {
                    waited: Duration::from_secs(9),
                },
                503,
                "Service Unavailable",
                None,
                Some("5"),
            ),
            (GatewayError::Restarting, 503, "Service Unavailable", None, Some("10")),
            (
                GatewayError::NotRunning("stopped".into()),
                503,
                "Service Unavailable",
                None,
                None,
            ),
            (
                GatewayError::UpstreamUnreachable {
                    upstream: "u".into(),
                    detail: "refused".into(),
                },
                502,
                "Bad Gateway",
                None,
                None,
            ),
            (
                GatewayError::UpstreamTimeout {
                    after: Duration::from_secs(1),
                },
                504,
                "Gateway Timeout",
                None,
                None,
            ),
            (GatewayError::NotFound("/x".into()), 404, "Not Found", None, None),
            (GatewayError::MethodNotAllowed, 405, "Method Not Allowed", None, None),
            (
                GatewayError::UnparseableHttp {
                    status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                },
                431,
                "Request Header Fields Too Large",
                None,
                None,
            ),
            (
                GatewayError::HeaderTimeout {
                    after: Duration::from_secs(30),
                },
                408,
                "Request Timeout",
                None,
                None,
            ),
            (
                GatewayError::TooManyConnections { max: 9 },
                503,
                "Service Unavailable",
                None,
                Some("1"),
            ),
        ];
        for (err, status, kind, param, retry) in cases {
            let message = err.to_string();
            let (s, r, b) = body(err);
            assert_eq!(s.as_u16(), status);
            assert_eq!(b["error"]["type"], kind);
            assert_eq!(b["error"]["param"].as_str(), param);
            assert_eq!(b["error"]["code"], status);
            assert_eq!(b["error"]["message"], message);
            assert_eq!(r.as_deref(), retry);
        }
    }

    #[test]
    fn the_raw_answer_carries_the_same_envelope_and_headers() {
        let err = GatewayError::TooManyConnections { max: 9 };
        let raw = String::from_utf8(err.to_http1()).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{head}");
        assert!(
            head.contains("\r\nconnection: close") && head.contains("\r\nretry-after: 1"),
            "{head}"
        );
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let (_, _, expected) = self::body(GatewayError::TooManyConnections { max: 9 });
        assert_eq!(serde_json::from_str::<serde_json::Value>(body).unwrap(), expected);
    }

    #[test]
    fn model_not_found_reads_like_vllm() {
        let (_, _, b) = body(GatewayError::ModelNotFound {
            model: "gpt-4".into(),
            valid: "M".into(),
        });
        assert_eq!(
            b["error"]["message"],
            "The model `gpt-4` does not exist. Valid aliases: M."
        );
    }
}
