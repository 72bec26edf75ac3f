//! The connection loop: accepts with a back-off on errors (a process out of file descriptors
//! logs once per burst and waits instead of spinning), caps open connections (MAX_CONNECTIONS;
//! one over it is answered 503 in vLLM's envelope and closed), serves HTTP/1.1 and HTTP/2 with
//! prior knowledge (h2c) on the same port (told apart by peeking at the first bytes, so each
//! connection runs hyper's own HTTP/1.1 or HTTP/2 server with nothing in between; with TLS_CERT
//! a TLS handshake first, ALPN choosing, and plain HTTP on that port answered 400 with the fix),
//! gives hyper's own answers to unparseable requests (400, 414, 431) the envelope too, answers a request head that stalls past
//! HEADER_READ_TIMEOUT with 408 (hyper would close silently), hands every request to `dispatch`,
//! and on shutdown drains the open connections for at most DRAIN_TIMEOUT.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};

use super::client_io::{answer, ClientIo, Handoff, FRESH_GRACE};
use super::stack::Stack;
use super::step::Seen;
use super::tls::{self, Tls};
use crate::api::error::GatewayError;
use crate::app::Scheme;

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

/// How connections are served: plain HTTP, or TLS first (TLS_CERT).
#[derive(Debug, Clone)]
pub(crate) enum Front {
    Plain,
    Tls(Arc<Tls>),
}

impl Front {
    /// Answers a connection the loop refuses (over MAX_CONNECTIONS, or at shutdown) in the
    /// protocol its client speaks: on the TLS port after a handshake (bounded like the answer).
    async fn refuse(self, mut stream: TcpStream, err: GatewayError) {
        match self {
            Front::Plain => answer(&mut stream, err).await,
            Front::Tls(tls) => {
                let shake = tokio::time::timeout(Duration::from_secs(2), tls.acceptor().accept(stream));
                if let Ok(Ok(mut tls_stream)) = shake.await {
                    answer(&mut tls_stream, err).await;
                }
            }
        }
    }
}

/// Answers every connection that arrives while the gateway shuts down, until dropped.
async fn refuse_arrivals(listener: &TcpListener, front: &Front, refusals: &mut tokio::task::JoinSet<()>) {
    loop {
        if let Ok((stream, _)) = listener.accept().await {
            refusals.spawn(front.clone().refuse(stream, GatewayError::ShuttingDown));
        }
    }
}

