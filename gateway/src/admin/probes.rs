//! What monitors poll without the admin token: readiness in one word and the merged metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::app::Shared;
use crate::observe;

/// 200 only when the upstream is ready and admission is open; 503 otherwise. Anyone may ask,
/// so it says ready or not and why in one word — the details (a failed group's reason quotes
/// its rank logs) are `/admin/status`'s, behind the admin token.
pub(super) async fn ready(State(app): State<Shared>) -> Response {
    let state = app.control.readiness();
    let status = if state == "ready" && app.control.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({"ready": status == StatusCode::OK, "state": state});
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The gateway's families and rank 0's in one exposition (`exposition`).
pub(super) async fn metrics_text(State(app): State<Shared>) -> Response {
    let snap = app.control.snapshot();
    observe::admission(snap.queued, snap.in_use);
    let own = observe::metrics_handle().render() + &app.groups.upstream_info();
    let body = match app.groups.all() {
        [one] => crate::upstream::exposition::merge(&own, one.metrics.get(&one.upstream).await.as_deref()),
        // Several groups: each rank 0's families with a `group` label.
        many => {
            let fetch = many
                .iter()
                .map(|g| async { (g.name.as_str(), g.metrics.get(&g.upstream).await) });
            crate::upstream::exposition::merge_groups(&own, &futures_util::future::join_all(fetch).await)
        }
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}
