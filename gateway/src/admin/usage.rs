//! `GET /admin/usage` (docs/keys.md): usage per API key name, model and route from the store —
//! every generation that finished before the call included — for a window (`hour`: the last 60
//! minutes, `day`: the last 24 hours, `week`: the last 7 days, `today`: since UTC midnight,
//! `all`), of one key (`?key=NAME`) or all, with totals and queue-wait percentiles; with
//! `?series=1` also each key's tokens and requests in the window's buckets (the console's
//! charts). Names only: a key never appears.

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

/// The windows `?window=` names, each with where it starts and its series' bucket (seconds).
const WINDOWS: [(&str, Start, i64); 5] = [
    ("hour", |now| now - 3_600, 300),
    ("day", |now| now - 86_400, 3_600),
    ("week", |now| now - 7 * 86_400, 86_400),
    ("today", |now| now - now.rem_euclid(86_400), 3_600),
    ("all", |_| 0, 86_400),
];

pub(crate) async fn usage(State(app): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Response {
    answer(&app, &q).await.unwrap_or_else(IntoResponse::into_response)
}

/// The answer to a usage query (`/admin/usage`, and the console's own, which pins `key`).
pub(crate) async fn answer(app: &Shared, q: &HashMap<String, String>) -> Result<Response, GatewayError> {
    let window = q.get("window").map_or("today", String::as_str);
    let Some((_, start, step)) = WINDOWS.iter().find(|(name, ..)| *name == window) else {
        return Err(GatewayError::bad_request(
            "window must be hour, day, week, today or all",
            "window",
        ));
    };
    let key = q.get("key").map(String::as_str).filter(|k| !k.is_empty());
    let series = match q.get("series").map(String::as_str) {
        None | Some("0" | "false") => false,
        Some("1" | "true") => true,
        Some(_) => return Err(GatewayError::bad_request("series must be 1 or 0", "series")),
    };
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
    let mut body = json!({
        "window": window,
        "since": since - since.rem_euclid(60),
        "until": now,
        "key": key,
        "rows": rows,
        "total": counts(&total),
    });
    if series {
        let points = app.ledger.series((since, *step), key).await?;
        let points: Vec<Value> = points
            .iter()
            .map(|p| json!({"key": p.key, "at": p.at, "prompt": p.prompt, "completion": p.completion, "requests": p.requests}))
            .collect();
        body["series"] = json!({"step_s": step, "points": points});
    }
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
