//! The edge's own checks, as steps of the tower stack (`stack.rs`): authentication — API keys
//! as `Authorization: Bearer` or `x-api-key`, found in the key ring (`control::keys`: SHA-256
//! digests compared in constant time), the admin token or an operator's console session
//! (`control::sessions`) on `/admin/*`, with a same-origin check on whatever a browser could
//! send across sites — and the per-key rate limit (governor), keyed by the key's name. A refusal
//! is answered in the route's envelope by the step layer.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::Response;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use hyper::Request;

use super::step::{Seen, Step};
use crate::api::error::GatewayError;
use crate::api::routes::Route;
use crate::control::keys::KeyRing;
use crate::control::sessions::{AdminDigest, Role, Sessions};

/// What the edge steps know: the keys and the limiter, from the configuration.
#[derive(Debug)]
pub(crate) struct Edge {
    /// API_KEYS and API_KEYS_FILE (`control::keys`), reloaded in place.
    pub(crate) keys: Arc<KeyRing>,
    /// The console's sessions, and ADMIN_TOKEN as it is compared (its SHA-256 digest).
    pub(crate) sessions: Arc<Sessions>,
    /// `/metrics` answers without an API key (METRICS_PUBLIC).
    metrics_public: bool,
    pub(crate) limiter: Option<Arc<Limiter>>,
}

impl Edge {
    /// No keys and no limit (tests).
    #[cfg(test)]
    pub(crate) fn empty() -> Edge {
        let keys = Arc::new(KeyRing::none());
        Edge {
            sessions: Arc::new(Sessions::new(std::time::Duration::from_secs(60), None, keys.clone())),
            keys,
            metrics_public: false,
            limiter: None,
        }
    }

    pub(crate) fn new(config: &sparkgate_config::Config, keys: Arc<KeyRing>) -> Edge {
        let g = &config.gateway;
        let admin = config.secrets.admin_token.as_ref().map(|t| AdminDigest::of(t.expose()));
        Edge {
            sessions: Arc::new(Sessions::new(g.console_session, admin, keys.clone())),
            keys,
            metrics_public: g.metrics_public,
            limiter: g.rate_limit_rpm.map(|rpm| Limiter::new(rpm, g.rate_limit_burst)),
        }
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

/// Query parameters that would carry a credential in a URL (logs, history, Referer).
const CREDENTIAL_PARAMS: [&str; 5] = ["token", "admin_token", "access_token", "api_key", "apikey"];

/// Where a browser says a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// `Sec-Fetch-Site: same-origin`, or an `Origin` whose host is the request's `Host`.
    Same,
    /// Another site's page sent it.
    Cross,
    /// Neither header: not a browser's fetch (curl, the CLI).
    Unsaid,
}

fn origin(headers: &HeaderMap) -> Origin {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match header("sec-fetch-site") {
        Some("same-origin") => return Origin::Same,
        Some("none") | None => {}
        Some(_) => return Origin::Cross,
    }
    match (header("origin"), header("host")) {
        (None, _) => Origin::Unsaid,
        (Some(o), Some(host)) if o.split_once("://").is_some_and(|(_, h)| h == host) => Origin::Same,
        (Some(_), _) => Origin::Cross,
    }
}

/// `/admin/*` and `/console/*`: no credential in the URL; nothing a browser sends from another
/// site changes anything; `/admin` needs the admin token or an operator's session cookie
/// (loopback peers need neither when ADMIN_TOKEN is not set), and a cookie's change must say it
/// came from the console's own page. The console's handlers check their own sessions.
fn guard_operator_paths<B>(edge: &Edge, req: &Request<B>, peer: std::net::SocketAddr) -> Result<(), GatewayError> {
    let query = req.uri().query().unwrap_or("");
    if query
        .split('&')
        .filter_map(|p| p.split('=').next())
        .any(|name| CREDENTIAL_PARAMS.iter().any(|c| c.eq_ignore_ascii_case(name)))
    {
        return Err(GatewayError::bad_request(
            "a credential is never taken from a URL (it would be kept in logs and history): send it in the Authorization header, or sign in at /console",
            "token",
        ));
    }
    let changes = !matches!(
        *req.method(),
        hyper::Method::GET | hyper::Method::HEAD | hyper::Method::OPTIONS
    );
    let from = origin(req.headers());
    if changes && from == Origin::Cross {
        return Err(GatewayError::Forbidden(
            "a request another site's page sent may not change anything here (Origin / Sec-Fetch-Site)",
        ));
    }
    if !req.uri().path().starts_with("/admin") {
        return Ok(());
    }
    let sessions = &edge.sessions;
    match (sessions.admin(), presented_key(req.headers())) {
        (Some(admin), Some(token)) if admin.matches(token) => return Ok(()),
        (_, Some(_)) if sessions.admin().is_some() => {
            sessions.throttled(peer.ip())?;
            return Err(sessions.failed(peer.ip(), GatewayError::AdminUnauthorized));
        }
        (None, _) if peer.ip().is_loopback() => return Ok(()),
        _ => {}
    }
    match crate::control::sessions::cookie(req.headers()).and_then(|id| sessions.find(id)) {
        Some(Role::Operator) if changes && from != Origin::Same => Err(GatewayError::Forbidden(
            "a change made with the console's cookie must come from its page (Origin or Sec-Fetch-Site: same-origin)",
        )),
        Some(Role::Operator) => Ok(()),
        Some(Role::Member(_)) => Err(GatewayError::Forbidden(
            "a team member's console session (signed in with an API key) may not use /admin",
        )),
        None if sessions.admin().is_some() => Err(GatewayError::AdminUnauthorized),
        None => Err(GatewayError::Forbidden(
            "/admin answers only loopback clients when ADMIN_TOKEN is not set",
        )),
    }
}

/// Checks API keys on the routes that reach the model or its tokenizer and on `/metrics`
/// (unless METRICS_PUBLIC), and the admin token on `/admin/*` (loopback peers only when no token
/// is set); the key it validated rides on in `Seen`, which the rate limit and the fair queue
/// key on.
#[derive(Debug, Clone)]
pub(crate) struct Authenticate(pub(crate) Arc<Edge>);

impl Step for Authenticate {
    type Carry = ();

