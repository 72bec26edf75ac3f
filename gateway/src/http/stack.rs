//! The gateway's HTTP service: one `tower::ServiceBuilder` stack, each cross-cutting concern a
//! layer, in the order they run (outermost first):
//!
//! 1. `MapRequestLayer(mark_sensitive)` — `Authorization` and `x-api-key` are marked sensitive
//!    before anything could log them (their `Debug` is `Sensitive`);
//! 2. `RequestIds` (ours, `ids.rs`) — a client's usable `X-Request-Id` kept, else ours
//!    (`sg-…`), echoed on every response;
//! 3. `ContainLayer` (ours, `contain.rs`) — a panic below answers 500 in vLLM's envelope (with
//!    its request id) and the connection, and the gateway, keep serving;
//! 4. `Routing` (ours) — the path made canonical and matched against the route table once;
//! 5. `AccessLog` (ours) — one line per response that is not a generation's;
//! 6. `Authenticate` (ours) — API keys, the admin token or an operator's console session on
//!    `/admin`, no credential in a `/admin` or `/console` URL, no cross-site change;
//! 7. `RateLimit` (ours, governor) — per validated key, else per client address;
//! 8. `AdmissionGate` (ours) — a generation arriving while the gateway shuts down is answered
//!    503 before its body is read;
//! 9. `BodyGuardLayer` (ours) — MAX_BODY_BYTES, BODY_TIMEOUT and BODY_MIN_RATE on the body;
//! 10. `Handler` — an upstream route's handler (`pipeline::upstream_route`), or the admin router
//!     merged with the console's (`console`: its own security headers on every answer).
//!
//! A step's refusal is answered in the route's own envelope (`step::StepLayer`) and passes back
//! out through the layers above it (logged, its id echoed).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use tower::ServiceBuilder;

use super::access::{AccessLog, Routing};
use super::body_guard::{BodyGuardLayer, Guarded};
use super::contain::ContainLayer;
use super::edge::{Authenticate, Edge, RateLimit};
use super::ids::RequestIds;
use super::step::{Seen, Step, StepLayer};
use crate::api::body::BodyLimits;
use crate::api::error::GatewayError;
use crate::api::routes::Role;
use crate::app::Shared;
use crate::control::clients::Caller;
use crate::control::state::Lifecycle;

/// A service of the stack's shape over requests with bodies of type `B`: what `listen` runs
/// (with hyper's `Incoming`) and what the tests drive.
pub(crate) trait Stack<B>:
    tower::Service<Request<B>, Response = Response<Self::Body>, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
    type Body: http_body::Body<Data = bytes::Bytes, Error: Into<tower::BoxError>> + Send + 'static;
}

impl<S, B, RB> Stack<B> for S
where
    S: tower::Service<Request<B>, Response = Response<RB>, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static,
    RB: http_body::Body<Data = bytes::Bytes, Error: Into<tower::BoxError>> + Send + 'static,
{
    type Body = RB;
}

/// The whole stack over `app`, with the edge's keys and limiter and the body's limits.
pub(crate) fn stack(app: Shared, edge: Arc<Edge>, limits: BodyLimits) -> impl Stack<Incoming> {
    let sessions = edge.sessions.clone();
    layers(app.clone(), edge, limits, Handler::new(app, sessions))
}

/// The layers, in their order, around `inner` (the handler; a test's own service in tests).
fn layers<B, S>(app: Shared, edge: Arc<Edge>, limits: BodyLimits, inner: S) -> impl Stack<B>
where
    B: Send + 'static,
    S: tower::Service<Request<Guarded<B>>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let gate = AdmissionGate(app.clone());
    ServiceBuilder::new()
        .layer(tower::util::MapRequestLayer::new(mark_sensitive))
        .layer(StepLayer(RequestIds))
        .layer(ContainLayer)
        .layer(StepLayer(Routing))
        .layer(StepLayer(AccessLog))
        .layer(StepLayer(Authenticate(edge.clone())))
        .layer(StepLayer(RateLimit(edge)))
        .layer(StepLayer(gate))
        .layer(BodyGuardLayer(limits))
        .service(inner)
}

/// Marks the headers that carry keys as sensitive, so no `Debug` of the request prints them.
/// Ours rather than tower-http's `SetSensitiveRequestHeadersLayer`, whose entry walk over its
/// header list ran 892 instructions a request against 120 for these two lookups (BENCHMARKS.md).
fn mark_sensitive<B>(mut req: Request<B>) -> Request<B> {
    let headers = req.headers_mut();
    for name in [
        axum::http::header::AUTHORIZATION,
        axum::http::HeaderName::from_static("x-api-key"),
    ] {
        if let Some(v) = headers.get_mut(&name) {
            v.set_sensitive(true);
        }
    }
    req
}

/// Refuses a generation at once while the gateway shuts down (DESIGN.md's shutdown contract:
/// new requests are answered 503 + Retry-After), before its body is read.
#[derive(Debug, Clone)]
pub(crate) struct AdmissionGate(Shared);

