//! The HTTP server on PORT: the handlers of the upstream routes — the generation path (parse →
//! normalise → admit → proxy → relay), the utilities, transparent proxying of the rest — the
//! gateway's own routes (`/health`, `/ready`, `/metrics`, `/admin/*`), and `serve`, which starts
//! the connection loop (`listen`) over `dispatch`.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use metrics::counter;
use serde_json::json;
use sparkgate_config::Config;
use sparkgate_supervisor::GroupState;
use tokio::net::TcpListener;

use crate::admin;
use crate::app::{App, Shared};
use crate::body::{check_content_type, Prepared};
use crate::clients::Caller;
use crate::edge::RequestId;
use crate::error::GatewayError;
use crate::groups::{Group, Groups, Upstreams};
use crate::normalize::Api;
use crate::observe;
use crate::quarantine::{Dispatched, Stage, Suspect, Verdict, PROBATION_FROM};
use crate::relay::{relay, RelayCtx};
use crate::routes::{Framing, Role, Route};
use crate::state::{GatewayControl, Lifecycle, UpstreamState};
use crate::upstream::{is_hop_by_hop, UpstreamBody, UpstreamError};
use hold::{Held, HoldPermit};

/// A request on an upstream route (`routes::ROUTES`): the methods it answers, then its role's
/// handler. Called by `dispatch` after the edge steps, without a router in between.
pub(crate) async fn upstream_route(
    app: &App,
    route: &'static Route,
    id: &RequestId,
    req: hyper::Request<Incoming>,
    caller: Caller,
) -> Response {
    if !route.methods.allow(req.method()) {
        return GatewayError::MethodNotAllowed.render(route.family);
    }
    let (parts, body) = req.into_parts();
    match route.role {
        Role::Generate(api) => generate(app, id, parts.headers, body, api, route, caller).await,
        Role::Utility => utility(app, id, parts, body)
            .await
            .unwrap_or_else(|e| e.render(route.family)),
        Role::Forward => passthrough(app, id, parts, body)
            .await
            .unwrap_or_else(|e| e.render(route.family)),
    }
}

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
        .fallback(|req: Request| async move { GatewayError::NotFound(req.uri().path().to_owned()) })
        .method_not_allowed_fallback(|| async { GatewayError::MethodNotAllowed })
        .with_state(app)
}

mod hold;
mod pending;
use pending::{Pending, Waiting};

/// The supervisor is (re)starting the group: read from its status directly, which changes
/// before the ranks go down, so no request races the gateway's own mirror of it.
fn restarting(group: &Group) -> bool {
    match &group.supervisor {
        Some(s) => matches!(
            s.status().state,
            GroupState::Starting { .. } | GroupState::Restarting { .. }
        ),
        None => false,
    }
}

/// Runs `work` unless the gateway passes its drain first (DESIGN.md's shutdown contract): then
/// the request is answered 503 instead of being cut with the connection.
async fn until_closed<T>(app: &App, work: impl std::future::Future<Output = T>) -> Result<T, GatewayError> {
    let mut lifecycle = app.control.lifecycle();
    tokio::select! {
        done = work => Ok(done),
        _ = lifecycle.wait_for(|l| *l == Lifecycle::Closing) => Err(GatewayError::DrainTimeout { drain: app.drain_timeout }),
    }
}

/// The request did not reach the rank: the connection was refused (a dead or restarting
/// rank's port), so vLLM never saw it and sending it again is safe.
fn never_reached(err: &UpstreamError) -> bool {
    err.is_connect()
}

/// The end of a quarantined request (logged and counted where it is decided: `Suspect`, or
/// here at arrival).
fn quarantined(request_id: &str, caller: &Caller, stage: Stage) -> GatewayError {
    if stage == Stage::Arrival {
        counter!(observe::QUARANTINED, "stage" => stage.label()).increment(1);
        tracing::warn!(
            request_id,
            client = %caller.label(),
            "request_crashed_engine: refused at arrival, two requests with the same body were quarantined"
        );
    }
    GatewayError::RequestCrashedEngine {
        request_id: request_id.to_owned(),
        at_arrival: stage == Stage::Arrival,
    }
}

