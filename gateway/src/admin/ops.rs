//! `/admin/*` (behind the admin token, or loopback only): status, drain-then-restart, stop,
//! start and rank logs; and the mirror that applies the supervisor's state to admission (held
//! while the group starts or restarts, open when ready, refused when stopped or failed).

use sparkgate_events::Event;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sparkgate_config::SpecPolicy;
use sparkgate_supervisor::{Answer, SupervisorHandle};

use crate::api::error::GatewayError;
use crate::app::{status_json, App, Shared};
use crate::control::admission::Hold;
use crate::control::state::UpstreamState;
use crate::groups::Group;

fn no_supervisor() -> GatewayError {
    GatewayError::NotFound("/admin: this gateway supervises no ranks (gateway-only mode)".into())
}

/// A group's supervisor (every group has one unless the gateway is gateway-only).
fn supervisor_of(g: &Group) -> Result<&SupervisorHandle, GatewayError> {
    g.supervisor.as_ref().ok_or_else(no_supervisor)
}

/// The group operators' commands act on: the one, or with MODELS the loaded model's.
fn current(app: &Shared) -> &Arc<Group> {
    app.groups.current(app.swapper.as_ref().and_then(|s| s.loaded()))
}

fn supervisor(app: &Shared) -> Result<&SupervisorHandle, GatewayError> {
    supervisor_of(current(app))
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
    (
        [(header::CONTENT_TYPE, "application/json")],
        status_body(&app).to_string(),
    )
        .into_response()
}

/// `/admin/status`'s body: the gateway's state and the operated group's supervisor.
pub(crate) fn status_body(app: &Shared) -> serde_json::Value {
    let mut body = status_json(app);
    if let Some(s) = &current(app).supervisor {
        body["supervisor"] = serde_json::to_value(s.status()).unwrap_or_default();
    }
    body
}

/// The group `?group=NAME` names, if any; an unknown name is refused with the known ones.
fn named_group(app: &Shared, q: &HashMap<String, String>) -> Result<Option<Arc<Group>>, GatewayError> {
    let Some(name) = q.get("group") else { return Ok(None) };
    match app.groups.named(name) {
        Some(g) => Ok(Some(g.clone())),
        None => {
            let names: Vec<&str> = app.groups.all().iter().map(|g| g.name.as_str()).collect();
            Err(GatewayError::bad_request(
                format!("group {name:?} is not one of: {}", names.join(", ")),
                "group",
            ))
        }
    }
}

/// The supervisors an operator command acts on: the named group's, else every group's.
fn supervisors(app: &Shared, q: &HashMap<String, String>) -> Result<Vec<SupervisorHandle>, GatewayError> {
    supervisor(app)?;
    Ok(match named_group(app, q)? {
        Some(g) => g.supervisor.iter().cloned().collect(),
        None if app.groups.models() => current(app).supervisor.iter().cloned().collect(),
        None => app.groups.all().iter().filter_map(|g| g.supervisor.clone()).collect(),
    })
}

/// What a drain closes before the supervisor is asked: the whole admission (the one group's
/// restart, a mode switch), or one group of several while the others serve.
enum Scope {
    Admission,
    Group(Arc<Group>),
}

impl Scope {
    fn close(&self, app: &App) {
        match self {
            Scope::Admission => app.control.admission().pause(Hold::Drain),
            Scope::Group(g) => {
                g.set_drained(true);
                crate::groups::apply(&app.control, &app.groups);
            }
        }
    }

    fn in_use(&self, app: &App) -> u32 {
        match self {
            Scope::Admission => app.control.snapshot().in_use,
            Scope::Group(g) => g.in_use(),
        }
    }

    /// Still shown as serving: the supervisor's change is not mirrored yet.
    fn looks_ready(&self, app: &App) -> bool {
        match self {
            Scope::Admission => app.control.upstream() == UpstreamState::Ready,
            Scope::Group(g) => g.state() == UpstreamState::Ready,
        }
    }

    fn reopen(&self, app: &App) {
        match self {
            Scope::Admission => app.control.admission().resume(Hold::Drain),
            Scope::Group(g) => {
                g.set_drained(false);
                crate::groups::apply(&app.control, &app.groups);
            }
        }
    }
}

