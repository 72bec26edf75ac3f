//! vLLM 0.33's HTTP surface: routes, the error envelope, API-key scope, request ids and the
//! connection handling (5 s keep-alive idle close) of its uvicorn server.

mod before;
mod chat;
mod chat_stream;
mod completions;
mod dispatch;
mod generate;
mod logprobs;
mod messages;
mod pydantic;
mod request;
mod responses;
mod scale_out;
mod schema;
mod serve;
mod validate;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};

use super::args::ServeArgs;
use super::count::{self, ChatPrompt};
use super::engine::Engine;
use super::metrics::Metrics;
use super::text::Template;
use super::{prompt, vocab};

pub(crate) use serve::serve;

/// Everything a handler needs.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) args: ServeArgs,
    pub(crate) template: Template,
    pub(crate) engine: Arc<Engine>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) created: u64,
    pub(crate) fingerprint: String,
    pub(crate) prefix: crate::sim::prefix::PrefixCache,
}

pub(crate) type Shared = Arc<App>;

/// An error answer in vLLM's envelope `{"error":{"message","type","param","code"}}`; the one
/// place the simulator turns failures into HTTP.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    /// Raised once a stream's answer has begun (the engine's input checks): sent as an SSE
    /// error event and `[DONE]` under 200.
    in_stream: bool,
}

impl ApiError {
    /// The same failure raised inside a stream when `stream` holds.
    pub(crate) fn in_stream_if(mut self, stream: bool) -> ApiError {
        self.in_stream = stream;
        self
    }

    /// The same failure in Anthropic's envelope (`/v1/messages`).
    pub(crate) fn into_anthropic(self) -> Response {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            500 => "api_error",
            503 | 529 => "overloaded_error",
            _ => "invalid_request_error",
        };
        json_response(
            self.status,
            &json!({"type": "error", "error": {"type": kind, "message": self.message}}),
        )
    }

    /// A pydantic (`Bad Request`) failure: vLLM answers those in its own envelope on every route.
    pub(crate) fn is_validation(&self) -> bool {
        self.kind == "Bad Request"
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status.as_u16()}});
        if self.in_stream {
            let text = format!("data: {body}\n\ndata: [DONE]\n\n");
            return (
                StatusCode::OK,
                [("content-type", "text/event-stream; charset=utf-8")],
                text,
            )
                .into_response();
        }
        json_response(self.status, &body)
    }
}

/// vLLM's error envelope with the given status, type and param.
pub(crate) fn error(status: StatusCode, kind: &'static str, message: &str, param: Option<&str>) -> ApiError {
    ApiError {
        status,
        kind,
        message: message.to_owned(),
        param: param.map(str::to_owned),
        in_stream: false,
    }
}

/// vLLM's 500 for a request the engine failed (a lost rank, an injected fault).
pub(crate) fn internal_error(message: &str) -> ApiError {
    error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", message, None)
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [("content-type", "application/json")], body.to_string()).into_response()
}

/// The request body failed FastAPI/pydantic validation: 400 `Bad Request`.
pub(crate) fn validation_error(detail: &str, param: Option<&str>) -> ApiError {
    validation_error_raw(&format!("1 validation error:\n  {detail}"), param)
}

/// 400 `Bad Request` with a ready message (`pydantic` builds it).
pub(crate) fn validation_error_raw(message: &str, param: Option<&str>) -> ApiError {
    error(StatusCode::BAD_REQUEST, "Bad Request", message, param)
}

/// A serving check's refusal (vLLM's `VLLMValidationError`): 400 `BadRequestError`, the message
/// ending in `(parameter=X, value=Y)` when they are known.
pub(crate) fn bad_request(message: &str, param: Option<&str>, value: Option<&str>) -> ApiError {
    let extras: Vec<String> = param
        .map(|p| format!("parameter={p}"))
        .into_iter()
        .chain(value.map(|v| format!("value={v}")))
        .collect();
    let message = if extras.is_empty() {
        message.to_owned()
    } else {
        format!("{message} ({})", extras.join(", "))
    };
    error(StatusCode::BAD_REQUEST, "BadRequestError", &message, param)
}

/// The routes' fixed paths, for Starlette's `redirect_slashes`.
const PATHS: &[&str] = &[
    "/health",
    "/ping",
    "/version",
    "/load",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/chat/completions/batch",
    "/invocations",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/tokenize",
    "/v1/decisions",
    "/v1/systemone",
    "/generative_scoring",
    "/detokenize",
];

/// No route: Starlette's router first tries the path with its trailing slash removed (or
/// added) and answers 307 to it when a route, of any method, takes that; else FastAPI's 404.
async fn not_found(uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    let other = match path.trim_end_matches('/') {
        p if p.len() < path.len() && !p.is_empty() => p.to_owned(),
        _ => format!("{path}/"),
    };
    if PATHS.contains(&other.as_str()) || scale_out::PATHS.contains(&other.as_str()) {
        let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        let location = format!("http://{host}{other}{query}");
        return (StatusCode::TEMPORARY_REDIRECT, [("location", location)]).into_response();
    }
    json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"}))
}

