//! The edge steps every request passes, outermost first (the order `dispatch::Dispatch::call`
//! applies them):
//! 1. request id — `X-Request-Id` accepted (printable, ≤128 bytes) or generated, passed to the
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
//! Each step is a plain function over the request's head (and, after the handler, its
//! response): called in line, they cost a generation no boxed future and no request moved
//! through a middleware stack — as `from_fn` layers they were a fifth of the gateway's
//! instructions per request (BENCHMARKS.md, "The hot path").
//!
//! Body size is bounded where the body is read (`server::read_body`), so the 413 carries the
//! error envelope.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::Response;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use crate::api::error::GatewayError;
use crate::api::routes::Route;

/// What the edge steps know: the keys and the limiter, from the configuration.
#[derive(Debug)]
pub(crate) struct Edge {
    /// API_KEYS and ADMIN_TOKEN as they are compared: their SHA-256 digests (`KeyDigest`).
    api_keys: Vec<KeyDigest>,
    admin_token: Option<KeyDigest>,
    /// `/metrics` answers without an API key (METRICS_PUBLIC).
    metrics_public: bool,
    pub(crate) limiter: Option<Arc<Limiter>>,
}

impl Edge {
    pub(crate) fn new(config: &sparkgate_config::Config) -> Edge {
        let g = &config.gateway;
        Edge {
            api_keys: config
                .secrets
                .api_keys
                .iter()
                .map(|k| KeyDigest::of(k.expose()))
                .collect(),
            admin_token: config.secrets.admin_token.as_ref().map(|t| KeyDigest::of(t.expose())),
            metrics_public: g.metrics_public,
            limiter: g.rate_limit_rpm.map(|rpm| Limiter::new(rpm, g.rate_limit_burst)),
        }
    }
}

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
    // Read once: `process::id` is a system call on every call (glibc keeps no copy).
    static PID: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| u64::from(std::process::id()));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed = (nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ *PID).wrapping_mul(0xff51_afd7_ed55_8ccd);
    // Written by hand: `format!` with hex widths cost more than the rest of the edge steps.
    let mut id = String::with_capacity(27);
    id.push_str("sg-");
    push_hex(&mut id, mixed, 16);
    push_hex(&mut id, n, 8);
    id
}

/// The low `digits` hexadecimal digits of `v`, zero-padded.
fn push_hex(out: &mut String, v: u64, digits: u32) {
    for i in (0..digits).rev() {
        let nibble = ((v >> (4 * i)) & 0xf) as u32;
        out.push(char::from_digit(nibble, 16).unwrap_or('0'));
    }
}

/// Step 1: the request's id, as the client sent it (when usable) or generated.
pub(crate) fn request_id(headers: &HeaderMap) -> RequestId {
    let given = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()));
    RequestId(given.map_or_else(generate_id, str::to_owned))
}

/// Step 1, on the way out: the id is echoed on every response, refusals included.
pub(crate) fn echo_id(resp: &mut Response, id: &RequestId) {
    if let Ok(v) = HeaderValue::from_str(&id.0) {
        resp.headers_mut().insert("x-request-id", v);
    }
}

/// What the edge steps read of a request: its head, the route the path matched and the peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head<'a> {
    pub(crate) method: &'a Method,
    /// The canonical path.
    pub(crate) path: &'a str,
    pub(crate) headers: &'a HeaderMap,
    /// The upstream route (`None`: the gateway's own, or unknown).
    pub(crate) route: Option<&'static Route>,
    pub(crate) peer: SocketAddr,
}

/// How loud a request's access-log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loudness {
    /// What monitors and `sparkgate` poll (health, readiness, metrics, status): DEBUG.
    Poll,
    Info,
}

/// Step 2: a request's access-log line, begun before the handler and written when it answered.
#[derive(Debug)]
pub(crate) struct AccessLine {
    loudness: Loudness,
    started: Instant,
    method: Method,
    path: String,
}

impl AccessLine {
    /// `None` for a generation: its one line is written when it ends
    /// (`observe::generation_done`).
    pub(crate) fn begin(head: &Head<'_>) -> Option<AccessLine> {
        if head
            .route
            .is_some_and(|r| matches!(r.role, crate::api::routes::Role::Generate(_)))
        {
            return None;
        }
        let polled = matches!(
            head.path,
            "/health" | "/ready" | "/metrics" | "/admin/status" | "/ping" | "/version" | "/load"
        ) || (head.path == "/admin/spec" && head.method == Method::GET);
        Some(AccessLine {
            loudness: if polled { Loudness::Poll } else { Loudness::Info },
            started: Instant::now(),
            method: head.method.clone(),
            path: head.path.to_owned(),
        })
    }

    pub(crate) fn end(self, resp: &Response, id: &RequestId, peer: SocketAddr) {
        let (status, duration_ms) = (resp.status().as_u16(), crate::observe::ms(self.started.elapsed()));
        let (method, path, id, peer) = (self.method, self.path, &id.0, peer.ip());
        match self.loudness {
            Loudness::Poll => tracing::debug!(request_id = %id, %method, path, status, duration_ms, %peer, "request"),
            Loudness::Info => tracing::info!(request_id = %id, %method, path, status, duration_ms, %peer, "request"),
        }
    }
}

