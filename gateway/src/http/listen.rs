//! The connection loop: accepts with a back-off on errors (a process out of file descriptors
//! logs once per burst and waits instead of spinning), caps open connections (MAX_CONNECTIONS;
//! one over it is answered 503 in vLLM's envelope and closed), serves HTTP/1.1 and HTTP/2 with
//! prior knowledge (h2c) on the same port (told apart by peeking at the first bytes, so each
//! connection runs hyper's own HTTP/1.1 or HTTP/2 server with nothing in between), gives hyper's own answers to unparseable requests
//! (400, 414, 431) the envelope too, answers a request head that stalls past
//! HEADER_READ_TIMEOUT with 408 (hyper would close silently), hands every request to `dispatch`,
//! and on shutdown drains the open connections for at most DRAIN_TIMEOUT.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};

use super::stack::Stack;
use super::step::Seen;
use crate::api::error::GatewayError;

/// What the loop needs from the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListenConfig {
    pub(crate) header_read_timeout: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) max_connections: usize,
}

/// The wait after a failed accept: doubles per consecutive failure, at most a second.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    logged_at: Option<Instant>,
    suppressed: u64,
}

impl Backoff {
    fn failed(&mut self, err: &std::io::Error) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let quiet = self.logged_at.is_some_and(|t| t.elapsed() < Duration::from_secs(10));
        if quiet {
            self.suppressed += 1;
        } else {
            tracing::warn!(error = %err, suppressed = self.suppressed, "accept failed; backing off (out of file descriptors?)");
            self.logged_at = Some(Instant::now());
            self.suppressed = 0;
        }
        Duration::from_millis(10u64 << self.failures.min(7)).min(Duration::from_secs(1))
    }

    fn succeeded(&mut self) {
        self.failures = 0;
    }
}

/// The envelope for a response hyper writes itself (a request it could not parse: 400, 414,
/// 431): hyper sends those with an empty body; clients get vLLM's error envelope instead.
fn envelope_for(head: &[u8]) -> Option<Vec<u8>> {
    // Every write to a client passes here: anything but a 4xx head is let through at once,
    // before a search.
    if !head.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let end = memchr::memmem::find(head, b"\r\n\r\n")?;
    let headers = &head[..end];
    let bare = memchr::memmem::find(headers, b"\r\ncontent-length: 0").is_some()
        && memchr::memmem::find(headers, b"content-type").is_none()
        && end + 4 == head.len();
    if !bare {
        return None;
    }
    let code = std::str::from_utf8(head.get(9..12)?).ok()?.parse::<u16>().ok()?;
    let status = axum::http::StatusCode::from_u16(code).ok()?;
    Some(GatewayError::UnparseableHttp { status }.to_http1())
}

/// What the connection task gets back from hyper's side of a connection: whether a request was
/// in progress, and the socket itself when hyper dropped it mid-request — hyper closes a
/// connection whose request head stalls without a word; the task answers 408 on it instead.
#[derive(Debug, Default)]
struct Handoff {
    /// Bytes arrived since the last answer was written: a request is in progress, so a header
    /// timeout is answered; an idle kept-alive connection is closed quietly.
    mid_request: AtomicBool,
    /// Any byte arrived yet, and its signal: a connection opened just before a shutdown is
    /// given a moment for its first request (`FRESH_GRACE`) instead of being closed under it.
    seen_bytes: AtomicBool,
    first_bytes: tokio::sync::Notify,
    socket: std::sync::Mutex<Option<TcpStream>>,
}

/// Headers a request may carry. vLLM's server (uvicorn with httptools) counts none, so hyper's
/// default of 100 would refuse with 431 what vLLM serves; the head's size stays bounded by
/// hyper's buffer. Past 100, hyper keeps the parse's header slots on the heap.
const MAX_HEADERS: usize = 1024;

/// How long a connection that has sent nothing yet may take for its first request once the
/// gateway shuts down (its client opened it a moment before; the request is on its way).
const FRESH_GRACE: Duration = Duration::from_secs(1);

impl Handoff {
    /// Resolves once the connection has sent something, or after `FRESH_GRACE`.
    async fn first_request_or_grace(&self) {
        let arrived = self.first_bytes.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        if !self.seen_bytes.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(FRESH_GRACE, arrived).await;
        }
    }
}