/// Maps a failure to reach the upstream: held-for-restart states answer 503, otherwise 502.
fn unreachable(app: &App, group: &Group, err: &UpstreamError) -> GatewayError {
    let kind = observe::UPSTREAM_ERROR_KINDS[usize::from(!err.is_connect())];
    counter!(observe::UPSTREAM_ERRORS, "kind" => kind).increment(1);
    match app.control.upstream() {
        UpstreamState::Restarting(_) | UpstreamState::Starting => GatewayError::Restarting,
        _ if restarting(group) => GatewayError::Restarting,
        _ => GatewayError::UpstreamUnreachable {
            upstream: group.upstream.base().to_owned(),
            detail: error_chain(err),
        },
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut src = err.source();
    while let Some(e) = src {
        s.push_str(": ");
        s.push_str(&e.to_string());
        src = e.source();
    }
    s
}

/// The client's response head from rank 0's: the headers are moved, not copied. The wire has
/// consumed the framing headers (hyper frames the answer anew); any other hop-by-hop header is
/// dropped here.
fn response_head(upstream: &mut hyper::Response<UpstreamBody>) -> axum::http::response::Builder {
    let mut headers = std::mem::take(upstream.headers_mut());
    let forwarded = |k: &axum::http::HeaderName| !is_hop_by_hop(k) && k != header::CONTENT_LENGTH;
    if !headers.keys().all(forwarded) {
        headers = headers
            .iter()
            .filter(|(k, _)| forwarded(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
    let mut b = Response::builder().status(upstream.status());
    if let Some(h) = b.headers_mut() {
        *h = headers;
    }
    b
}

async fn generate(
    app: &App,
    id: &RequestId,
    headers: HeaderMap,
    body: Incoming,
    api: Api,
    route: &'static Route,
    caller: Caller,
) -> Response {
    let started = Instant::now();
    let label = route.label;
    let pending = Pending::new(&id.0, label, started);
    let result = generate_inner(app, &id.0, headers, body, api, route, &pending, caller).await;
    pending.answered();
    let (resp, whole) = match result {
        // A stream's line is written by the relay when the stream ends.
        Ok(Reply::Stream(resp)) => (resp, None),
        Ok(Reply::Whole { resp, usage, model }) => {
            let outcome = if resp.status().is_success() {
                "completed"
            } else {
                "upstream_error"
            };
            (resp, Some((usage, model, outcome)))
        }
        Err(e) => {
            if let Some(reason) = e.rejection_reason() {
                counter!(observe::REJECTIONS, "reason" => reason).increment(1);
            }
            let outcome = e.rejection_reason().unwrap_or_else(|| e.stream_outcome());
            (e.render(route.family), Some((observe::Usage::default(), None, outcome)))
        }
    };
    if let Some((usage, model, outcome)) = whole {
        observe::generation_done(&observe::Finished {
            request_id: &id.0,
            route: label,
            status: resp.status().as_u16(),
            model: model.as_deref(),
            usage,
            ttft: None,
            duration: started.elapsed(),
            outcome,
        });
    }
    observe::request_done(label, resp.status().as_u16(), started.elapsed().as_secs_f64());
    resp
}

/// What a generation answered: a stream (the relay writes its log line when it ends), or a
/// whole body with its usage.
enum Reply {
    Stream(Response),
    Whole {
        resp: Response,
        usage: observe::Usage,
        model: Option<String>,
    },
}

#[allow(clippy::too_many_arguments)] // one request's parts, each used once on the way down
async fn generate_inner(
    app: &App,
    request_id: &str,
    headers: HeaderMap,
    body: Incoming,
    api: Api,
    route: &'static Route,
    pending: &Pending<'_>,
    caller: Caller,
) -> Result<Reply, GatewayError> {
    let started = pending.started;
    check_content_type(&headers)?;
    let bytes = crate::body::read(body, &app.body).await?;
    let Prepared {
        norm,
        forward,
        user,
        priority,
    } = crate::body::prepare(&app.normalizer, api, bytes).await?;
    if norm.extra_body_repaired {
        counter!(observe::EXTRA_BODY_REPAIRS).increment(1);
    }
    if let Some((from, to)) = &norm.effort_mapping {
        counter!(observe::EFFORT_MAPPINGS, "from" => from.clone(), "to" => to.clone()).increment(1);
    }
    match app.control.upstream() {
        UpstreamState::Failed(reason) => return Err(GatewayError::NotRunning(reason)),
        UpstreamState::Stopped => return Err(GatewayError::NotRunning("the ranks were stopped by an operator".into())),
        _ => {}
    }
    let prefix = app
        .groups
        .wants_prefix()
        .then(|| crate::groups::prefix_key(&forward))
        .flatten();
    // A body quarantined twice (under two requests) is refused before it reaches a rank.
    if app.quarantine.refuses(&forward) {
        return Err(quarantined(request_id, &caller, Stage::Arrival));
    }
    // This request's losses so far (`quarantine`).
    let mut strikes = 0;
    let queued_at = Instant::now();
    let client = app.clients.identify(&caller, &headers, user.as_deref(), priority);
    let admission = app.control.admission();
    let prefer = app.groups.preference(prefix);
    let seqs = norm.sequences;
    // A request runs on one group: with several, its sequences must fit the largest.
    if app.groups.all().len() > 1 && seqs.total() > app.groups.largest_capacity() {
        return Err(seqs.refusal(app.groups.largest_capacity()));
    }
    pending.at(Waiting::Queue);
    let mut permit = admission
        .acquire_for(seqs.total(), forward.len(), &client, prefer)
        .await
        .map_err(|e| match e {
            GatewayError::OverCapacity { capacity, .. } => seqs.refusal(capacity),
            e => e,
        })?;
    let waited = queued_at.elapsed();
    pending.at(Waiting::Upstream);
    observe::queue_wait(waited.as_secs_f64());
    let snap = app.control.snapshot();
    observe::admission(snap.queued, snap.in_use);
    let path = route.path;
    // The gateway's own time before the upstream request: everything but the queue wait.
    observe::overhead(started.elapsed().saturating_sub(waited).as_secs_f64());
    let limit = if norm.stream {
        app.first_token_timeout
    } else {
        app.request_timeout
    };
    // When an attempt first failed to reach a rank: requeued attempts end after REQUEST_TIMEOUT.
    let mut refused_at: Option<Instant> = None;
    let (mut upstream, lease, dispatched) = loop {
        // Admission counted the open groups' slots: one has room unless it closed just now.
        let Some(mut lease) = app.groups.lease(prefix, permit.take_reservation(), seqs.total()) else {
            drop(permit);
            permit = admission.requeue(seqs.total(), forward.len()).await?;
            continue;
        };
        let group = lease.shared();
        if strikes > 0 {
            lease.mark_suspect();
        }
        if strikes >= PROBATION_FROM && !lease.on_probation() {
            // Another twice-lost suspect is on trial there: wait for its outcome, queue again.
            drop((lease, permit));
            group.probation_over().await;
            permit = admission.requeue(seqs.total(), forward.len()).await?;
            continue;
        }
        let dispatched = Dispatched::now(group.clone(), seqs.total(), strikes > 0);
        let dispatched_to = dispatched.epoch;
        let send = group
            .upstream
            .send(Method::POST, path, &headers, request_id, forward.clone());
        let held = Held::new(lease, permit);
        let sent = until_closed(app, tokio::time::timeout(limit, send)).await;
        let (lease, p) = held.into_parts();
        permit = p;
        match sent? {
            Err(_) => {
                // Given up on: vLLM holds it until it sees the connection close.
                lease.release_after_abort(permit);
                return Err(GatewayError::UpstreamTimeout { after: limit });
            }
            // No answer has begun, so nothing reached the client. A refused connect never
            // reached vLLM; any other failure to send counts as not reached when the group it
            // went to is lost (the supervisor's verdict, within a second). Either way the
            // request goes back to the head of the queue for the group that comes up.
            Ok(Err(e))
                if dispatched_to.is_some()
                    && refused_at.get_or_insert_with(Instant::now).elapsed() < app.request_timeout =>
            {
                // Its slots (and a suspect's probation) stay taken until the verdict: a rank that
                // just died may still accept a connection while its process ends, and a queued
                // request sent into that moment would be lost under the same crash.
                let lost = group.lost_since(dispatched_to).await;
                drop((lease, permit));
                if !(lost || never_reached(&e) || restarting(&group)) {
                    return Err(unreachable(app, &group, &e));
                }
                if lost && !never_reached(&e) {
                    // vLLM held it when the group was lost: a suspect, or a poison request.
                    let suspect = Suspect {
                        strikes,
                        quarantine: app.quarantine.clone(),
                        body: forward.clone(),
                        dispatched,
                        request_id: request_id.to_owned(),
                        client: caller.clone(),
                    };
                    let (verdict, now) = suspect.judge();
                    if verdict == Verdict::Quarantined {
                        return Err(quarantined(request_id, &caller, Stage::Dispatch));
                    }
                    strikes = now;
                }
                permit = admission.requeue(seqs.total(), forward.len()).await?;
            }
            Ok(Err(e)) => return Err(unreachable(app, &group, &e)),
            Ok(Ok(r)) => break (r, lease, dispatched),
        }
    };
    let mode = lease.group().mode();
    let is_sse = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let mut head = response_head(&mut upstream);
    if app.groups.all().len() > 1 {
        // Which group answered, for clients and operators that follow a conversation's group.
        head = head.header("x-sparkgate-group", lease.group().name.as_str());
    }
    if norm.stream && is_sse && upstream.status().is_success() {
        let ctx = RelayCtx {
            started,
            usage_injected: norm.usage_injected,
            framing: Framing::of(route.family, api),
            first_token_timeout: app.first_token_timeout,
            idle_timeout: app.idle_timeout,
            mode,
            control: app.control.clone(),
            request_id: request_id.to_owned(),
            route: route.label,
            model: norm.model.clone(),
            drain_timeout: app.drain_timeout,
            suspect: Some(Suspect {
                strikes,
                quarantine: app.quarantine.clone(),
                body: forward.clone(),
                dispatched,
                request_id: request_id.to_owned(),
                client: caller,
            }),
        };
        let events = relay(upstream.into_body(), ctx);
        return Ok(Reply::Stream(
            head.body(Body::new(HoldPermit::new(events, Held::new(lease, permit))))
                .expect("valid response parts"),
        ));
    }
    // Non-streaming (or an upstream error before streaming): the body is complete upstream
    // work; read it within the request timeout, count its tokens, pass the bytes through.
    let status = upstream.status();
    let held = Held::new(lease, permit);
    let collected = until_closed(
        app,
        tokio::time::timeout(app.request_timeout, upstream.into_body().collect()),
    )
    .await?;
    let bytes = match collected {
        Err(_) => {
            return Err(GatewayError::UpstreamTimeout {
                after: app.request_timeout,
            })
        }
        Ok(Err(e)) => {
            return Err(GatewayError::UpstreamUnreachable {
                upstream: held.group().upstream.base().to_owned(),
                detail: error_chain(&e),
            })
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    let usage = observe::Usage::of_body(&bytes);
    if let (true, Some(t)) = (status.is_success(), usage.completion) {
        app.control.count_tokens(mode, t);
    }
    // vLLM has finished it: the slots go back with the answer's last byte.
    let body = HoldPermit::new(http_body_util::Full::new(bytes), held);
    Ok(Reply::Whole {
        resp: head.body(Body::new(body)).expect("valid response parts"),
        usage,
        model: norm.model,
    })
}

/// `/tokenize`, `/detokenize`: the model is resolved like a generation's; no admission.
async fn utility(app: &App, id: &RequestId, parts: Parts, body: Incoming) -> Result<Response, GatewayError> {
    check_content_type(&parts.headers)?;
    let bytes = crate::body::read(body, &app.body).await?;
    let Prepared { forward, .. } = crate::body::prepare(&app.normalizer, Api::Utility, bytes).await?;
    forward_as_is(app, &id.0, parts.method, parts.uri.path(), &parts.headers, forward).await
}

/// Any other `/v1/*` route: forwarded unchanged.
async fn passthrough(app: &App, id: &RequestId, parts: Parts, body: Incoming) -> Result<Response, GatewayError> {
    let bytes = crate::body::read(body, &app.body).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    forward_as_is(app, &id.0, parts.method, &path, &parts.headers, bytes).await
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
        Ok(Err(e)) => return Err(unreachable(app, group, &e)),
        Ok(Ok(r)) => r,
    };
    let head = response_head(&mut upstream);
    Ok(head
        .body(Body::new(upstream.into_body()))
        .expect("valid response parts"))
}

/// 200 only when the upstream is ready and admission is open; 503 otherwise. Anyone may ask,
/// so it says ready or not and why in one word — the details (a failed group's reason quotes
/// its rank logs) are `/admin/status`'s, behind the admin token.
async fn ready(State(app): State<Shared>) -> Response {
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
async fn metrics_text(State(app): State<Shared>) -> Response {
    let snap = app.control.snapshot();
    observe::admission(snap.queued, snap.in_use);
    let own = observe::metrics_handle().render();
    let body = match app.groups.all() {
        [one] => crate::exposition::merge(&own, one.metrics.get(&one.upstream).await.as_deref()),
        // Several groups: each rank 0's families with a `group` label.
        many => {
            let fetch = many
                .iter()
                .map(|g| async { (g.name.as_str(), g.metrics.get(&g.upstream).await) });
            crate::exposition::merge_groups(&own, &futures_util::future::join_all(fetch).await)
        }
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}

/// In gateway-only mode nobody supervises the upstream: probe its `/health` every second.
async fn probe_upstream(app: Shared) {
    let upstream = &app.groups.first().upstream;
    loop {
        let state = if upstream.healthy().await {
            UpstreamState::Ready
        } else {
            UpstreamState::Unreachable(format!("{}/health does not answer 200", upstream.base()))
        };
        app.control.set_upstream(state);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Serves the gateway on `listener` until `shutdown` resolves, then drains connections for at
/// most the configured drain timeout.
pub async fn serve(
    config: &Config,
    listener: TcpListener,
    control: GatewayControl,
    upstreams: Upstreams,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    observe::metrics_handle();
    let groups = std::sync::Arc::new(Groups::of(config, &upstreams));
    let app = App::new(config, control.clone(), groups.clone());
    match upstreams {
        Upstreams::Probe => {
            sparkgate_task::spawn("upstream-probe", probe_upstream(app.clone()));
        }
        Upstreams::Supervised(list) if list.len() > 1 => {
            crate::groups::mirror(control.clone(), groups);
            if list
                .iter()
                .any(|(g, _)| g.config.speculation.policy == sparkgate_config::SpecPolicy::Auto)
            {
                tracing::warn!(
                    "SPEC_POLICY=auto runs with one group only; with GROUPS_FILE each group keeps its SPEC_METHOD"
                );
            }
        }
        Upstreams::Supervised(mut list) => {
            crate::groups::mirror(control.clone(), groups);
            let h = list.pop().expect("one group").1;
            let (for_switch, demand) = (app.clone(), control.clone());
            crate::spec::run(
                app.spec_policy.clone(),
                h,
                move || {
                    let s = demand.snapshot();
                    (s.in_use + s.queued as u32, demand.delivered_tokens())
                },
                move |mode| admin::auto_switch(&for_switch, mode),
            );
        }
    }
    if let Some(l) = app.limiter.clone() {
        sparkgate_task::spawn("rate-limit-housekeeping", async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                l.housekeeping();
            }
        });
    }
    // The tokens/s that /admin/status reports: delivered tokens sampled each second.
    let sampled = control.clone();
    sparkgate_task::spawn("token-rate", async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            sampled.sample_rate();
        }
    });
    let cfg = crate::listen::ListenConfig {
        header_read_timeout: config.gateway.header_read_timeout,
        drain_timeout: config.gateway.drain_timeout,
        max_connections: config.gateway.max_connections,
    };
    let (drain, close) = (control.clone(), control);
    let hooks = crate::listen::ShutdownHooks {
        draining: Box::new(move || drain.begin_drain()),
        closing: Box::new(move || close.close()),
    };
    crate::listen::run(crate::dispatch::Dispatch::new(app), listener, cfg, shutdown, hooks).await;
    Ok(())
}

/// The address a listener ended up on (for logs when PORT is 0).
pub fn local_addr(listener: &TcpListener) -> std::io::Result<SocketAddr> {
    listener.local_addr()
}