/// A key's SHA-256: keys are compared as digests of one length, in constant time (`subtle`),
/// so neither a key's length nor where a guess first differs shows in the time taken.
struct KeyDigest([u8; 32]);

impl KeyDigest {
    fn of(key: &str) -> KeyDigest {
        use sha2::Digest as _;
        KeyDigest(sha2::Sha256::digest(key.as_bytes()).into())
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDigest(<redacted>)")
    }
}

/// The key a client presents: `Authorization: Bearer …` (OpenAI SDKs, Claude Code's
/// ANTHROPIC_AUTH_TOKEN) or `x-api-key` (the anthropic SDK).
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = || {
        let v = headers.get("authorization")?.to_str().ok()?;
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    };
    bearer().or_else(|| headers.get("x-api-key")?.to_str().ok().map(str::trim))
}

/// What the API keys guard: every upstream route that reaches the model or its tokenizer, and
/// `/metrics` unless METRICS_PUBLIC is set.
fn guarded(edge: &Edge, route: Option<&Route>, path: &str) -> bool {
    match route {
        Some(r) => r.needs_key(),
        None => path == "/metrics" && !edge.metrics_public,
    }
}

fn matches_any(token: Option<&str>, keys: &[KeyDigest]) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(token) = token else { return false };
    let presented = KeyDigest::of(token);
    // Compared with every key, so the time taken does not reveal which one matched.
    let hit = keys
        .iter()
        .fold(subtle::Choice::from(0), |hit, k| hit | k.0.ct_eq(&presented.0));
    hit.into()
}

/// An API key `authenticate` checked against API_KEYS.
#[derive(Debug, Clone)]
pub(crate) struct ValidatedKey(String);

impl ValidatedKey {
    pub(crate) fn into_string(self) -> String {
        self.0
    }
}

/// Step 3: the request may pass (with the API key it was checked by, if any), or its refusal.
pub(crate) fn authenticate(edge: &Edge, head: &Head<'_>) -> Result<Option<ValidatedKey>, GatewayError> {
    let mut validated = None;
    if !edge.api_keys.is_empty() && guarded(edge, head.route, head.path) {
        let key = presented_key(head.headers).filter(|k| matches_any(Some(k), &edge.api_keys));
        let Some(key) = key else {
            return Err(GatewayError::Unauthorized);
        };
        // The rate limiter keys on this key: it is validated now.
        validated = Some(ValidatedKey(key.to_owned()));
    }
    if head.path.starts_with("/admin") {
        match &edge.admin_token {
            Some(token) if !matches_any(presented_key(head.headers), std::slice::from_ref(token)) => {
                return Err(GatewayError::AdminUnauthorized);
            }
            Some(_) => {}
            None if !head.peer.ip().is_loopback() => {
                return Err(GatewayError::Forbidden(
                    "/admin answers only loopback clients when ADMIN_TOKEN is not set",
                ));
            }
            None => {}
        }
    }
    Ok(validated)
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

/// Step 4's headers for an admitted request's response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Allowance {
    limit: u32,
    remaining: u32,
}

impl Allowance {
    pub(crate) fn stamp(self, resp: &mut Response) {
        crate::api::error::rate_limit_headers(resp.headers_mut(), self.limit, self.remaining);
    }
}

/// Step 4: whether the request is within its rate (with the headers its response gets), or its
/// refusal (whose headers `GatewayError` renders). Upstream routes only, and only when
/// RATE_LIMIT_RPM is set.
pub(crate) fn rate_limit(
    edge: &Edge,
    head: &Head<'_>,
    key: Option<&ValidatedKey>,
) -> Result<Option<Allowance>, GatewayError> {
    let Some(limiter) = edge.limiter.as_ref().filter(|_| head.route.is_some()) else {
        return Ok(None);
    };
    // A validated key, or else the client address: never a header nobody checked, which a
    // client could change per request to escape the limit.
    let key = match key {
        Some(k) => format!("key:{}", k.0),
        None => format!("ip:{}", head.peer.ip()),
    };
    match limiter.limiter.check_key(&key) {
        Ok(snapshot) => Ok(Some(Allowance {
            limit: limiter.rpm,
            remaining: snapshot.remaining_burst_capacity(),
        })),
        Err(not_until) => {
            metrics::counter!(crate::observe::REJECTIONS, "reason" => crate::observe::Rejection::RateLimit.label())
                .increment(1);
            Err(GatewayError::RateLimited {
                limit: limiter.rpm,
                retry_after: not_until.wait_time_from(DefaultClock::default().now()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_generated_id_is_sg_and_24_hex_digits_and_differs_each_time() {
        let (a, b) = (super::generate_id(), super::generate_id());
        for id in [&a, &b] {
            let hex = id.strip_prefix("sg-").expect("sg- prefix");
            assert_eq!(hex.len(), 24, "{id}");
            assert!(
                hex.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
        }
        assert_ne!(a, b);
        let mut s = String::new();
        super::push_hex(&mut s, 0xab, 4);
        assert_eq!(s, "00ab");
    }
}