impl Step for AdmissionGate {
    type Carry = ();

    fn on_request<B>(&self, req: &mut Request<B>) -> Result<(), GatewayError> {
        let generation = Seen::route(req).is_some_and(|r| matches!(r.role, Role::Generate(_)));
        if generation && self.0.control.lifecycle_now() != Lifecycle::Serving {
            return Err(GatewayError::ShuttingDown);
        }
        Ok(())
    }

    fn on_response(&self, (): (), _: &mut Response) {}
}

/// The innermost service: an upstream route's handler, or the gateway's own routes.
#[derive(Debug, Clone)]
pub(crate) struct Handler {
    app: Shared,
    own: Router,
}

impl Handler {
    fn new(app: Shared, sessions: Arc<crate::control::sessions::Sessions>) -> Handler {
        let own = crate::admin::routes::own_routes(app.clone()).merge(crate::console::routes(app.clone(), sessions));
        Handler { app, own }
    }
}

impl tower::Service<Request<Guarded<Incoming>>> for Handler {
    type Response = Response;
    type Error = Infallible;
    // Boxed: hyper keeps a connection's in-flight service future for the connection's life,
    // so inline, the generation path's whole state machine would be held by every idle
    // connection; boxed, it is freed once the response head is sent.
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Guarded<Incoming>>) -> Self::Future {
        use tower::ServiceExt as _;
        let seen = req.extensions_mut().remove::<Seen>();
        let Some((route, seen)) = seen.and_then(|s| match s.route {
            Some(route) => Some((route, s)),
            None => {
                // The gateway's own routes read their peer as axum's `ConnectInfo` (sign-in).
                req.extensions_mut().insert(axum::extract::ConnectInfo(s.peer));
                req.extensions_mut().insert(s.scheme);
                None
            }
        }) else {
            return Box::pin(self.own.clone().oneshot(req.map(Body::new)));
        };
        let caller = Caller {
            key: seen.key,
            addr: seen.peer.ip(),
        };
        let id = seen.id;
        let app = self.app.clone();
        Box::pin(async move {
            let id = id.to_str().unwrap_or("-");
            Ok(crate::pipeline::upstream_route(&app, route, id, req, caller).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    /// A handler that panics on `/v1/completions`, in its future, and answers 200 otherwise.
    #[derive(Clone)]
    struct Panicky;

    impl<B: Send + 'static> tower::Service<Request<B>> for Panicky {
        type Response = Response;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: Request<B>) -> Self::Future {
            let panics = req.uri().path() == "/v1/completions";
            Box::pin(async move {
                assert!(!panics, "a bug in a handler");
                Ok(Response::new(Body::from("fine")))
            })
        }
    }

    fn app() -> Shared {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = [
            ("DEPLOY_DIR", dir.path().to_str().unwrap()),
            ("UPSTREAM_URL", "http://127.0.0.1:9"),
        ];
        let config = sparkgate_config::Config::load(&sparkgate_config::LoadOptions {
            process_env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            working_dir: dir.path().to_path_buf(),
            ..Default::default()
        })
        .expect("a test configuration");
        let limits = crate::control::admission::QueueLimits {
            depth: 8,
            bytes: 1 << 20,
            timeout: std::time::Duration::from_secs(1),
        };
        let groups = Arc::new(crate::groups::Groups::of(&config, &crate::groups::Upstreams::Probe));
        crate::app::App::new(
            &config,
            crate::control::state::GatewayControl::new(limits),
            groups,
            None,
            (&[], None),
        )
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500_in_the_openai_envelope_and_the_stack_keeps_serving() {
        let limits = BodyLimits {
            max: 1 << 20,
            timeout: std::time::Duration::from_secs(5),
            min_rate: 0,
        };
        let app = app();
        let edge = Arc::new(Edge::empty());
        let svc = layers(app, edge, limits, Panicky);
        let post = |path: &str| {
            let mut req = Request::post(path)
                .body(http_body_util::Full::new(bytes::Bytes::from("{}")))
                .unwrap();
            req.extensions_mut()
                .insert(Seen::arrived(([127, 0, 0, 1], 1).into(), crate::app::Scheme::Http));
            req
        };
        let resp = svc.clone().oneshot(post("/v1/completions")).await.unwrap();
        assert_eq!(resp.status(), 500);
        assert!(
            resp.headers().get("x-request-id").is_some(),
            "the id is echoed on a panic too"
        );
        let Ok(body) = resp.into_body().collect().await.map(|c| c.to_bytes()) else {
            panic!("the 500's body reads")
        };
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], 500, "{v}");
        assert_eq!(v["error"]["type"], "Internal Server Error", "{v}");
        let resp = svc.oneshot(post("/v1/chat/completions")).await.unwrap();
        assert_eq!(resp.status(), 200, "the next request is served");
    }
}
