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
    let Prepared { forward, .. } =
        crate::api::body::prepare(&app.normalizer, app.groups.rules(), Api::Utility, bytes).await?;
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