/// Drains `scope` (no new requests there; in-flight ones finish within DRAIN_TIMEOUT, or at
/// once when `force`), then hands `sup` to `then` — in the background; the caller answers 202.
fn drain_then<F>(
    app: &Shared,
    (scope, what): (Scope, String),
    sup: SupervisorHandle,
    force: bool,
    then: impl FnOnce(SupervisorHandle) -> F + Send + 'static,
) -> Duration
where
    F: std::future::Future<Output = Answer> + Send,
{
    let drain = if force { Duration::ZERO } else { app.drain_timeout };
    let app = app.clone();
    sparkgate_task::spawn("admin-restart", async move {
        scope.close(&app);
        let before = sup.status();
        let deadline = Instant::now() + drain;
        while scope.in_use(&app) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = scope.in_use(&app);
        // A forced restart asked for what still runs to end: only a drain that ran out warns.
        if left > 0 && !force {
            Event::DrainTimeout {
                during: format!("{what} ({left} requests running)"),
            }
            .emit();
        }
        let answer = then(sup.clone()).await;
        Event::OperatorAsked {
            what,
            answer: format!("{answer:?}"),
        }
        .emit();
        // The drain's hold ends once the gateway mirrors the supervisor's change (the group's
        // hold then covers the restart), or at once when nothing will change.
        if matches!(answer, Answer::Accepted | Answer::Queued) {
            let mirrored = Instant::now() + Duration::from_secs(5);
            while scope.looks_ready(&app) && sup.status().epoch == before.epoch && Instant::now() < mirrored {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        scope.reopen(&app);
    });
    drain
}

/// `drain_then` over the whole admission with the first group's supervisor.
fn drain_all_then<F>(
    app: &Shared,
    what: String,
    force: bool,
    then: impl FnOnce(SupervisorHandle) -> F + Send + 'static,
) -> Result<Duration, GatewayError>
where
    F: std::future::Future<Output = Answer> + Send,
{
    let sup = supervisor(app)?.clone();
    Ok(drain_then(app, (Scope::Admission, what), sup, force, then))
}

fn forced(q: &HashMap<String, String>) -> bool {
    q.get("force").is_some_and(|v| v == "1" || v == "true")
}

/// Drains, then restarts the group; `?force=1` restarts at once, `?group=NAME` restarts that
/// group alone while the others serve (without it, every group). Answers 202 immediately.
pub(crate) async fn restart(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, GatewayError> {
    let force = forced(&q);
    let reason = if force {
        "operator restart (forced)"
    } else {
        "operator restart"
    };
    let targets: Vec<Arc<Group>> = match named_group(&app, &q)? {
        Some(g) => vec![g],
        None if app.groups.replicas() => app.groups.all().to_vec(),
        None => {
            let drain = drain_all_then(&app, reason.into(), force, move |sup| async move {
                sup.restart(reason).await
            })?;
            return Ok(accepted(
                json!({"restarting": true, "drain_timeout_s": drain.as_secs_f64()}),
            ));
        }
    };
    let mut drain = Duration::ZERO;
    for g in targets {
        let sup = supervisor_of(&g)?.clone();
        let what = format!("{reason} of group {}", g.name);
        drain = drain_then(&app, (Scope::Group(g), what), sup, force, move |sup| async move {
            sup.restart(reason).await
        });
    }
    Ok(accepted(
        json!({"restarting": true, "drain_timeout_s": drain.as_secs_f64()}),
    ))
}

/// The auto policy's switch: drain, then restart into `mode`.
pub(crate) fn auto_switch(app: &Shared, mode: sparkgate_config::SpecMethod) {
    let reason = format!("speculation policy auto: switching to {mode}");
    if let Err(e) = drain_all_then(app, reason.clone(), false, move |sup| async move {
        sup.switch_mode(mode, reason).await
    }) {
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
    let what = format!("operator switch to speculation mode {method}");
    let drain = drain_all_then(&app, what, forced(&q), move |sup| async move {
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

pub(crate) async fn stop(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, GatewayError> {
    on_each(&app, &q, "stopping", |sup| async move { sup.stop().await }).await
}

/// Asks each supervisor `?group=` names (else every one) in turn; answers with the last's.
async fn on_each<F>(
    app: &Shared,
    q: &HashMap<String, String>,
    doing: &str,
    ask: impl Fn(SupervisorHandle) -> F,
) -> Result<Response, GatewayError>
where
    F: std::future::Future<Output = Answer>,
{
    let mut last = None;
    for sup in supervisors(app, q)? {
        let answer = ask(sup.clone()).await;
        Event::OperatorAsked {
            what: doing.to_owned(),
            answer: format!("{answer:?}"),
        }
        .emit();
        last = Some((answer, sup));
    }
    let (answer, sup) = last.ok_or_else(no_supervisor)?;
    answered(answer, doing, &sup)
}

/// `POST /admin/start`: starts a stopped or failed group (202); a running one is left alone
/// (200, `already_running`).
pub(crate) async fn start(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, GatewayError> {
    on_each(&app, &q, "starting", |sup| async move { sup.start().await }).await
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
    let group = named_group(&app, &q)?;
    let sup = match &group {
        Some(g) => supervisor_of(g)?,
        None => supervisor(&app)?,
    };
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