/// What a connection's first bytes say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// HTTP/2 with prior knowledge (h2c): the client opened with the HTTP/2 preface.
    H2c,
    /// A TLS handshake record.
    Tls,
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
        if head[0] == tls::HANDSHAKE {
            return Some(Protocol::Tls);
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
async fn drive<C, T>(
    mut conn: Pin<&mut C>,
    graceful: impl FnOnce(Pin<&mut C>),
    handoff: &Handoff<T>,
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

/// One accepted connection and what serving it needs.
struct Accepted<S> {
    peer: SocketAddr,
    stack: S,
    cfg: ListenConfig,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// Serves one connection until it closes or `stop` turns true: its protocol told by its first
/// bytes, on the TLS port after the handshake (h2 or HTTP/1.1 as ALPN chose).
async fn connection<S: Stack<Incoming>>(mut stream: TcpStream, front: Front, mut c: Accepted<S>) {
    let _ = stream.set_nodelay(true);
    let protocol = tokio::select! {
        p = sniff(&stream, c.cfg.header_read_timeout) => p,
        // Shutdown before the client sent anything: it gets the fresh connection's grace.
        _ = async { let _ = c.stop.wait_for(|s| *s).await; tokio::time::sleep(FRESH_GRACE).await } => None,
    };
    let Some(protocol) = protocol else { return };
    match (front, protocol) {
        (Front::Plain, Protocol::H2c) => serve_io(stream, Server::Http2, Scheme::Http, c).await,
        // A TLS client on the plain port gets hyper's 400: its library reports the mismatch.
        (Front::Plain, Protocol::Http1 | Protocol::Tls) => serve_io(stream, Server::Http1, Scheme::Http, c).await,
        (Front::Tls(_), Protocol::Http1 | Protocol::H2c) => {
            Box::pin(answer(&mut stream, GatewayError::PlainHttpToTls)).await;
        }
        // Boxed: inline, the handshake's state (rustls' connection) and the TLS stream's serving
        // would be part of every connection task, plain ones included.
        (Front::Tls(tls), Protocol::Tls) => Box::pin(serve_tls(stream, &tls, c)).await,
    }
}

/// The HTTP server run on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Http1,
    Http2,
}

/// The TLS handshake (bounded by HEADER_READ_TIMEOUT), then HTTP/2 or HTTP/1.1 as ALPN chose.
async fn serve_tls<S: Stack<Incoming>>(stream: TcpStream, tls: &Tls, c: Accepted<S>) {
    let shake = tokio::time::timeout(c.cfg.header_read_timeout, tls.acceptor().accept(stream));
    match shake.await {
        Ok(Ok(tls_stream)) => {
            let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
            let server = if h2 { Server::Http2 } else { Server::Http1 };
            serve_io(tls_stream, server, Scheme::Https, c).await;
        }
        Ok(Err(e)) => {
            metrics::counter!(crate::observe::TLS_HANDSHAKE_FAILURES).increment(1);
            tracing::debug!(peer = %c.peer, error = %e, "TLS handshake failed");
        }
        Err(_) => metrics::counter!(crate::observe::TLS_HANDSHAKE_FAILURES).increment(1),
    }
}

/// Runs hyper's HTTP/1.1 or HTTP/2 server on a connection's stream (TCP or TLS).
async fn serve_io<T, S>(stream: T, server: Server, scheme: Scheme, c: Accepted<S>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: Stack<Incoming>,
{
    let Accepted {
        peer,
        stack,
        cfg,
        mut stop,
    } = c;
    // Each request goes through the stack (`stack.rs`) with its peer's address; the stack's
    // handler boxes its own future, so an idle connection holds no generation's state.
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(Seen::arrived(peer, scheme));
        tower::ServiceExt::oneshot(stack.clone(), req)
    });
    let handoff = Arc::new(Handoff::default());
    let io = hyper_util::rt::TokioIo::new(ClientIo::new(stream, handoff.clone()));
    let ended = match server {
        Server::Http2 => {
            // Boxed: inline, HTTP/2's larger connection state would be part of every
            // connection task, HTTP/1.1 ones included (a task's state is its largest arm).
            let mut conn = Box::pin(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(io, service),
            );
            drive(conn.as_mut(), |c| c.graceful_shutdown(), &handoff, &mut stop).await
        }
        Server::Http1 => {
            let conn = hyper::server::conn::http1::Builder::new()
                .max_headers(MAX_HEADERS)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(cfg.header_read_timeout)
                .keep_alive(true)
                .serve_connection(io, service);
            tokio::pin!(conn);
            drive(conn, |c| c.graceful_shutdown(), &handoff, &mut stop).await
        }
    };
    // The connection is dropped by now, and with it hyper's side of the stream, which hands it
    // back if a request was in progress.
    let header_timeout = ended.err().is_some_and(|e| e.is_timeout());
    if let (true, Some(mut stream)) = (header_timeout, handoff.take()) {
        let after = cfg.header_read_timeout;
        // Boxed: inline, this future's 4 KiB scratch buffer would be part of every connection
        // task's state for as long as the connection lives.
        Box::pin(answer(&mut stream, GatewayError::HeaderTimeout { after })).await;
    }
}

/// Headers a request may carry. vLLM's server (uvicorn with httptools) counts none, so hyper's
/// default of 100 would refuse with 431 what vLLM serves; the head's size stays bounded by
/// hyper's buffer. Past 100, hyper keeps the parse's header slots on the heap.
const MAX_HEADERS: usize = 1024;

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
    (listener, front): (TcpListener, Front),
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
                        sparkgate_task::spawn("over-connections-answer", front.clone().refuse(stream, GatewayError::TooManyConnections { max }));
                        continue;
                    }
                    let accepted = Accepted { peer, stack: stack.clone(), cfg, stop: stop_rx.clone() };
                    connections.spawn(connection(stream, front.clone(), accepted));
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
        let refusing = refuse_arrivals(&listener, &front, &mut refusals);
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
    close_listener(listener, &front, refusals).await;
}

/// Closes the listener without resetting a connection queued on it. The kernel completes
/// handshakes on its own until the listener closes, and closing it resets every connection
/// still queued — a client that connected a moment before would see its request lost. So new
/// handshakes are stopped first (a filter that drops every packet to the listener: their
/// clients retry the SYN and then find the port closed — refused, not reset), then what is
/// already queued is answered.
async fn close_listener(listener: TcpListener, front: &Front, mut refusals: tokio::task::JoinSet<()>) {
    let drop_all = [socket2::SockFilter::new(BPF_RET_K, 0, 0, 0)];
    if let Err(e) = socket2::SockRef::from(&listener).attach_filter(&drop_all) {
        tracing::debug!(error = %e, "cannot stop new handshakes before closing the listener");
    }
    tokio::task::yield_now().await;
    while let Ok(Ok((stream, _))) = tokio::time::timeout(Duration::ZERO, listener.accept()).await {
        refusals.spawn(front.clone().refuse(stream, GatewayError::ShuttingDown));
    }
    drop(listener);
    // Each refusal ends within its own bound (`answer`).
    while refusals.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

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
