//! The SSE relay: vLLM's event bytes reach the client unchanged and unflushed-by-nobody (each
//! event is sent as it completes), while a tap reads them for time to first token, inter-event
//! gaps, exact token counts and upstream error events. The gateway's own accounting usage chunk
//! is removed, a stalled or broken upstream ends the stream with the route's error event (OpenAI:
//! an error chunk and `[DONE]`; Responses and Anthropic: `event: error`) — unless the stream can
//! be continued (`resume`): then it stays open, an SSE comment every 15 s, until the
//! continuation's chunks follow — and dropping the stream (client gone) drops the upstream
//! request, which vLLM aborts.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};
use metrics::counter;
use serde_json::Value;
use sparkgate_config::SpecMethod;

use crate::api::error::GatewayError;
use crate::api::family::Framing;
use crate::control::state::{GatewayControl, Lifecycle};
use crate::observe::{self, StreamEnd};
use crate::pipeline::hold::Held;
use crate::pipeline::resume::{self, Feed};
use crate::pipeline::trace::Trace;
use crate::upstream::{UpstreamBody, UpstreamError};

/// What a relay needs to know about its request.
#[derive(Debug)]
pub(crate) struct RelayCtx {
    pub(crate) started: Instant,
    pub(crate) usage_injected: bool,
    pub(crate) framing: Framing,
    pub(crate) first_token_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) mode: SpecMethod,
    pub(crate) control: GatewayControl,
    pub(crate) request_id: String,
    pub(crate) route: &'static str,
    /// The model name as the client sent it (for the log line).
    pub(crate) model: Option<std::sync::Arc<str>>,
    pub(crate) drain_timeout: Duration,
    /// Judged if the stream is cut under it (the poison-request guard, `quarantine`).
    pub(crate) suspect: Option<crate::quarantine::Suspect>,
    /// The stream's slots until its answer ends (fenced when it is cut).
    pub(crate) held: Option<Held>,
    /// How a cut would be continued (docs/resume.md), when it can be.
    pub(crate) resume: Option<Box<ResumePlan>>,
    /// A Responses stream whose answer is stored (docs/store.md): its final event waits for
    /// the write.
    pub(crate) stored: Option<std::sync::Arc<super::context::StorePlan>>,
    /// The request's account with its key, closed when the stream ends (`account`).
    pub(crate) account: Option<super::account::Account>,
}

/// What continuing a cut stream needs beyond its trace.
pub(crate) struct ResumePlan {
    pub(crate) app: std::sync::Arc<crate::app::App>,
    pub(crate) headers: axum::http::HeaderMap,
    pub(crate) forward: Bytes,
    /// The request's upstream route.
    pub(crate) path: &'static str,
    pub(crate) prefix: Option<u64>,
    /// Its model: a continuation waits for it to be loaded (MODELS).
    pub(crate) model: crate::api::models::ModelId,
}

impl std::fmt::Debug for ResumePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumePlan").finish_non_exhaustive()
    }
}

/// A stream is continued at most this many times; the next cut ends it with its error.
const MAX_RESUMES: u8 = 2;
/// How often a stream waiting for its continuation sends an SSE comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Resolves once the gateway's shutdown reaches `Closing` (never, if its sender is gone).
type ClosingWatch = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

