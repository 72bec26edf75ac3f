//! vLLM's scale-out routes (`vllm serve --enable-scale-out`): `/render` turns a chat or
//! completions request into the token ids and sampling parameters of a `GenerateRequest`,
//! `/inference/v1/generate` runs token ids through the engine and answers token ids, and
//! `/derender` turns one generated chunk (with the stream state the client carries) back into
//! a chat or completions chunk. Without the flag every one of their paths answers 403, as
//! vLLM registers them.

mod derender;
mod render;
mod tokens;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use super::{error, Shared};
use crate::sim::changes::{exclude_null, Change};

/// Every path the scale-out routers register (POST only).
pub(crate) const PATHS: &[&str] = &[
    "/v1/chat/completions/render",
    "/v1/messages/render",
    "/v1/completions/render",
    "/v1/responses/render",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
    "/inference/v1/generate",
    "/inference/v1/abort_requests",
];

const DISABLED: &str = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.";

/// The scale-out routes: served with `--enable-scale-out`, else each path's 403.
pub(crate) fn routes(enabled: bool) -> Router<Shared> {
    if !enabled {
        return PATHS.iter().fold(Router::new(), |r, p| {
            r.route(
                p,
                post(|| async {
                    error(StatusCode::FORBIDDEN, "PermissionDeniedError", DISABLED, None).into_response()
                }),
            )
        });
    }
    Router::new()
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/messages/render", post(render::messages))
        .route("/v1/completions/render", post(render::completions))
        .route("/v1/responses/render", post(render::responses))
        .route("/v1/chat/completions/derender", post(derender::chat))
        .route("/v1/completions/derender", post(derender::completions))
        .route("/inference/v1/generate", post(tokens::generate))
        .route("/inference/v1/abort_requests", post(tokens::abort))
}

/// vLLM's `UsageInfo` as a response model writes it (details null; 0.34 omits a null
/// `prompt_tokens_details`).
fn usage_info(prompt: usize, completion: usize) -> Value {
    let mut u = json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
        "prompt_tokens_details": null, "completion_tokens_details": null});
    exclude_null(&mut u, "prompt_tokens_details", Change::PromptDetailsOmittedWhenNone);
    u
}

/// A JSON answer with status 200.
fn ok(body: &Value) -> Response {
    super::json_response(StatusCode::OK, body)
}