/// The client's stream as hyper sees it, with hyper's bare error responses given an envelope
/// (`envelope_for`); dropped mid-request, it hands its socket back (`Handoff`).
struct ClientIo {
    inner: Option<TcpStream>,
    handoff: Arc<Handoff>,
    /// A replacement being written, how much of it is out, and the length hyper asked for.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl ClientIo {
    fn socket(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.inner.as_mut().expect("the socket is handed back only on drop"))
    }
}

impl Drop for ClientIo {
    fn drop(&mut self) {
        if self.handoff.mid_request.load(Ordering::Relaxed) {
            *self.handoff.socket.lock().expect("handoff lock") = self.inner.take();
        }
    }
}

impl tokio::io::AsyncRead for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = self.socket().poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let got = buf.filled().len() > before;
            self.handoff.mid_request.store(got, Ordering::Relaxed);
            if got && !self.handoff.seen_bytes.swap(true, Ordering::AcqRel) {
                self.handoff.first_bytes.notify_waiters();
            }
        }
        polled
    }
}

impl tokio::io::AsyncWrite for ClientIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.handoff.mid_request.store(false, Ordering::Relaxed);
        if self.pending.is_none() {
            match envelope_for(buf) {
                Some(replacement) => self.pending = Some((replacement, 0, buf.len())),
                None => return self.socket().poll_write(cx, buf),
            }
        }
        let (replacement, mut done, reported) = self.pending.take().expect("set above");
        while done < replacement.len() {
            match self.socket().poll_write(cx, &replacement[done..]) {
                Poll::Ready(Ok(n)) => done += n,
                other => {
                    self.pending = Some((replacement, done, reported));
                    return other;
                }
            }
        }
        Poll::Ready(Ok(reported))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // hyper's own bare answers are a lone head: they go through `poll_write`'s check.
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next()) {
            return self.poll_write(cx, only);
        }
        self.handoff.mid_request.store(false, Ordering::Relaxed);
        self.socket().poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(tokio::io::AsyncWrite::is_write_vectored)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.socket().poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.socket().poll_shutdown(cx)
    }
}

fn close_write(socket: &TcpStream) -> std::io::Result<()> {
    match socket2::SockRef::from(socket).shutdown(std::net::Shutdown::Write) {
        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(()),
        other => other,
    }
}