fn closing_watch(mut rx: tokio::sync::watch::Receiver<Lifecycle>) -> ClosingWatch {
    Box::pin(async move {
        if rx.wait_for(|l| *l == Lifecycle::Closing).await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

/// What woke a waiting relay: the one input of `Relay::on_woke`.
#[derive(Debug)]
enum Woke {
    /// The upstream body's next frame, its end (`None`) or its failure.
    Frame(Option<Result<Frame<Bytes>, UpstreamError>>),
    /// The gateway shut down past DRAIN_TIMEOUT.
    Closing,
    /// The first-token or idle deadline passed.
    Deadline,
    /// The continuation's next event, or why it failed.
    Continued(Option<Result<Bytes, GatewayError>>),
    /// A stream waiting for its continuation is due an SSE comment.
    KeepAlive,
    /// The final event, once the answer is stored and its usage durable.
    Final(Bytes),
}

pub(crate) struct Relay {
    body: Option<UpstreamBody>,
    buf: BytesMut,
    scanned: usize,
    out: VecDeque<Bytes>,
    /// Final chunks held back until the injected usage chunk gives their system_fingerprint.
    held: Vec<Vec<u8>>,
    ctx: RelayCtx,
    first_at: Option<Instant>,
    last_at: Instant,
    /// Armed at or before the stream's deadline (first token, then idle); re-armed lazily when
    /// it fires early, so a token costs no timer update.
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The inter-token histogram, looked up once per stream rather than per token.
    itl: metrics::Histogram,
    usage: observe::Usage,
    /// The gateway's shutdown: at `Closing` the stream ends with the route's error. Made once
    /// per stream and polled only while the stream waits, so a token costs no registration.
    closing: ClosingWatch,
    saw_done: bool,
    done: bool,
    /// The upstream's answer ended by itself (vLLM has let go of the request).
    upstream_ended: bool,
    outcome: &'static str,
    /// What a stream that can be continued has sent so far.
    trace: Option<Box<Trace>>,
    /// The continuation under way, and the keep-alive comment's timer while it is.
    feed: Option<(Feed, std::pin::Pin<Box<tokio::time::Sleep>>)>,
    resumes: u8,
    /// The continuation's latest dispatch (`resume::Dispatch`), from the first cut on.
    dispatch: Option<resume::Dispatch>,
    /// The cut being continued: what the stream ends with if the continuation fails.
    cut_error: Option<GatewayError>,
    /// The final event, held while the answer is stored (`RelayCtx::stored`) and its usage made
    /// durable (`hold_final`).
    gate: Option<std::pin::Pin<Box<dyn std::future::Future<Output = Bytes> + Send>>>,
}

/// Where the literal `needle` first is in `hay`. Each needle's searcher is built once: building
/// one (`memmem::find` does it on every call) cost more than searching a token's event.
macro_rules! find {
    ($hay:expr, $needle:literal) => {{
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new($needle));
        FINDER.find($hay)
    }};
}

/// Whether `hay` holds the literal `needle` (a searcher built once, as `find!`).
macro_rules! contains {
    ($hay:expr, $needle:literal) => {
        find!($hay, $needle).is_some()
    };
}

/// Where the first event in `buf[from..]` ends: just past the empty line after a line's end,
/// each end LF or CRLF (vLLM writes LF; the SSE format allows CRLF too). Kept by hand, not read
/// by eventsource-stream: it finds the cut in place so whole events leave without a copy; a
/// property test holds it to eventsource-stream's reading (tests below).
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(p) = memchr::memchr(b'\n', &buf[at..]) {
        let next = at + p + 1;
        match buf.get(next) {
            Some(b'\n') => return Some(next + 1),
            Some(b'\r') if buf.get(next + 1) == Some(&b'\n') => return Some(next + 2),
            _ => at = next,
        }
    }
    None
}

/// Where the re-scan of a buffer with an unfinished tail starts: far enough back that a blank
/// line split across frames (`\r\n` + `\r\n`) is still seen whole.
fn rescan_from(len: usize) -> usize {
    len.saturating_sub(3)
}

/// Inserts `,"system_fingerprint":FP` before the closing brace of a held `data: {…}\n\n` chunk.
fn splice_fingerprint(chunk: &mut Vec<u8>, fingerprint: &Value) {
    if contains!(chunk, b"\"system_fingerprint\"") || !chunk.ends_with(b"}\n\n") {
        return;
    }
    let at = chunk.len() - 3;
    let insert = format!(",\"system_fingerprint\":{fingerprint}");
    chunk.splice(at..at, insert.into_bytes());
}

/// The `system_fingerprint` of a chunk (null when absent or unreadable); other keys skipped.
fn fingerprint_of(payload: &[u8]) -> Value {
    #[derive(serde::Deserialize)]
    struct Fingerprint {
        #[serde(default)]
        system_fingerprint: Value,
    }
    serde_json::from_slice::<Fingerprint>(payload).map_or(Value::Null, |f| f.system_fingerprint)
}

impl Relay {
    /// Ends the stream with the gateway's own error, rendered for this stream's framing.
    /// The upstream stream was cut (broken, truncated or idle): continued when it can be
    /// (docs/resume.md), else ended with its error.
    fn cut(&mut self, err: GatewayError) {
        let Some(plan) = self.ctx.resume.as_ref() else {
            return self.error_event(err);
        };
        let Some(trace) = self.trace.as_ref().filter(|t| !t.finished) else {
            return self.error_event(err);
        };
        if self.resumes >= MAX_RESUMES {
            counter!(observe::RESUME_FAILURES, "reason" => observe::ResumeFailure::TooMany.label()).increment(1);
            return self.error_event(err);
        }
        let continuation = resume::Continuation {
            app: plan.app.clone(),
            request_id: self.ctx.request_id.clone(),
            headers: plan.headers.clone(),
            forward: plan.forward.clone(),
            path: plan.path,
            prefix: plan.prefix,
            model: plan.model,
            trace: (**trace).clone(),
            suspect: self.ctx.suspect.take(),
            dispatch: self.dispatch.get_or_insert_with(resume::Dispatch::default).clone(),
            cut_at: Instant::now(),
        };
        sparkgate_events::Event::StreamCut {
            request_id: self.ctx.request_id.clone(),
            cut: err.to_string(),
            tokens: trace.output.len(),
        }
        .emit();
        self.cut_error = Some(err);
        if let Some(account) = self.ctx.account.as_mut() {
            account.cut();
        }
        // The cut request's connection closes (vLLM aborts it) and its slots go to the fence.
        self.body = None;
        drop(self.ctx.held.take());
        self.resumes += 1;
        let timer = Box::pin(tokio::time::sleep(KEEP_ALIVE));
        self.feed = Some((resume::start(continuation), timer));
    }

    fn error_event(&mut self, err: GatewayError) {
        let outcome = err.stream_end().label();
        if matches!(
            err,
            GatewayError::UpstreamBroke | GatewayError::UpstreamTruncated | GatewayError::StreamIdle { .. }
        ) {
            if let Some(suspect) = self.ctx.suspect.take() {
                suspect.on_cut();
            }
        }
        counter!(observe::STREAM_ERRORS, "reason" => outcome).increment(1);
        self.outcome = outcome;
        for h in std::mem::take(&mut self.held) {
            self.out.push_back(Bytes::from(h));
        }
        self.out.extend(err.stream_event(self.ctx.framing));
        // Dropping the upstream body closes its connection; vLLM aborts the request.
        self.body = None;
        self.feed = None;
        self.done = true;
    }

    fn on_event(&mut self, event: Bytes) {
        let event = match self.trace.as_mut() {
            Some(trace) => match trace.observe(event) {
                Some(e) => e,
                None => return,
            },
            None => event,
        };
        if let Some(account) = self.ctx.account.as_mut() {
            account.streamed(&event);
        }
        if let Some(held) = self.ctx.held.as_mut() {
            held.saw(&event);
        }
        let now = Instant::now();
        match self.first_at {
            None => {
                self.first_at = Some(now);
                if let Some(account) = self.ctx.account.as_mut() {
                    account.first_token(true);
                }
                observe::ttft(now.duration_since(self.ctx.started).as_secs_f64());
            }
            Some(_) => self.itl.record(now.duration_since(self.last_at).as_secs_f64()),
        }
        self.last_at = now;
        let payload = event.strip_prefix(b"data: ").map(|p| {
            p.strip_suffix(b"\n\n")
                .or_else(|| p.strip_suffix(b"\r\n\r\n"))
                .unwrap_or(p)
        });
        let Some(payload) = payload else {
            if self.on_named_event(&event) {
                return self.hold_final(event);
            }
            self.out.push_back(event);
            return;
        };
        if payload == b"[DONE]" {
            self.saw_done = true;
            for h in std::mem::take(&mut self.held) {
                self.out.push_back(Bytes::from(h));
            }
            return self.hold_final(event);
        }
        if payload.starts_with(b"{\"error\"") {
            counter!(observe::STREAM_ERRORS, "reason" => StreamEnd::UpstreamErrorEvent.label()).increment(1);
            self.outcome = StreamEnd::UpstreamErrorEvent.label();
            self.out.push_back(event);
            return;
        }
        if contains!(payload, b"\"choices\":[]") && contains!(payload, b"\"usage\":") {
            // The usage key read alone, as for a complete answer: no value tree of the chunk.
            self.usage.update(observe::Usage::of_body(payload));
            if self.ctx.usage_injected {
                let fingerprint = fingerprint_of(payload);
                for mut h in std::mem::take(&mut self.held) {
                    if !fingerprint.is_null() {
                        splice_fingerprint(&mut h, &fingerprint);
                    }
                    self.out.push_back(Bytes::from(h));
                }
                return;
            }
            self.out.push_back(event);
            return;
        }
        if self.ctx.usage_injected && contains!(payload, b"\"finish_reason\":\"") {
            self.held.push(event.to_vec());
            return;
        }
        self.out.push_back(event);
    }

    /// The answer's final event (`[DONE]`, `message_stop`, a Responses answer's last): its
    /// account is closed now and the event held until its usage is durable — a stored Responses
    /// answer written first — so an answer a client received whole is counted whatever happens
    /// to the gateway next.
    fn hold_final(&mut self, event: Bytes) {
        let committed = self.close_account();
        let stored = self.ctx.stored.take();
        if stored.is_none() && committed.is_now() {
            self.out.push_back(event);
            return;
        }
        self.gate = Some(Box::pin(async move {
            let event = match stored {
                Some(plan) => super::chain::persist_event(plan, event).await,
                None => event,
            };
            committed.durable().await;
            event
        }));
    }

    /// `event: …` frames (Responses, Anthropic): the final usage, the end, upstream errors.
    /// Whether it is the answer's final event (`response.completed` or `.incomplete`,
    /// `message_stop`).
    fn on_named_event(&mut self, event: &[u8]) -> bool {
        let data = || -> Value {
            event
                .split(|b| *b == b'\n')
                .find_map(|l| l.strip_prefix(b"data: "))
                .and_then(|d| serde_json::from_slice(d).ok())
                .unwrap_or(Value::Null)
        };
        if contains!(event, b"event: response.completed") || contains!(event, b"event: response.incomplete") {
            self.usage.update(observe::Usage::of(&data()["response"]["usage"]));
            return true;
        } else if contains!(event, b"event: message_start") {
            self.usage.update(observe::Usage::of(&data()["message"]["usage"]));
        } else if contains!(event, b"event: message_delta") {
            self.usage.update(observe::Usage::of(&data()["usage"]));
        } else if contains!(event, b"event: message_stop") {
            self.saw_done = true;
            return true;
        } else if event.starts_with(b"event: error") {
            counter!(observe::STREAM_ERRORS, "reason" => StreamEnd::UpstreamErrorEvent.label()).increment(1);
            self.outcome = StreamEnd::UpstreamErrorEvent.label();
        }
        false
    }

    fn on_data(&mut self, mut data: Bytes) {
        if self.buf.is_empty() {
            // The usual frame holds whole events: they are cut from it without a copy, and only
            // an unfinished tail waits in `buf`.
            while let Some(end) = event_end(&data, 0) {
                let event = data.split_to(end);
                self.on_event(event);
            }
            self.buf.extend_from_slice(&data);
            self.scanned = rescan_from(self.buf.len());
            return;
        }
        self.buf.extend_from_slice(&data);
        while let Some(end) = event_end(&self.buf, self.scanned) {
            let event = self.buf.split_to(end).freeze();
            self.scanned = 0;
            self.on_event(event);
        }
        self.scanned = rescan_from(self.buf.len());
        if self.buf.is_empty() {
            // Nothing unfinished: the buffer's allocation goes with the events cut from it.
            self.buf = BytesMut::new();
        }
    }

    /// Polls the upstream body, then the gateway's shutdown, then the stream's deadline (the
    /// timer is re-armed lazily when it fires before the deadline moved by the last token).
    fn poll_woke(&mut self, cx: &mut Context<'_>) -> Poll<Woke> {
        if let Some(gate) = self.gate.as_mut() {
            let event = ready!(gate.as_mut().poll(cx));
            self.gate = None;
            return Poll::Ready(Woke::Final(event));
        }
        if let Some((feed, keep_alive)) = self.feed.as_mut() {
            if let Poll::Ready(next) = feed.poll_recv(cx) {
                return Poll::Ready(Woke::Continued(next));
            }
            if self.closing.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woke::Closing);
            }
            ready!(keep_alive.as_mut().poll(cx));
            return Poll::Ready(Woke::KeepAlive);
        }
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(Woke::Frame(None));
        };
        if let Poll::Ready(frame) = Pin::new(body).poll_frame(cx) {
            return Poll::Ready(Woke::Frame(frame));
        }
        if self.closing.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Closing);
        }
        loop {
            ready!(self.timer.as_mut().poll(cx));
            let deadline = match self.first_at {
                None => self.ctx.started + self.ctx.first_token_timeout,
                Some(_) => self.last_at + self.ctx.idle_timeout,
            };
            if Instant::now() >= deadline {
                return Poll::Ready(Woke::Deadline);
            }
            self.timer.as_mut().reset(deadline.into());
        }
    }

    /// One step of the relay: what the wake-up means for the stream.
    fn on_woke(&mut self, woke: Woke) {
        let first = self.first_at.is_none();
        match woke {
            Woke::Closing => self.error_event(GatewayError::DrainTimeout {
                drain: self.ctx.drain_timeout,
            }),
            Woke::Deadline if first => self.error_event(GatewayError::FirstTokenTimeout {
                after: self.ctx.first_token_timeout,
            }),
            Woke::Deadline => self.cut(GatewayError::StreamIdle {
                after: self.ctx.idle_timeout,
            }),
            Woke::Continued(Some(Ok(data))) => {
                if let Some(account) = self.ctx.account.as_mut() {
                    account.continued();
                }
                self.on_data(data)
            }
            // The continuation was cut in turn: continued again from what went out, its own
            // dispatch judged by the poison guard.
            Woke::Continued(Some(Err(e @ GatewayError::UpstreamBroke))) => {
                self.ctx.suspect = self.dispatch.as_ref().and_then(|d| d.lock().expect("dispatch").take());
                self.cut(e)
            }
            Woke::Continued(Some(Err(GatewayError::NotContinued(detail)))) => {
                let cut = self.cut_error.take().unwrap_or(GatewayError::UpstreamBroke);
                self.error_event(GatewayError::ResumeFailed {
                    cut: Box::new(cut),
                    detail,
                })
            }
            Woke::Continued(Some(Err(e))) => self.error_event(e),
            Woke::Continued(None) => {
                self.feed = None;
                // A Responses stream has no `[DONE]`: its trace saw the generation's end.
                let ended = self.saw_done || self.trace.as_ref().is_some_and(|t| t.finished);
                if !ended {
                    self.error_event(GatewayError::UpstreamTruncated);
                }
                self.done = true;
            }
            Woke::Final(event) => self.out.push_back(event),
            Woke::KeepAlive => {
                self.out.push_back(Bytes::from_static(b": keep-alive\n\n"));
                if let Some((_, timer)) = self.feed.as_mut() {
                    timer.as_mut().reset((Instant::now() + KEEP_ALIVE).into());
                }
            }
            Woke::Frame(None) if self.body.is_none() => self.done = true,
            Woke::Frame(None) => {
                self.upstream_ended = true;
                if self.saw_done || self.ctx.framing == Framing::Responses {
                    for h in std::mem::take(&mut self.held) {
                        self.out.push_back(Bytes::from(h));
                    }
                    self.done = true;
                } else {
                    self.cut(GatewayError::UpstreamTruncated);
                }
            }
            Woke::Frame(Some(Err(_))) => self.cut(GatewayError::UpstreamBroke),
            Woke::Frame(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    self.on_data(data);
                }
                // The idle deadline can be earlier than the armed first-token one: re-arm once.
                if first && self.first_at.is_some() {
                    let idle = self.last_at + self.ctx.idle_timeout;
                    self.timer.as_mut().reset(idle.into());
                }
            }
        }
    }
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("request_id", &self.ctx.request_id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

mod end;
mod tap;
pub(crate) use tap::Tap;

impl Relay {
    fn new(body: Option<UpstreamBody>, ctx: RelayCtx) -> Self {
        Relay {
            body,
            buf: BytesMut::new(),
            scanned: 0,
            out: VecDeque::new(),
            held: Vec::new(),
            last_at: ctx.started,
            timer: Box::pin(tokio::time::sleep_until((ctx.started + ctx.first_token_timeout).into())),
            itl: observe::itl(),
            closing: closing_watch(ctx.control.lifecycle()),
            ctx,
            first_at: None,
            usage: observe::Usage::default(),
            saw_done: false,
            done: false,
            upstream_ended: false,
            outcome: "completed",
            trace: None,
            feed: None,
            resumes: 0,
            dispatch: None,
            cut_error: None,
            gate: None,
        }
    }
}

/// The client-facing event stream for one upstream SSE response, as a response body: each poll
/// sends what is queued (everything ready as one frame: one write for events that arrived
/// together), else waits for the next wake-up (`Woke`).
pub(crate) fn relay(upstream: UpstreamBody, ctx: RelayCtx, trace: Option<Trace>) -> Relay {
    let mut relay = Relay::new(Some(upstream), ctx);
    relay.trace = trace.map(Box::new);
    relay
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = coalesce(&mut this.out) {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let woke = ready!(this.poll_woke(cx));
            this.on_woke(woke);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.out.is_empty()
    }
}

/// All queued events as one buffer (none when the queue is empty).
fn coalesce(out: &mut VecDeque<Bytes>) -> Option<Bytes> {
    match out.len() {
        0 => None,
        1 => out.pop_front(),
        _ => {
            let mut all = BytesMut::with_capacity(out.iter().map(Bytes::len).sum());
            for b in out.drain(..) {
                all.extend_from_slice(&b);
            }
            Some(all.freeze())
        }
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
