//! `/admin/*` (behind the admin token, or loopback only): status, drain-then-restart, stop,
//! start and rank logs; and the mirror that applies the supervisor's state to admission (held
//! while the group starts or restarts, open when ready, refused when stopped or failed).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sparkgate_config::SpecPolicy;
use sparkgate_supervisor::{Answer, GroupState, SupervisorHandle};

use crate::admission::Hold;
use crate::app::{status_json, Shared};
use crate::error::GatewayError;
use crate::state::{GatewayControl, UpstreamState};

/// Mirrors the supervisor's state into the gateway: admission pauses while the ranks start or
/// restart (queued requests wait instead of failing) and resumes when rank 0 is ready.
pub(crate) fn mirror(control: GatewayControl, supervisor: SupervisorHandle) {
    let mut rx = supervisor.subscribe();
    tokio::spawn(async move {
        // Applied only when the state changes: the supervisor republishes the same state every
        // second (memory samples), and re-applying Ready would undo an operator drain's pause.
        let mut applied = None;
        loop {
            let status = rx.borrow_and_update().clone();
            let key = (
                status.state.clone(),
                status.mode,
                status.max_num_seqs,
                status.stalled_s.is_some(),
            );
            if applied.as_ref() == Some(&key) {
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            applied = Some(key);
            match &status.state {
                // Work pending and no engine step: hold admission rather than send more into
                // an engine that may be hung; a step lifts it, STALL_TIMEOUT restarts the group.
                GroupState::Ready { .. } if status.stalled_s.is_some() => {
                    control.admission().pause(Hold::Group);
                    control.set_upstream(UpstreamState::Stalled(format!(
                        "no engine step for {}s with requests pending",
                        status.stalled_s.unwrap_or_default()
                    )));
                }
                GroupState::Ready { .. } => {
                    // A mode switch changes the concurrency limit with the group.
                    control.admission().set_capacity(status.max_num_seqs);
                    control.set_mode(status.mode);
                    control.set_upstream(UpstreamState::Ready);
                    control.admission().resume(Hold::Group);
                }
                GroupState::Starting { epoch } => {
                    control.admission().pause(Hold::Group);
                    control.set_upstream(UpstreamState::Restarting(format!("starting epoch {epoch}")));
                }
                GroupState::Restarting { reason, .. } => {
                    control.admission().pause(Hold::Group);
                    control.set_upstream(UpstreamState::Restarting(reason.clone()));
                }
                GroupState::Failed { reason } => {
                    control.admission().pause(Hold::Group);
                    control.set_upstream(UpstreamState::Failed(reason.clone()));
                }
                GroupState::Stopped | GroupState::Stopping | GroupState::ShuttingDown => {
                    control.admission().pause(Hold::Group);
                    control.set_upstream(UpstreamState::Stopped);
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}

fn supervisor(app: &Shared) -> Result<&SupervisorHandle, GatewayError> {
    app.supervisor.as_ref().ok_or(GatewayError::NotFound(
        "/admin: this gateway supervises no ranks (gateway-only mode)".into(),
    ))
}

fn accepted(body: serde_json::Value) -> Response {
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(crate) async fn status(State(app): State<Shared>) -> Response {
    let mut body = status_json(&app);
    if let Some(s) = &app.supervisor {
        body["supervisor"] = serde_json::to_value(s.status()).unwrap_or_default();
    }
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Drains (admission paused, in-flight requests finish within DRAIN_TIMEOUT, or at once when
/// `force`), then hands the supervisor to `then` — in the background; the caller answers 202.
fn drain_then<F>(
    app: &Shared,
    force: bool,
    then: impl FnOnce(SupervisorHandle) -> F + Send + 'static,
) -> Result<Duration, GatewayError>
where
    F: std::future::Future<Output = Answer> + Send,
{
    let sup = supervisor(app)?.clone();
    let drain = if force { Duration::ZERO } else { app.drain_timeout };
    let control = app.control.clone();
    tokio::spawn(async move {
        control.admission().pause(Hold::Drain);
        let before = sup.status();
        let deadline = Instant::now() + drain;
        while control.snapshot().in_use > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = control.snapshot().in_use;
        if left > 0 {
            tracing::warn!(
                in_flight = left,
                "drain timeout: restarting with requests still running (they end with an error)"
            );
        }
        let answer = then(sup.clone()).await;
        tracing::info!(?answer, "supervisor answered");
        // The drain's hold ends once the gateway mirrors the supervisor's change (the group's
        // hold then covers the restart), or at once when nothing will change.
        if matches!(answer, Answer::Accepted | Answer::Queued) {
            let mirrored = Instant::now() + Duration::from_secs(5);
            while control.upstream() == UpstreamState::Ready
                && sup.status().epoch == before.epoch
                && Instant::now() < mirrored
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        control.admission().resume(Hold::Drain);
    });
    Ok(drain)
}

fn forced(q: &HashMap<String, String>) -> bool {
    q.get("force").is_some_and(|v| v == "1" || v == "true")
}

/// Drains, then restarts the group; `?force=1` restarts at once. Answers 202 immediately.
pub(crate) async fn restart(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, GatewayError> {
    let force = forced(&q);
    let drain = drain_then(&app, force, move |sup| async move {
        sup.restart(if force {
            "operator restart (forced)"
        } else {
            "operator restart"
        })
        .await
    })?;
    Ok(accepted(
        json!({"restarting": true, "drain_timeout_s": drain.as_secs_f64()}),
    ))
}

/// The auto policy's switch: drain, then restart into `mode`.
pub(crate) fn auto_switch(app: &Shared, mode: sparkgate_config::SpecMethod) {
    let reason = format!("speculation policy auto: switching to {mode}");
    if let Err(e) = drain_then(
        app,
        false,
        move |sup| async move { sup.switch_mode(mode, reason).await },
    ) {
        tracing::error!(error = %e, "the speculation policy cannot switch");
    }
}

/// `GET /admin/spec`: the active mode, the policy (with its settings and last decisions) and
/// every mode's limit and throughput table.
pub(crate) async fn spec(State(app): State<Shared>) -> Response {
    let p = &app.spec_policy;
    let body = json!({
        "mode": app.control.mode(),
        "policy": p.policy(),
        "settings": p.settings(),
        "learned": p.learned(),
        "decisions": p.decisions(),
        "modes": app.spec_modes.iter().map(|m| json!({
            "mode": m.method,
            "num_speculative_tokens": m.num_speculative_tokens,
            "max_num_seqs": m.max_num_seqs,
            "throughput": m.throughput,
        })).collect::<Vec<_>>(),
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// What a `POST /admin/spec` body asks for.
struct SpecAsk {
    mode: Option<serde_json::Value>,
    policy: Option<SpecPolicy>,
}

fn spec_ask(body: &[u8]) -> Result<SpecAsk, GatewayError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        GatewayError::bad_request(
            format!("the body must be JSON like {{\"mode\": \"none\"}}: {e}"),
            "body",
        )
    })?;
    let policy = match v.get("policy") {
        None => None,
        Some(p) => Some(p.as_str().and_then(|p| p.parse::<SpecPolicy>().ok()).ok_or_else(|| {
            GatewayError::bad_request(
                format!("policy must be one of {}, not {p}", SpecPolicy::WORDS.join(", ")),
                "policy",
            )
        })?),
    };
    Ok(SpecAsk {
        mode: v.get("mode").cloned(),
        policy,
    })
}

/// `POST /admin/spec {"mode": M}`: pins mode M (the policy becomes `fixed`), drains, then
/// restarts the group into M with M's MAX_NUM_SEQS (`?force=1` skips the drain); 200 when M is
/// already active, 202 when switching. `{"policy": "auto"}` releases the pin; `"fixed"` keeps the
/// current mode.
pub(crate) async fn set_spec(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
    body: bytes::Bytes,
) -> Result<Response, GatewayError> {
    let ask = spec_ask(&body)?;
    let names: Vec<&str> = app.spec_modes.iter().map(|m| m.method.as_str()).collect();
    match (&ask.mode, ask.policy) {
        (None, Some(policy)) => {
            supervisor(&app)?;
            app.spec_policy.set_policy(policy);
            tracing::info!(%policy, "speculation policy set by an operator");
            let body = json!({"mode": app.control.mode(), "policy": policy});
            return Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response());
        }
        (Some(_), Some(SpecPolicy::Auto)) => {
            return Err(GatewayError::bad_request(
                "a mode pins the policy to fixed; send {\"policy\": \"auto\"} alone to release it",
                "policy",
            ))
        }
        (None, None) => {
            return Err(GatewayError::bad_request(
                format!("\"mode\" is required: one of {}", names.join(", ")),
                "mode",
            ))
        }
        (Some(_), _) => {}
    }
    let wanted = ask.mode.as_ref().and_then(|m| m.as_str()).unwrap_or_default();
    let Some(mode) = app.spec_modes.iter().find(|m| m.method.as_str() == wanted) else {
        return Err(GatewayError::bad_request(
            format!(
                "mode {} is not a mode of this profile: one of {}",
                ask.mode.unwrap_or_default(),
                names.join(", ")
            ),
            "mode",
        ));
    };
    supervisor(&app)?;
    app.spec_policy.set_policy(SpecPolicy::Fixed);
    let (method, seqs) = (mode.method, mode.max_num_seqs);
    if app.control.mode() == method {
        let body = json!({"mode": method, "switching": false});
        return Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response());
    }
    let drain = drain_then(&app, forced(&q), move |sup| async move {
        sup.switch_mode(method, format!("operator switch to speculation mode {method}"))
            .await
    })?;
    Ok(accepted(json!({
        "mode": method,
        "switching": true,
        "max_num_seqs": seqs,
        "drain_timeout_s": drain.as_secs_f64(),
    })))
}

pub(crate) async fn stop(State(app): State<Shared>) -> Result<Response, GatewayError> {
    let sup = supervisor(&app)?;
    answered(sup.stop().await, "stopping", sup)
}

/// `POST /admin/start`: starts a stopped or failed group (202); a running one is left alone
/// (200, `already_running`).
pub(crate) async fn start(State(app): State<Shared>) -> Result<Response, GatewayError> {
    let sup = supervisor(&app)?;
    answered(sup.start().await, "starting", sup)
}

/// The supervisor's answer as the admin API says it: 202 when something will happen, 200 when
/// nothing needs to, 503 when it cannot take commands now.
fn answered(answer: Answer, doing: &str, sup: &SupervisorHandle) -> Result<Response, GatewayError> {
    let state = serde_json::to_value(sup.status().state).unwrap_or_default();
    let body = |key: &str| json!({key: true, "state": state["state"]});
    match answer {
        Answer::Accepted | Answer::Queued => Ok(accepted(body(doing))),
        Answer::AlreadyRunning | Answer::AlreadyStopped => {
            let key = if answer == Answer::AlreadyRunning {
                "already_running"
            } else {
                "already_stopped"
            };
            Ok(([(header::CONTENT_TYPE, "application/json")], body(key).to_string()).into_response())
        }
        Answer::ShuttingDown => Err(GatewayError::NotRunning("the gateway is shutting down".into())),
        Answer::Busy => Err(GatewayError::NotRunning(
            "the supervisor has too many commands waiting; retry".into(),
        )),
    }
}

/// `GET /admin/logs?rank=N&tail=K&follow=1`: the rank's log in the current epoch.
pub(crate) async fn logs(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, GatewayError> {
    let sup = supervisor(&app)?;
    let rank: u32 = q.get("rank").and_then(|r| r.parse().ok()).unwrap_or(0);
    let tail: usize = q.get("tail").and_then(|t| t.parse().ok()).unwrap_or(100);
    let follow = q.get("follow").is_some_and(|v| v == "1" || v == "true");
    let status = sup.status();
    let Some(r) = status.ranks.iter().find(|r| r.rank == rank) else {
        return Err(GatewayError::bad_request(
            format!("rank {rank} is not running (epoch {})", status.epoch),
            "rank",
        ));
    };
    let path = r.log.clone();
    // Lossy: a rank's output may hold bytes that are not UTF-8; they must not hide the log.
    let raw = tokio::fs::read(&path).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&raw);
    let lines: Vec<&str> = text.lines().collect();
    let mut head = lines[lines.len().saturating_sub(tail)..].join("\n");
    if !head.is_empty() {
        head.push('\n');
    }
    if !follow {
        return Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], head).into_response());
    }
    let start = raw.len() as u64;
    let stream = futures_util::stream::unfold((Some(head), path, start), |(first, path, mut offset)| async move {
        if let Some(h) = first {
            return Some((Ok::<_, std::io::Error>(bytes::Bytes::from(h)), (None, path, offset)));
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let data = tokio::fs::read(&path).await.ok()?;
            if (data.len() as u64) > offset {
                let chunk = bytes::Bytes::from(String::from_utf8_lossy(&data[offset as usize..]).into_owned());
                offset = data.len() as u64;
                return Some((Ok(chunk), (None, path, offset)));
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response())
}
