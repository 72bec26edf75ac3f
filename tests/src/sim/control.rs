//! The simulator's control endpoint (`SIM_CONTROL_PORT`, loopback only): arms faults at run
//! time and reports engine state, so tests need no sleeps to reach a fault.
//!
//! `POST /fault/crash` · `POST /fault/crash-after-requests?n=N` · `POST /fault/hang` ·
//! `POST /fault/stream-error?after_tokens=N` · `POST /fault/refuse-connections` ·
//! `POST /fault/clear` · `GET /state` (running, waiting, the most held at once, …)

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use super::engine::Engine;
use super::faults::Faults;
use super::log;

#[derive(Debug, Clone)]
struct Ctl {
    faults: Arc<Faults>,
    engine: Arc<Engine>,
}

fn n(q: &HashMap<String, String>, key: &str) -> Option<u64> {
    q.get(key).and_then(|v| v.parse().ok())
}

pub(crate) async fn serve(port: u16, faults: Arc<Faults>, engine: Arc<Engine>) {
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            log::error(
                "APIServer",
                "control.py:1",
                &format!("vllm-sim control endpoint: cannot bind 127.0.0.1:{port}: {e}"),
            );
            return;
        }
    };
    let addr = listener.local_addr().expect("bound");
    log::info(
        "APIServer",
        "control.py:1",
        &format!("vllm-sim control endpoint on http://{addr}"),
    );
    let app = Router::new()
        .route("/fault/{kind}", post(fault))
        .route("/state", get(state))
        .with_state(Ctl { faults, engine });
    let _ = axum::serve(listener, app).await;
}

/// `POST /fault/<kind>`: arms one fault (or clears them); 404 for a fault there is none of.
async fn fault(State(c): State<Ctl>, Path(kind): Path<String>, Query(q): Query<HashMap<String, String>>) -> StatusCode {
    match kind.as_str() {
        "crash" => c.faults.crash(),
        "crash-after-requests" => c.faults.arm_crash_after_requests(n(&q, "n").unwrap_or(1)),
        "hang" => c.faults.hang(),
        "stream-error" => c
            .faults
            .set_stream_error_after(n(&q, "after_tokens").unwrap_or(1).max(1)),
        "refuse-connections" => c.faults.refuse_connections.store(true, SeqCst),
        "clear" => c.faults.clear(),
        _ => return StatusCode::NOT_FOUND,
    }
    StatusCode::NO_CONTENT
}

async fn state(State(c): State<Ctl>) -> Response {
    let m = &c.engine.metrics;
    let body = json!({
        "running": m.running.load(SeqCst),
        "waiting": m.waiting.load(SeqCst),
        "peak_in_flight": m.peak.load(SeqCst),
        "aborted": m.aborted(),
        "generation_tokens": m.generation_tokens_total(),
        "dead": c.engine.is_dead(),
        "hung": c.faults.is_hung(),
    });
    ([("content-type", "application/json")], body.to_string()).into_response()
}
