//! The upstream routes that run nothing on the engine: utilities (the model resolved, then
//! forwarded) and the rest of vLLM's surface, forwarded unchanged — neither takes a permit.

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use bytes::Bytes;

use super::answer::{response_head, unreachable};
use crate::api::body::{check_content_type, Prepared, RequestBody};
use crate::api::error::GatewayError;
use crate::api::family::Api;
use crate::app::App;

/// `/tokenize`, `/detokenize`: the model is resolved like a generation's; no admission.
pub(super) async fn utility(
    app: &App,
    request_id: &str,
    parts: Parts,
    body: impl RequestBody,
) -> Result<Response, GatewayError> {
    check_content_type(&parts.headers)?;
    let bytes = crate::api::body::read(body).await?;
    let Prepared { forward, norm, .. } = crate::api::body::prepare(
        &app.models,
        (app.groups.rules(), app.fallback_model()),
        Api::Utility,
        bytes,
    )
    .await?;
    // With MODELS a tokenizer runs with its model's ranks: another model's would answer wrong.
    if let Some(s) = app.swapper.as_ref().filter(|s| s.loaded() != Some(norm.model_id)) {
        let n = app.models.get(norm.model_id);
        let hint = match s.target() == Some(norm.model_id) {
            true => "it is being loaded".to_owned(),
            false => format!(
                "its tokenizer runs with its ranks: a generation for it loads it (or `sparkgate model {}`)",
                n.profile()
            ),
        };
        return Err(app.not_loaded(norm.model_id, hint));
    }
    forward_as_is(app, request_id, parts.method, parts.uri.path(), &parts.headers, forward).await
}

/// Any other `/v1/*` route: forwarded unchanged.
pub(super) async fn passthrough(
    app: &App,
    request_id: &str,
    parts: Parts,
    body: impl RequestBody,
) -> Result<Response, GatewayError> {
    let bytes = crate::api::body::read(body).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    forward_as_is(app, request_id, parts.method, &path, &parts.headers, bytes).await
}

async fn forward_as_is(
    app: &App,
    request_id: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let group = app.groups.serving();
    let group = match &app.swapper {
        Some(s) => app.groups.current(s.loaded()).as_ref(),
        None => group,
    };
    let send = group.upstream.send(method, path, headers, request_id, body);
    let mut upstream = match tokio::time::timeout(app.request_timeout, send).await {
        Err(_) => {
            return Err(GatewayError::UpstreamTimeout {
                after: app.request_timeout,
            })
        }
        Ok(Err(e)) => return Err(unreachable(group, &e)),
        Ok(Ok(r)) => r,
    };
    let head = response_head(&mut upstream);
    Ok(head
        .body(Body::new(upstream.into_body()))
        .expect("valid response parts"))
}

/// Whether `/v1/models` is the gateway's to answer: several models, or a key that may use only
/// some of them.
pub(super) fn lists_models(app: &App, caller: &crate::control::clients::Caller) -> bool {
    app.models.len() > 1 || caller.key.as_ref().is_some_and(|k| k.settings.models.is_some())
}

/// `/v1/models` in vLLM's shape, every model the caller may use (each `ModelCard` as vLLM builds
/// it: `created` now, a fresh permission id), whichever is loaded.
pub(super) fn models(app: &App, caller: &crate::control::clients::Caller) -> Response {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let allowed = caller.key.as_ref().and_then(|k| k.settings.models.as_ref());
    let cards = app
        .models
        .ids()
        .zip(&app.model_cards)
        .filter(|(id, _)| allowed.is_none_or(|a| app.models.allows(a, *id)))
        .map(|(_, card)| card);
    let body = crate::api::openai::model_list(cards, now).to_string();
    Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a valid response")
}
