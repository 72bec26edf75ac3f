//! One tower `Layer` for the gateway's own edge steps (`Step`): a step looks at a request and
//! lets it pass, carrying something to its response, or refuses it; the refusal is answered
//! in the route's own envelope (`GatewayError::render` by the family the routing step found),
//! and whatever passed gets its response touched on the way out. Written once, with a future
//! that is a plain state machine — no step costs a request an allocation.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::Response;
use hyper::Request;

use crate::api::error::GatewayError;
use crate::api::family::Family;
use crate::api::routes::Route;

/// What the edge learns of a request, in one extension (one allocation, one lookup each): its
/// peer (put there by the connection loop), its id (`ids::RequestIds`), its route (`access::Routing`: the upstream route the
/// canonical path matched; `None` for the gateway's own or an unknown path) and the API key it
/// was validated by (`edge::Authenticate`).
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) peer: SocketAddr,
    /// Its id (`ids::RequestIds`).
    pub(crate) id: axum::http::HeaderValue,
    pub(crate) route: Option<&'static Route>,
    pub(crate) key: Option<crate::control::keys::KeyInfo>,
    /// Plain HTTP or the gateway's own TLS.
    pub(crate) scheme: crate::app::Scheme,
}

impl Seen {
    /// A request as it arrives from `peer`.
    pub(crate) fn arrived(peer: SocketAddr, scheme: crate::app::Scheme) -> Seen {
        Seen {
            peer,
            id: axum::http::HeaderValue::from_static("-"),
            route: None,
            key: None,
            scheme,
        }
    }

    pub(crate) fn of<B>(req: &Request<B>) -> Option<&Seen> {
        req.extensions().get::<Seen>()
    }

    pub(crate) fn of_mut<B>(req: &mut Request<B>) -> Option<&mut Seen> {
        req.extensions_mut().get_mut::<Seen>()
    }

    pub(crate) fn route<B>(req: &Request<B>) -> Option<&'static Route> {
        Seen::of(req).and_then(|s| s.route)
    }

    /// The request's id as text.
    pub(crate) fn id<B>(req: &Request<B>) -> &str {
        Seen::of(req).and_then(|s| s.id.to_str().ok()).unwrap_or("-")
    }

    pub(crate) fn peer<B>(req: &Request<B>) -> SocketAddr {
        Seen::of(req).map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |s| s.peer)
    }

    /// The envelope a refusal of `req` is answered in: its route's family, vLLM's otherwise.
    pub(crate) fn family<B>(req: &Request<B>) -> Family {
        Seen::route(req).map_or(Family::OpenAi, |r| r.family)
    }
}

/// One edge step.
pub(crate) trait Step: Clone + Send + Sync + 'static {
    /// What the step hands from the request to its response.
    type Carry: Send + 'static;

    /// Lets the request pass (it may change it: a canonical path, an extension) or refuses it.
    fn on_request<B>(&self, req: &mut Request<B>) -> Result<Self::Carry, GatewayError>;

    /// Touches the response of a request that passed (or was refused further in).
    fn on_response(&self, carry: Self::Carry, resp: &mut Response);
}

/// The `Layer` of a `Step`.
#[derive(Debug, Clone)]
pub(crate) struct StepLayer<T>(pub(crate) T);

impl<S, T: Step> tower::Layer<S> for StepLayer<T> {
    type Service = StepService<S, T>;
    fn layer(&self, inner: S) -> StepService<S, T> {
        StepService {
            inner,
            step: self.0.clone(),
        }
    }
}

/// A `Step` around the service it guards.
#[derive(Debug, Clone)]
pub(crate) struct StepService<S, T> {
    inner: S,
    step: T,
}

impl<S, T, B> tower::Service<Request<B>> for StepService<S, T>
where
    S: tower::Service<Request<B>, Response = Response>,
    T: Step,
{
    type Response = Response;
    type Error = S::Error;
    type Future = StepFuture<S::Future, T>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        match self.step.on_request(&mut req) {
            Ok(carry) => StepFuture::Passed {
                inner: self.inner.call(req),
                after: Some((self.step.clone(), carry)),
            },
            Err(refused) => StepFuture::Refused {
                resp: Some(refused.render(Seen::family(&req))),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, touched by the step; or the step's refusal.
    #[project = Projected]
    pub(crate) enum StepFuture<F, T: Step> {
        Passed { #[pin] inner: F, after: Option<(T, T::Carry)> },
        Refused { resp: Option<Response> },
    }
}

impl<F, E, T> Future for StepFuture<F, T>
where
    F: Future<Output = Result<Response, E>>,
    T: Step,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projected::Passed { inner, after } => {
                let mut resp = std::task::ready!(inner.poll(cx))?;
                if let Some((step, carry)) = after.take() {
                    step.on_response(carry, &mut resp);
                }
                Poll::Ready(Ok(resp))
            }
            Projected::Refused { resp } => Poll::Ready(Ok(resp.take().expect("polled after completion"))),
        }
    }
}
