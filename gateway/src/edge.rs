//! Edge layers, outermost first (the order `server::router` installs them):
//! 1. request id — `X-Request-Id` accepted (printable, ≤128 bytes) or generated, stored for the
//!    handlers (which forward it upstream) and echoed on the response;
//! 2. access log — one structured line per response (method, path, status, duration, id):
//!    polls (health, readiness, metrics, status) at DEBUG; generations skip it, since each
//!    gets one INFO line with tokens and TTFT when it ends (`observe::generation_done`);
//! 3. authentication — API keys (bearer or `x-api-key`) on every upstream route that reaches the
//!    model or its tokenizer and on `/metrics` unless METRICS_PUBLIC (when `API_KEYS` is set),
//!    the admin token on `/admin/*` (loopback peers only when no token is set); constant-time
//!    comparison; a refusal in the route's envelope;
//! 4. rate limit — per validated API key, else per client IP, on the upstream routes, when
//!    `RATE_LIMIT_RPM` is set.
//!
//! Body size is bounded where the body is read (`server::read_body`), so the 413 carries the
//! error envelope.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use sparkgate_config::Secret;

use crate::app::{App, Shared};
use crate::error::GatewayError;
use crate::routes::{Family, Matched, Route};

/// The request's id, as accepted or generated.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub(crate) String);

fn generate_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed = (nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id()))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    format!("sg-{mixed:016x}{n:08x}")
}

pub(crate) async fn request_id(mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned);
    let id = given.unwrap_or_else(generate_id);
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// How loud a request's access-log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loudness {
    /// A generation: its one line is written when it ends (`observe::generation_done`).
    Generation,
    /// What monitors and `sparkgate` poll (health, readiness, metrics, status): DEBUG.
    Poll,
    Info,
}

fn loudness(req: &Request) -> Loudness {
    if matched(req).is_some_and(|r| matches!(r.role, crate::routes::Role::Generate(_))) {
        return Loudness::Generation;
    }
    let polled = matches!(
        req.uri().path(),
        "/health" | "/ready" | "/metrics" | "/admin/status" | "/ping" | "/version" | "/load"
    ) || (req.uri().path() == "/admin/spec" && req.method() == axum::http::Method::GET);
    if polled {
        Loudness::Poll
    } else {
        Loudness::Info
    }
}