    fn on_request<B>(&self, req: &mut Request<B>) -> Result<(), GatewayError> {
        let edge = &self.0;
        let (path, headers, peer) = (req.uri().path(), req.headers(), Seen::peer(req));
        let mut key = None;
        if edge.keys.required() && guarded(edge, Seen::route(req), path) {
            let Some(found) = presented_key(headers).and_then(|k| edge.keys.find(k)) else {
                return Err(GatewayError::Unauthorized);
            };
            // The rate limiter, the quotas and the fair queue key on its name: it is validated.
            key = Some(found);
        }
        if path.starts_with("/admin") || path.starts_with("/console") {
            guard_operator_paths(edge, req, peer)?;
        }
        if let Some(seen) = Seen::of_mut(req) {
            seen.key = key;
        }
        Ok(())
    }

    fn on_response(&self, (): (), _: &mut Response) {}
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

/// A request's allowance, stamped on its response as OpenAI's rate-limit headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Allowance {
    limit: u32,
    remaining: u32,
}

/// Requests per minute per validated API key, else per client address, on the upstream routes
/// (when RATE_LIMIT_RPM is set): never a header nobody checked, which a client could change per
/// request to escape the limit.
#[derive(Debug, Clone)]
pub(crate) struct RateLimit(pub(crate) Arc<Edge>);

impl Step for RateLimit {
    type Carry = Option<Allowance>;

    fn on_request<B>(&self, req: &mut Request<B>) -> Result<Option<Allowance>, GatewayError> {
        let Some(limiter) = self.0.limiter.as_ref().filter(|_| Seen::route(req).is_some()) else {
            return Ok(None);
        };
        let key = match Seen::of(req) {
            Some(Seen { key: Some(k), .. }) => format!("key:{}", k.name),
            _ => format!("ip:{}", Seen::peer(req).ip()),
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

    fn on_response(&self, allowance: Option<Allowance>, resp: &mut Response) {
        if let Some(a) = allowance {
            crate::api::error::rate_limit_headers(resp.headers_mut(), a.limit, a.remaining);
        }
    }
}