/// Writes one of the connection loop's own answers (`GatewayError::to_http1`) and closes —
/// lingering: what the client sent is read and dropped until it closes too, so the close is no
/// reset that could destroy the answer before the client reads it.
async fn answer(socket: &TcpStream, err: GatewayError) {
    let bytes = err.to_http1();
    let write = async {
        let mut done = 0;
        while done < bytes.len() {
            socket.writable().await?;
            match socket.try_write(&bytes[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        close_write(socket)?;
        let mut scratch = [0u8; 4096];
        loop {
            socket.readable().await?;
            match socket.try_read(&mut scratch) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

/// Answers every connection that arrives while the gateway shuts down, until dropped.
async fn refuse_arrivals(listener: &TcpListener, refusals: &mut tokio::task::JoinSet<()>) {
    loop {
        if let Ok((stream, _)) = listener.accept().await {
            refusals.spawn(async move { answer(&stream, GatewayError::ShuttingDown).await });
        }
    }
}

/// The protocol a connection speaks, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// HTTP/2 with prior knowledge (h2c): the client opened with the HTTP/2 preface.
    H2c,
}

/// The start of the HTTP/2 connection preface (RFC 9113 §3.4); no HTTP/1.1 method is `PRI`.
const H2_START: &[u8] = b"PRI ";

/// Peeks at the first bytes (nothing is consumed): `None` when the client closed, or sent
/// nothing at all within `within`.
async fn sniff(stream: &TcpStream, within: Duration) -> Option<Protocol> {
    let deadline = tokio::time::Instant::now() + within;
    let mut head = [0u8; 4];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut head))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        if n >= H2_START.len() || head[..n] != H2_START[..n] {
            return Some(if head[..n] == *H2_START {
                Protocol::H2c
            } else {
                Protocol::Http1
            });
        }
        // A preface split after fewer than four bytes (rare): wait for the rest of it.
        tokio::time::sleep(Duration::from_millis(5)).await;
        if tokio::time::Instant::now() >= deadline {
            return Some(Protocol::Http1);
        }
    }
}

/// Drives a hyper connection until it ends or `stop` turns true; then shuts it down
/// gracefully (a connection that has sent nothing yet gets `FRESH_GRACE` first).
async fn drive<C>(
    mut conn: Pin<&mut C>,
    graceful: impl FnOnce(Pin<&mut C>),
    handoff: &Handoff,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> hyper::Result<()>
where
    C: Future<Output = hyper::Result<()>>,
{
    // Biased: a connection accepted just before shutdown is read first, so a request already
    // sent on it is in flight (and answered) before the graceful shutdown closes idle ones.
    tokio::select! {
        biased;
        ended = conn.as_mut() => ended,
        _ = async {
            let _ = stop.wait_for(|s| *s).await;
            handoff.first_request_or_grace().await;
        } => {
            graceful(conn.as_mut());
            conn.await
        }
    }
}

/// Serves one connection (HTTP/1.1 or h2c) until it closes or `stop` turns true.
async fn connection<S: Stack<Incoming>>(
    stream: TcpStream,
    peer: SocketAddr,
    stack: S,
    cfg: ListenConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let protocol = tokio::select! {
        p = sniff(&stream, cfg.header_read_timeout) => p,
        // Shutdown before the client sent anything: it gets the fresh connection's grace.
        _ = async { let _ = stop.wait_for(|s| *s).await; tokio::time::sleep(FRESH_GRACE).await } => None,
    };
    let Some(protocol) = protocol else { return };
    // Each request goes through the stack (`stack.rs`) with its peer's address; the stack's
    // handler boxes its own future, so an idle connection holds no generation's state.
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(Seen::arrived(peer));
        tower::ServiceExt::oneshot(stack.clone(), req)
    });
    let handoff = Arc::new(Handoff::default());
    let io = hyper_util::rt::TokioIo::new(ClientIo {
        inner: Some(stream),
        handoff: handoff.clone(),
        pending: None,
    });
    let ended = match protocol {
        Protocol::Http1 => {
            let conn = hyper::server::conn::http1::Builder::new()
                .max_headers(MAX_HEADERS)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(cfg.header_read_timeout)
                .keep_alive(true)
                .serve_connection(io, service);
            tokio::pin!(conn);
            drive(conn, |c| c.graceful_shutdown(), &handoff, &mut stop).await
        }
        Protocol::H2c => {
            // Boxed: inline, HTTP/2's larger connection state would be part of every
            // connection task, HTTP/1.1 ones included (a task's state is its largest arm).
            let mut conn = Box::pin(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(io, service),
            );
            drive(conn.as_mut(), |c| c.graceful_shutdown(), &handoff, &mut stop).await
        }
    };
    // The connection is dropped by now, and with it hyper's side of the socket, which hands it
    // back if a request was in progress.
    let header_timeout = ended.err().is_some_and(|e| e.is_timeout());
    let socket = handoff.socket.lock().expect("handoff lock").take();
    if let (true, Some(socket)) = (header_timeout, socket) {
        let after = cfg.header_read_timeout;
        // Boxed: inline, this future's 4 KiB scratch buffer would be part of every connection
        // task's state for as long as the connection lives.
        Box::pin(answer(&socket, GatewayError::HeaderTimeout { after })).await;
    }
}

/// What the loop tells the rest of the gateway as it shuts down.
pub(crate) struct ShutdownHooks {
    /// Shutdown begins (queued requests are answered; in-flight ones get the drain).
    pub(crate) draining: Box<dyn FnOnce() + Send>,
    /// DRAIN_TIMEOUT passed (what still runs ends with an explicit error).
    pub(crate) closing: Box<dyn FnOnce() + Send>,
}

impl std::fmt::Debug for ShutdownHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownHooks").finish_non_exhaustive()
    }
}

/// A classic-BPF `ret #0`: a socket filter that drops every packet.
const BPF_RET_K: u16 = 0x06;

