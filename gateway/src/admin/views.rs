//! Read-only views for the console and scripts: `GET /admin/events` (the last events, newest
//! first, `?level=info|warn|error` at least that loud, `?limit=N`), `GET /admin/requests` (the
//! generations in flight and the queue) and `GET /admin/config` (every setting with its source,
//! secrets redacted — `sparkgate config --json`'s object).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sparkgate_events::Level;

use crate::api::error::GatewayError;
use crate::app::Shared;

/// The levels `?level=` names.
const LEVELS: [(&str, Level); 3] = [("info", Level::Info), ("warn", Level::Warn), ("error", Level::Error)];

fn json_response(body: &Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(crate) async fn events(Query(q): Query<HashMap<String, String>>) -> Result<Response, GatewayError> {
    let level = match q.get("level") {
        None => Level::Info,
        Some(l) => LEVELS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(l))
            .map(|(_, level)| *level)
            .ok_or_else(|| GatewayError::bad_request("level must be info, warn or error", "level"))?,
    };
    let limit = match q.get("limit") {
        None => 200,
        Some(n) => n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=sparkgate_events::KEPT).contains(n))
            .ok_or_else(|| {
                GatewayError::bad_request(format!("limit must be 1..={}", sparkgate_events::KEPT), "limit")
            })?,
    };
    let rows: Vec<Value> = sparkgate_events::recent(level, limit)
        .into_iter()
        .map(|r| {
            let mut row = json!({
                "seq": r.seq,
                "at_ms": r.at_ms,
                "level": r.level.label(),
                "event": r.name,
                "text": r.text,
            });
            if let Some((group, epoch)) = r.group {
                row["group"] = json!(group);
                row["epoch"] = json!(epoch);
            }
            row
        })
        .collect();
    Ok(json_response(&json!({ "events": rows })))
}

pub(crate) async fn requests(State(app): State<Shared>) -> Response {
    let snap = app.control.snapshot();
    let waiting: Vec<Value> = app
        .control
        .admission()
        .waiting()
        .iter()
        .zip(crate::api::models::ModelId::all(crate::api::models::MAX_MODELS))
        // A model somebody waits for is one of the catalog's.
        .filter(|(w, _)| w.count > 0)
        .map(|(w, model)| {
            json!({
                "model": app.models.get(model).served(),
                "count": w.count,
                "oldest_wait_s": w.oldest.map(|t| (t.elapsed().as_secs_f64() * 10.0).round() / 10.0),
            })
        })
        .collect();
    json_response(&json!({
        "in_flight": app.in_flight.json(),
        "queue": {"queued": snap.queued, "by_model": waiting},
    }))
}

pub(crate) async fn config(State(app): State<Shared>) -> Response {
    json_response(&app.settings)
}
