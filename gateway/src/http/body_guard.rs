//! The request body's bounds, as one layer: every request's body is wrapped (`Guarded`) so that
//! more than MAX_BODY_BYTES ends it with `BodyError::TooLarge` (413), and a body still arriving
//! BODY_TIMEOUT after it was first waited for (right after the head) ends with `BodyError::Timeout` (408) unless it has averaged
//! BODY_MIN_RATE bytes a second since (then it is looked at again each second) — so a client
//! trickling bytes holds its connection for BODY_TIMEOUT at most. The handler that reads the
//! body renders the error in its route's envelope.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::Request;
use metrics::counter;

use crate::api::body::{BodyError, BodyLimits};
use crate::observe;

/// The `Layer`: its service wraps each request's body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyGuardLayer(pub(crate) BodyLimits);

impl<S> tower::Layer<S> for BodyGuardLayer {
    type Service = BodyGuard<S>;
    fn layer(&self, inner: S) -> BodyGuard<S> {
        BodyGuard { inner, limits: self.0 }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BodyGuard<S> {
    inner: S,
    limits: BodyLimits,
}

impl<S, B> tower::Service<Request<B>> for BodyGuard<S>
where
    S: tower::Service<Request<Guarded<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> S::Future {
        let limits = self.limits;
        self.inner.call(req.map(|body| Guarded::new(body, limits)))
    }
}

pin_project_lite::pin_project! {
    /// A request body within its limits.
    pub(crate) struct Guarded<B> {
        #[pin]
        inner: B,
        limits: BodyLimits,
        // When the body first had to be waited for: the head came just before (a body that
        // arrives with its head never reads the clock).
        started: Option<Instant>,
        received: usize,
        // Armed on the first poll that waits: a body that arrives with its head never
        // needs a timer.
        deadline: Option<Pin<Box<tokio::time::Sleep>>>,
        ended: bool,
    }
}

impl<B> Guarded<B> {
    fn new(inner: B, limits: BodyLimits) -> Self {
        Guarded {
            inner,
            limits,
            started: None,
            received: 0,
            deadline: None,
            ended: false,
        }
    }
}

impl<B> Body for Guarded<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.received += frame.data_ref().map_or(0, Bytes::len);
                if *this.received > this.limits.max {
                    *this.ended = true;
                    return Poll::Ready(Some(Err(BodyError::TooLarge { limit: this.limits.max })));
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => {
                *this.ended = true;
                return Poll::Ready(Some(Err(BodyError::Read(e.to_string()))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        let limits = *this.limits;
        let started = *this.started.get_or_insert_with(Instant::now);
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until((started + limits.timeout).into())));
        while deadline.as_mut().poll(cx).is_ready() {
            let earned = limits.min_rate as f64 * started.elapsed().as_secs_f64();
            if limits.min_rate == 0 || (*this.received as f64) < earned {
                counter!(observe::BODY_TIMEOUTS).increment(1);
                *this.ended = true;
                let received = *this.received;
                return Poll::Ready(Some(Err(BodyError::Timeout {
                    after: limits.timeout,
                    received,
                })));
            }
            deadline
                .as_mut()
                .reset((Instant::now() + Duration::from_secs(1)).into());
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