/// How long connections get to send their final error events after the drain, before they
/// are closed.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Accepts until `shutdown` resolves, then drains: in-flight requests get DRAIN_TIMEOUT, then
/// whatever still runs is ended with an error (`ShutdownHooks`), then the connections close.
pub(crate) async fn run<S: Stack<Incoming>>(
    stack: S,
    listener: TcpListener,
    cfg: ListenConfig,
    shutdown: impl Future<Output = ()> + Send,
    hooks: ShutdownHooks,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = Backoff::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff.succeeded();
                    if connections.len() >= cfg.max_connections {
                        let max = cfg.max_connections;
                        sparkgate_task::spawn("over-connections-answer", async move { answer(&stream, GatewayError::TooManyConnections { max }).await });
                        continue;
                    }
                    connections.spawn(connection(stream, peer, stack.clone(), cfg, stop_rx.clone()));
                }
                Err(e) => tokio::time::sleep(backoff.failed(&e)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    (hooks.draining)();
    let _ = stop_tx.send(true);
    let (connections_open, drain_s) = (connections.len(), cfg.drain_timeout.as_secs());
    sparkgate_events::Event::Draining {
        connections: connections_open,
        drain_s,
    }
    .emit();
    let all_closed = |connections: &mut tokio::task::JoinSet<()>| {
        let mut c = std::mem::take(connections);
        async move { while c.join_next().await.is_some() {} }
    };
    let drain = all_closed(&mut connections);
    tokio::pin!(drain);
    // The listener stays open meanwhile: a connection that arrives is answered 503, not reset.
    let mut refusals = tokio::task::JoinSet::new();
    {
        let refusing = refuse_arrivals(&listener, &mut refusals);
        tokio::pin!(refusing);
        let drained = tokio::select! {
            done = tokio::time::timeout(cfg.drain_timeout, drain.as_mut()) => done.is_ok(),
            () = &mut refusing => false,
        };
        if !drained {
            sparkgate_events::Event::DrainTimeout {
                during: "the gateway's exit".into(),
            }
            .emit();
            (hooks.closing)();
            tokio::select! {
                done = tokio::time::timeout(CLOSE_GRACE, drain.as_mut()) => if done.is_err() {
                    tracing::info!("connections still open after the drain; closing them");
                },
                () = &mut refusing => {}
            }
        }
    }
    close_listener(listener, refusals).await;
}

/// Closes the listener without resetting a connection queued on it. The kernel completes
/// handshakes on its own until the listener closes, and closing it resets every connection
/// still queued — a client that connected a moment before would see its request lost. So new
/// handshakes are stopped first (a filter that drops every packet to the listener: their
/// clients retry the SYN and then find the port closed — refused, not reset), then what is
/// already queued is answered.
async fn close_listener(listener: TcpListener, mut refusals: tokio::task::JoinSet<()>) {
    let drop_all = [socket2::SockFilter::new(BPF_RET_K, 0, 0, 0)];
    if let Err(e) = socket2::SockRef::from(&listener).attach_filter(&drop_all) {
        tracing::debug!(error = %e, "cannot stop new handshakes before closing the listener");
    }
    tokio::task::yield_now().await;
    while let Ok(Ok((stream, _))) = tokio::time::timeout(Duration::ZERO, listener.accept()).await {
        refusals.spawn(async move { answer(&stream, GatewayError::ShuttingDown).await });
    }
    drop(listener);
    // Each refusal ends within its own bound (`answer`).
    while refusals.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bare_errors_get_the_envelope_and_ours_pass() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(envelope_for(bare).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"));
        assert!(out.contains("headers are too large"), "{out}");
        let body: serde_json::Value = serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"]["code"], 431);
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(envelope_for(ours).is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(envelope_for(ok).is_none(), "only error statuses");
    }

    #[test]
    fn accept_failures_back_off_to_a_second_and_log_once_per_burst() {
        let mut b = Backoff::default();
        let e = std::io::Error::from_raw_os_error(24);
        let waits: Vec<Duration> = (0..10).map(|_| b.failed(&e)).collect();
        assert_eq!(waits[0], Duration::from_millis(20));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert_eq!(*waits.last().unwrap(), Duration::from_secs(1));
        assert_eq!(b.suppressed, 9, "one log line for the burst");
        b.succeeded();
        assert_eq!(b.failed(&e), Duration::from_millis(20), "a success resets the wait");
    }
}
