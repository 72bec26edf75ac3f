//! Panic containment as a layer: a panic in a handler's call or its future answers 500 in
//! vLLM's envelope (`GatewayError::Internal`), the panic is logged, and the connection and the
//! gateway keep serving. Ours rather than tower-http's `CatchPanicLayer`, which boxes every
//! response's body anew (an allocation per response, and a second dynamic call per stream
//! frame, on top of axum's own box): the same containment costs the request nothing here
//! (BENCHMARKS.md, "The request as a staged pipeline").

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::{IntoResponse, Response};
use hyper::Request;

use crate::api::error::GatewayError;

#[derive(Debug, Clone, Copy)]
pub(crate) struct ContainLayer;

impl<S> tower::Layer<S> for ContainLayer {
    type Service = Contain<S>;
    fn layer(&self, inner: S) -> Contain<S> {
        Contain(inner)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Contain<S>(S);

impl<S, B> tower::Service<Request<B>> for Contain<S>
where
    S: tower::Service<Request<B>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Contained<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Contained<S::Future> {
        match catch_unwind(AssertUnwindSafe(|| self.0.call(req))) {
            Ok(inner) => Contained::Running { inner },
            Err(panic) => Contained::Panicked {
                resp: Some(answer_panic(&*panic)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    #[project = Projected]
    pub(crate) enum Contained<F> {
        Running { #[pin] inner: F },
        Panicked { resp: Option<Response> },
    }
}

impl<F: Future<Output = Result<Response, Infallible>>> Future for Contained<F> {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            // A future that panicked is not polled again: its answer is the 500.
            Projected::Running { inner } => match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                Ok(polled) => polled,
                Err(panic) => Poll::Ready(Ok(answer_panic(&*panic))),
            },
            Projected::Panicked { resp } => Poll::Ready(Ok(resp.take().expect("polled after completion"))),
        }
    }
}

/// A panic as its answer: 500 in vLLM's envelope, the panic logged (its message only: no
/// request data).
fn answer_panic(panic: &(dyn Any + Send)) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    sparkgate_events::Event::HandlerPanicked {
        message: message.to_owned(),
    }
    .emit();
    GatewayError::Internal.into_response()
}