/// What `/version` says: the release played, or SIM_REPORTED_VERSION (a test's stand-in for a
/// release sparkgate does not know, with the behaviour of the one played).
fn reported_version() -> String {
    std::env::var("SIM_REPORTED_VERSION").unwrap_or_else(|_| crate::sim::release().version().to_owned())
}

pub(crate) fn router(app: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ping", get(health).post(health))
        .route(
            "/version",
            get(|| async { json_response(StatusCode::OK, &json!({"version": reported_version()})) }),
        )
        .route(
            "/load",
            get(|| async { json_response(StatusCode::OK, &json!({"server_load": 0})) }),
        )
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_stream::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/chat/completions/batch", post(dispatch::batch))
        .route("/invocations", post(dispatch::invocations))
        .route("/v1/messages", post(messages::handle))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::handle))
        .route("/tokenize", post(tokenize))
        .route("/v1/responses/{id}", get(responses::get_stored))
        .route("/v1/responses/{id}/cancel", post(responses::get_stored))
        .route(
            "/v1/decisions",
            post(|h, b| dispatch::unsimulated(h, b, &["input", "questions"])),
        )
        .route(
            "/v1/systemone",
            post(|h, b| dispatch::unsimulated(h, b, &["state", "questions"])),
        )
        .route(
            "/generative_scoring",
            post(|h, b| dispatch::unsimulated(h, b, &["query", "items", "label_token_ids"])),
        )
        .route("/detokenize", post(detokenize))
        .merge(scale_out::routes(app.args.enable_scale_out))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            json_response(StatusCode::METHOD_NOT_ALLOWED, &json!({"detail": "Method Not Allowed"}))
        })
        // vLLM has no body limit below its context check.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(app)
}

/// 200 with an empty body while the engine lives; 503, empty, once it is dead.
async fn health(State(app): State<Shared>) -> Response {
    if app.engine.is_dead() {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

async fn metrics(State(app): State<Shared>) -> Response {
    (
        [("content-type", "text/plain; version=1.0.0; charset=utf-8")],
        app.metrics.render(),
    )
        .into_response()
}

async fn models(State(app): State<Shared>) -> Response {
    let a = &app.args;
    let data: Vec<Value> = a
        .served_model_names
        .iter()
        .map(|name| {
            json!({
                "id": name, "object": "model", "created": app.created, "owned_by": "vllm", "root": a.model,
                "parent": null, "max_model_len": a.max_model_len,
                "permission": [{
                    "id": format!("modelperm-{}", request::random_hex(32)), "object": "model_permission",
                    "created": app.created, "allow_create_engine": false, "allow_sampling": true,
                    "allow_logprobs": true, "allow_search_indices": false, "allow_view": true,
                    "allow_fine_tuning": false, "organization": "*", "group": null, "is_blocking": false
                }]
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn tokenize(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let mut req = request::json_object(&headers, &body)?;
    schema::check_body("/tokenize", &mut req)?;
    request::check_model(&app, &req)?;
    let tokens = match (req.get("prompt"), req.get("messages")) {
        (Some(Value::String(p)), _) => vocab::prompt_ids(p, count::text_ids(app.template, p).len()),
        (_, Some(Value::Array(messages))) => {
            let rendering = app
                .template
                .render(&request::template_kwargs(&app, &req).unwrap_or_default());
            let tools = req.get("tools").and_then(Value::as_array).map(Vec::as_slice);
            let text = prompt::render(messages, tools, req.get("tool_choice"), &rendering, app.template);
            // Counted as the chat route counts the same conversation.
            let (add_generation_prompt, continue_final) = ChatPrompt::endings(&req);
            let counted = ChatPrompt {
                messages,
                tools,
                rendering: &rendering,
                add_generation_prompt,
                continue_final,
            }
            .ids(app.template);
            vocab::prompt_ids(&text, counted.len())
        }
        // The body is a union of the prompt and the chat forms: both report their field.
        _ => {
            return Err(pydantic::to_error(&[
                pydantic::missing("prompt", &req),
                pydantic::missing("messages", &req),
            ]))
        }
    };
    let strs = match req.get("return_token_strs") {
        Some(Value::Bool(true)) => json!(tokens
            .iter()
            .map(|t| vocab::detokenize(&[u64::from(*t)]).unwrap_or_default())
            .collect::<Vec<_>>()),
        _ => Value::Null,
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"count": tokens.len(), "max_model_len": app.args.max_model_len, "tokens": tokens, "token_strs": strs}),
    ))
}

async fn detokenize(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let mut req = request::json_object(&headers, &body)?;
    schema::check_body("/detokenize", &mut req)?;
    request::check_model(&app, &req)?;
    let ids: Option<Vec<u64>> = req
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect());
    match ids.and_then(|ids| vocab::detokenize(&ids)) {
        Some(prompt) => Ok(json_response(StatusCode::OK, &json!({"prompt": prompt}))),
        None => Err(error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "Token id out of vocabulary",
            Some("tokens"),
        )),
    }
}
