//! The axum router of the gateway's own routes: health, readiness, metrics and `/admin/*`; its
//! fallback answers 404 in vLLM's envelope, so a path the route table does not know never
//! reaches vLLM.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

use super::ops as admin;
use super::probes::{metrics_text, ready};
use crate::api::error::GatewayError;
use crate::app::Shared;

/// The gateway's own routes (health, readiness, metrics, `/admin`), and 404 for every path that
/// is neither one of them nor an upstream route.
pub(crate) fn own_routes(app: Shared) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .route("/admin/status", get(admin::status))
        .route("/admin/restart", post(admin::restart))
        .route("/admin/stop", post(admin::stop))
        .route("/admin/start", post(admin::start))
        .route("/admin/logs", get(admin::logs))
        .route("/admin/spec", get(admin::spec).post(admin::set_spec))
        .route("/admin/model", get(super::models::show).post(super::models::swap))
        .route("/admin/usage", get(super::usage::usage))
        .route("/admin/diagnostics", get(super::diagnostics::diagnostics))
        .route("/admin/quarantine", get(super::quarantine::list))
        .route("/admin/quarantine/{id}/release", post(super::quarantine::release))
        .route("/admin/events", get(super::views::events))
        .route("/admin/requests", get(super::views::requests))
        .route("/admin/config", get(super::views::config))
        .fallback(|req: Request| async move { GatewayError::NotFound(req.uri().path().to_owned()) })
        .method_not_allowed_fallback(|| async { GatewayError::MethodNotAllowed })
        .with_state(app)
}
