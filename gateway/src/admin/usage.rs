//! `GET /admin/usage` (docs/keys.md): usage per API key name, model and route from the store —
//! every generation that finished before the call included — for a window (`hour`: the last 60
//! minutes, `today`: since UTC midnight, `all`), of one key (`?key=NAME`) or all, with totals
//! and queue-wait percentiles. Names only: a key never appears.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sparkgate_store::Usage;

use crate::api::error::GatewayError;
use crate::app::Shared;
use crate::control::ledger::now_secs;

/// Where a window starts, from now (seconds).
type Start = fn(i64) -> i64;

/// The windows `?window=` names, each with where it starts.
const WINDOWS: [(&str, Start); 3] = [
    ("hour", |now| now - 3_600),
    ("today", |now| now - now.rem_euclid(86_400)),
    ("all", |_| 0),
];

pub(crate) async fn usage(State(app): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Response {
    answer(&app, &q).await.unwrap_or_else(IntoResponse::into_response)
}

async fn answer(app: &Shared, q: &HashMap<String, String>) -> Result<Response, GatewayError> {
    let window = q.get("window").map_or("today", String::as_str);
    let Some((_, start)) = WINDOWS.iter().find(|(name, _)| *name == window) else {
        return Err(GatewayError::bad_request("window must be hour, today or all", "window"));
    };
    let key = q.get("key").map(String::as_str).filter(|k| !k.is_empty());
    let now = now_secs();
    let since = start(now);
    let rows = app.ledger.since(since, key).await?;
    let mut total = Usage::default();
    let rows: Vec<Value> = rows
        .iter()
        .map(|(who, usage)| {
            total.add(usage);
            let mut row = counts(usage);
            row["key"] = json!(who.key);
            row["model"] = json!(who.model);
            row["route"] = json!(who.route);
            row
        })
        .collect();
    let body = json!({
        "window": window,
        "since": since - since.rem_euclid(60),
        "until": now,
        "key": key,
        "rows": rows,
        "total": counts(&total),
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

/// A usage's counts as JSON, with its queue-wait percentiles (a bucket's bound, ms).
fn counts(u: &Usage) -> Value {
    let mut v = serde_json::to_value(u).unwrap_or_default();
    v["queue_wait_ms"] = json!({
        "p50": u.wait_percentile(0.5),
        "p95": u.wait_percentile(0.95),
        "p99": u.wait_percentile(0.99),
    });
    v
}