pub(crate) async fn access_log(req: Request, next: Next) -> Response {
    let loudness = loudness(&req);
    if loudness == Loudness::Generation {
        return next.run(req).await;
    }
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let resp = next.run(req).await;
    let (status, duration_ms) = (resp.status().as_u16(), crate::observe::ms(started.elapsed()));
    let peer = peer.map(tracing::field::display);
    match loudness {
        Loudness::Poll => tracing::debug!(request_id = %id, %method, path, status, duration_ms, peer, "request"),
        _ => tracing::info!(request_id = %id, %method, path, status, duration_ms, peer, "request"),
    }
    resp
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key a client presents: `Authorization: Bearer …` (OpenAI SDKs, Claude Code's
/// ANTHROPIC_AUTH_TOKEN) or `x-api-key` (the anthropic SDK).
fn presented_key(req: &Request) -> Option<&str> {
    let bearer = || {
        let v = req.headers().get("authorization")?.to_str().ok()?;
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    };
    bearer().or_else(|| req.headers().get("x-api-key")?.to_str().ok().map(str::trim))
}

/// The upstream route `canonicalize` matched (looked up again only for a request that did not
/// pass through the connection loop).
fn matched(req: &Request) -> Option<&'static Route> {
    match req.extensions().get::<Matched>() {
        Some(m) => m.0,
        None => crate::routes::lookup(req.uri().path()),
    }
}

/// What the API keys guard: every upstream route that reaches the model or its tokenizer, and
/// `/metrics` unless METRICS_PUBLIC is set.
fn guarded(app: &App, route: Option<&Route>, path: &str) -> bool {
    match route {
        Some(r) => r.needs_key(),
        None => path == "/metrics" && !app.metrics_public,
    }
}

fn matches_any(token: Option<&str>, keys: &[Secret]) -> bool {
    let Some(token) = token else { return false };
    // Compare against every key so the time taken does not reveal which one matched.
    keys.iter().fold(false, |hit, k| {
        constant_time_eq(k.expose().as_bytes(), token.as_bytes()) | hit
    })
}

pub(crate) async fn authenticate(State(app): State<Shared>, mut req: Request, next: Next) -> Response {
    let route = matched(&req);
    if !app.api_keys.is_empty() && guarded(&app, route, req.uri().path()) {
        if !matches_any(presented_key(&req), &app.api_keys) {
            let family = route.map_or(Family::OpenAi, |r| r.family);
            return GatewayError::Unauthorized.render(family);
        }
        // The rate limiter keys on this key: it is validated now.
        let key = presented_key(&req).unwrap_or_default().to_owned();
        req.extensions_mut().insert(ValidatedKey(key));
    }
    if req.uri().path().starts_with("/admin") {
        match &app.admin_token {
            Some(token) => {
                if !matches_any(presented_key(&req), std::slice::from_ref(token)) {
                    return GatewayError::AdminUnauthorized.into_response();
                }
            }
            None => {
                let loopback = req
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .is_some_and(|c| c.0.ip().is_loopback());
                if !loopback {
                    return GatewayError::Forbidden("/admin answers only loopback clients when ADMIN_TOKEN is not set")
                        .into_response();
                }
            }
        }
    }
    next.run(req).await
}

type Keyed = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock, StateInformationMiddleware>;

/// Requests per minute per API key (or client IP).
#[derive(Debug)]
pub(crate) struct Limiter {
    limiter: Keyed,
    rpm: u32,
}

impl Limiter {
    pub(crate) fn new(rpm: u32, burst: u32) -> Arc<Self> {
        let quota = Quota::per_minute(NonZeroU32::new(rpm).expect("rpm > 0"))
            .allow_burst(NonZeroU32::new(burst.max(1)).expect("burst > 0"));
        Arc::new(Self {
            limiter: RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>(),
            rpm,
        })
    }

    /// Drops state of keys that are at full capacity again (call periodically).
    pub(crate) fn housekeeping(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}

/// An API key `authenticate` checked against API_KEYS.
#[derive(Debug, Clone)]
struct ValidatedKey(String);

pub(crate) async fn rate_limit(State(app): State<Shared>, req: Request, next: Next) -> Response {
    let limited = matched(&req).is_some();
    let Some(limiter) = app.limiter.as_ref().filter(|_| limited) else {
        return next.run(req).await;
    };
    // A validated key, or else the client address: never a header nobody checked, which a
    // client could change per request to escape the limit.
    let validated = req.extensions().get::<ValidatedKey>().map(|k| format!("key:{}", k.0));
    let key = validated.unwrap_or_else(|| {
        let ip = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip().to_string())
            .unwrap_or_default();
        format!("ip:{ip}")
    });
    let limit = HeaderValue::from(limiter.rpm);
    match limiter.limiter.check_key(&key) {
        Ok(snapshot) => {
            let mut resp = next.run(req).await;
            let h = resp.headers_mut();
            h.insert("x-ratelimit-limit-requests", limit);
            h.insert(
                "x-ratelimit-remaining-requests",
                HeaderValue::from(snapshot.remaining_burst_capacity()),
            );
            resp
        }
        Err(not_until) => {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            metrics::counter!(crate::observe::REJECTIONS, "reason" => "rate_limit").increment(1);
            let mut resp = GatewayError::RateLimited {
                limit: limiter.rpm,
                retry_after: wait,
            }
            .into_response();
            let h = resp.headers_mut();
            h.insert("x-ratelimit-limit-requests", limit);
            h.insert("x-ratelimit-remaining-requests", HeaderValue::from(0));
            h.insert(
                "x-ratelimit-reset-requests",
                HeaderValue::from_str(&format!("{:.3}s", wait.as_secs_f64())).expect("ascii"),
            );
            resp
        }
    }
}
