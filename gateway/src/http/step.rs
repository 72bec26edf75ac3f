//! One tower `Layer` for the gateway's own edge steps (`Step`): a step looks at a request and
//! lets it pass, carrying something to its response, or refuses it; the refusal is answered
//! in the route's own envelope (`GatewayError::render` by the family the routing step found),
//! and whatever passed gets its response touched on the way out. Written once, with a future
//! that is a plain state machine — no step costs a request an allocation.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::Response;
use hyper::Request;

use crate::api::error::GatewayError;
use crate::api::family::Family;
use crate::api::routes::Route;

/// The upstream route a request's canonical path matched (`None`: the gateway's own or
/// unknown), as the routing step leaves it in the request's extensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routed(pub(crate) Option<&'static Route>);

impl Routed {
    pub(crate) fn of<B>(req: &Request<B>) -> Option<&'static Route> {
        req.extensions().get::<Routed>().and_then(|r| r.0)
    }

    /// The envelope a refusal of `req` is answered in: its route's family, vLLM's otherwise.
    pub(crate) fn family<B>(req: &Request<B>) -> Family {
        Routed::of(req).map_or(Family::OpenAi, |r| r.family)
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
                resp: Some(refused.render(Routed::family(&req))),
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
