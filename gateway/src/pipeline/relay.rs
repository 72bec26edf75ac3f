//! The SSE relay: vLLM's event bytes reach the client unchanged and unflushed-by-nobody (each
//! event is sent as it completes), while a tap reads them for time to first token, inter-event
//! gaps, exact token counts and upstream error events. The gateway's own accounting usage chunk
//! is removed, a stalled or broken upstream ends the stream with the route's error event (OpenAI:
//! an error chunk and `[DONE]`; Responses and Anthropic: `event: error`), and dropping the stream
//! (client gone) drops the upstream request, which vLLM aborts.

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
}

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
        self.done = true;
    }

    fn on_event(&mut self, event: Bytes) {
        let now = Instant::now();
        match self.first_at {
            None => {
                self.first_at = Some(now);
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
            self.on_named_event(&event);
            self.out.push_back(event);
            return;
        };
        if payload == b"[DONE]" {
            self.saw_done = true;
            for h in std::mem::take(&mut self.held) {
                self.out.push_back(Bytes::from(h));
            }
            self.out.push_back(event);
            return;
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

    /// `event: …` frames (Responses, Anthropic): the final usage, the end, upstream errors.
    fn on_named_event(&mut self, event: &[u8]) {
        let data = || -> Value {
            event
                .split(|b| *b == b'\n')
                .find_map(|l| l.strip_prefix(b"data: "))
                .and_then(|d| serde_json::from_slice(d).ok())
                .unwrap_or(Value::Null)
        };
        if contains!(event, b"event: response.completed") || contains!(event, b"event: response.incomplete") {
            self.usage.update(observe::Usage::of(&data()["response"]["usage"]));
        } else if contains!(event, b"event: message_start") {
            self.usage.update(observe::Usage::of(&data()["message"]["usage"]));
        } else if contains!(event, b"event: message_delta") {
            self.usage.update(observe::Usage::of(&data()["usage"]));
        } else if contains!(event, b"event: message_stop") {
            self.saw_done = true;
        } else if event.starts_with(b"event: error") {
            counter!(observe::STREAM_ERRORS, "reason" => StreamEnd::UpstreamErrorEvent.label()).increment(1);
            self.outcome = StreamEnd::UpstreamErrorEvent.label();
        }
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
            Woke::Deadline => self.error_event(GatewayError::StreamIdle {
                after: self.ctx.idle_timeout,
            }),
            Woke::Frame(None) if self.body.is_none() => self.done = true,
            Woke::Frame(None) => {
                self.upstream_ended = true;
                if self.saw_done || self.ctx.framing == Framing::Responses {
                    for h in std::mem::take(&mut self.held) {
                        self.out.push_back(Bytes::from(h));
                    }
                    self.done = true;
                } else {
                    self.error_event(GatewayError::UpstreamTruncated);
                }
            }
            Woke::Frame(Some(Err(_))) => self.error_event(GatewayError::UpstreamBroke),
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

impl Drop for Relay {
    fn drop(&mut self) {
        let outcome = if self.done { self.outcome } else { "client_disconnected" };
        if let Some(t) = self.usage.completion {
            self.ctx.control.count_tokens(self.ctx.mode, t);
        }
        observe::generation_done(&observe::Finished {
            request_id: &self.ctx.request_id,
            route: self.ctx.route,
            status: 200,
            model: self.ctx.model.as_deref(),
            usage: self.usage,
            ttft: self.first_at.map(|f| f.duration_since(self.ctx.started)),
            duration: self.ctx.started.elapsed(),
            outcome,
        });
    }
}

/// The tap alone, without an upstream body: what `microbench` measures per frame.
pub(crate) struct Tap(Relay);

impl Tap {
    /// The tap of a chat stream without injected usage, at the default timeouts. Made inside a
    /// runtime: the stream's timer is armed on it.
    pub(crate) fn chat(control: GatewayControl) -> Self {
        let ctx = RelayCtx {
            started: Instant::now(),
            usage_injected: false,
            framing: Framing::Chat,
            first_token_timeout: Duration::from_secs(900),
            idle_timeout: Duration::from_secs(120),
            mode: SpecMethod::Dspark,
            control,
            request_id: "tap".into(),
            route: "chat",
            model: None,
            drain_timeout: Duration::from_secs(60),
            suspect: None,
        };
        Self(Relay::new(None, ctx))
    }

    /// One upstream frame in; what would go to the client now out.
    pub(crate) fn feed(&mut self, data: Bytes) -> Option<Bytes> {
        self.0.on_data(data);
        coalesce(&mut self.0.out)
    }
}

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
        }
    }
}

/// The client-facing event stream for one upstream SSE response, as a response body: each poll
/// sends what is queued (everything ready as one frame: one write for events that arrived
/// together), else waits for the next wake-up (`Woke`).
pub(crate) fn relay(upstream: UpstreamBody, ctx: RelayCtx) -> Relay {
    Relay::new(Some(upstream), ctx)
}

impl Relay {
    /// The stream stopped before vLLM's answer ended (the client left, or the gateway cut it):
    /// vLLM may still hold the request until it sees the connection close.
    pub(crate) fn cut_upstream(&self) -> bool {
        !self.upstream_ended
    }
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
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprint_is_spliced_before_the_closing_brace() {
        let mut chunk = br#"data: {"id":"x","choices":[{"index":0,"finish_reason":"stop"}]}"#.to_vec();
        chunk.extend_from_slice(b"\n\n");
        splice_fingerprint(&mut chunk, &json!("fp-1"));
        assert_eq!(
            String::from_utf8(chunk).unwrap(),
            "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}],\"system_fingerprint\":\"fp-1\"}\n\n"
        );
    }

    #[test]
    fn the_usage_chunks_fingerprint_is_read_and_its_absence_is_null() {
        let chunk = br#"{"id":"x","choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"fp-9"}"#;
        assert_eq!(fingerprint_of(chunk), json!("fp-9"));
        assert_eq!(fingerprint_of(br#"{"id":"x","choices":[]}"#), Value::Null);
        assert_eq!(fingerprint_of(b"not json"), Value::Null);
    }

    #[test]
    fn queued_events_leave_as_one_frame() {
        let mut q: VecDeque<Bytes> = VecDeque::new();
        assert_eq!(coalesce(&mut q), None);
        q.extend([Bytes::from_static(b"data: a\n\n"), Bytes::from_static(b"data: b\n\n")]);
        assert_eq!(coalesce(&mut q).as_deref(), Some(&b"data: a\n\ndata: b\n\n"[..]));
        assert!(q.is_empty());
    }

    fn tap() -> (tokio::runtime::Runtime, Tap) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let tap = {
            let _entered = rt.enter();
            let limits = crate::control::admission::QueueLimits {
                depth: 8,
                bytes: 1 << 20,
                timeout: Duration::from_secs(60),
            };
            Tap::chat({
                let c = GatewayControl::new(limits);
                c.set_mode(SpecMethod::Dspark);
                c
            })
        };
        (rt, tap)
    }

    #[test]
    fn whole_events_are_cut_from_their_frame_and_only_an_unfinished_tail_is_kept() {
        let (_rt, mut tap) = tap();
        let frame = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: c");
        let out = tap.feed(frame.clone()).unwrap();
        assert_eq!(out, "data: a\n\ndata: b\n\n");
        assert_eq!(&tap.0.buf[..], b"data: c");
        // The tail's end arrives split over two frames, the blank line across them.
        assert_eq!(tap.feed(Bytes::from_static(b"\n")), None);
        assert_eq!(
            tap.feed(Bytes::from_static(b"\ndata: d\n\n")).unwrap(),
            "data: c\n\ndata: d\n\n"
        );
        assert_eq!(tap.0.buf.capacity(), 0, "nothing unfinished: no buffer kept");
        // One event alone is passed on as the very bytes that arrived.
        let one = Bytes::from_static(b"data: e\n\n");
        assert_eq!(tap.feed(one.clone()).unwrap().as_ptr(), one.as_ptr());
    }

    #[test]
    fn events_end_at_blank_lines_of_lf_or_crlf() {
        assert_eq!(event_end(b"data: a\n\ndata: b", 0), Some(9));
        assert_eq!(event_end(b"data: a\n", 0), None);
        assert_eq!(event_end(b"xx\n\n", 2), Some(4));
        assert_eq!(event_end(b"data: a\r\n\r\ndata: b", 0), Some(11));
        assert_eq!(event_end(b"data: a\r\ndata: b\r\n", 0), None);
    }

    /// Streams of the shapes SSE allows: LF and CRLF line ends, comments, several `data:`
    /// lines, named events, an `id:`.
    const STREAMS: &[&str] = &[
        "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n",
        "data: one\r\n\r\ndata: two\r\n\r\n",
        ": keep-alive\n\ndata: x\n\n: another\r\n\r\ndata: y\r\n\r\n",
        "data: first line\ndata: second line\n\nevent: message_stop\ndata: {}\n\n",
        "event: response.completed\r\nid: 7\r\ndata: {\"r\":1}\r\n\r\ndata: z\n\r\n",
    ];

    /// What eventsource-stream reads from `chunks` (each a frame of the same stream).
    fn read_events(rt: &tokio::runtime::Runtime, chunks: Vec<Bytes>) -> Vec<(String, String)> {
        use eventsource_stream::Eventsource as _;
        use futures_util::StreamExt as _;
        let frames = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
        rt.block_on(
            frames
                .eventsource()
                .map(|e| e.expect("a valid stream"))
                .collect::<Vec<_>>(),
        )
        .into_iter()
        .map(|e| (e.event, e.data))
        .collect()
    }

    /// The events the tap cuts from `frames`, each as the bytes it passes on.
    fn cut(tap: &mut Tap, frames: &[&[u8]]) -> Vec<Bytes> {
        for f in frames {
            tap.0.on_data(Bytes::copy_from_slice(f));
        }
        tap.0.out.drain(..).collect()
    }

    #[test]
    fn the_tap_cuts_events_where_eventsource_stream_reads_them_at_every_split() {
        let (rt, _) = tap();
        for stream in STREAMS {
            let bytes = stream.as_bytes();
            let whole = read_events(&rt, vec![Bytes::copy_from_slice(bytes)]);
            assert!(!whole.is_empty(), "{stream:?}");
            for at in 0..=bytes.len() {
                let (_, mut t) = tap();
                let events = cut(&mut t, &[&bytes[..at], &bytes[at..]]);
                assert_eq!(events.concat(), bytes, "the tap passes every byte on, split at {at}");
                // Each cut event alone reads as the events of the whole stream, in order.
                let one_by_one: Vec<_> = events.iter().flat_map(|e| read_events(&rt, vec![e.clone()])).collect();
                assert_eq!(one_by_one, whole, "{stream:?} split at {at}");
            }
            let (_, mut t) = tap();
            let singles: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(cut(&mut t, &singles).concat(), bytes, "byte by byte");
        }
    }
}
