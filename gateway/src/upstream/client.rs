//! The HTTP/1.1 client to vLLM rank 0, its own (the wire is `wire`): each connection is driven
//! by the task that uses it — the request's own task writes the request, reads the answer and
//! its body — so a token crosses no task boundary and no channel on its way to the client.
//! A connection holds no buffer while it waits: reads go through one scratch buffer per thread
//! and only the bytes that arrived are kept, so an idle stream costs its socket and little else.
//! Idle connections wait in a pool and are dropped after 3 s, under vLLM's 5 s keep-alive, so
//! the gateway never reuses a connection vLLM is closing; one that closed anyway is noticed
//! before the request is written (a read without waiting), and a pooled connection that fails
//! before any byte of the answer arrived is replaced and the request sent again.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Response};
use bytes::{Buf as _, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use sparkgate_config::Secret;
use tokio::io::{AsyncRead, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;

use crate::upstream::wire::{self, Decoder, RequestHead, Step, WireError};

const POOL_IDLE: Duration = Duration::from_secs(3);
const POOL_MAX_IDLE: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The per-thread read buffer: one read takes at most this much.
const SCRATCH: usize = 16 * 1024;

/// Request headers that belong to one hop and are not forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Why a request got no (whole) answer from rank 0.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The connection could not be made: the request never reached vLLM.
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    /// Connected, but writing or reading failed.
    #[error("the exchange with rank 0 failed")]
    Io(#[source] std::io::Error),
    /// Rank 0's answer is not HTTP/1.1 the client can follow, or was cut.
    #[error("rank 0's answer could not be read")]
    Wire(#[source] WireError),
}

impl UpstreamError {
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect { .. })
    }
}

thread_local! {
    static SCRATCH_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; SCRATCH]);
}

/// One connection: the socket and the bytes read from it but not yet used.
struct Conn {
    io: TcpStream,
    pending: BytesMut,
}

impl Conn {
    /// Reads what the socket has (at most `SCRATCH`) onto `pending`; `Ok(0)` at end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        SCRATCH_BUF.with_borrow_mut(|scratch| {
            let mut rb = ReadBuf::new(scratch);
            ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
            self.pending.extend_from_slice(rb.filled());
            Poll::Ready(Ok(rb.filled().len()))
        })
    }

    /// Whether an idle connection can take a request: nothing unread, and no close or stray
    /// bytes waiting (a read that does not wait; tokio answers it without a system call when
    /// the last read drained the socket).
    fn reusable(&mut self) -> bool {
        if !self.pending.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        let mut rb = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(&mut self.io).poll_read(&mut cx, &mut rb).is_pending()
    }

    /// Drops the allocation of `pending` once everything in it was used.
    fn release(&mut self) {
        if self.pending.is_empty() {
            self.pending = BytesMut::new();
        }
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Idle connections, oldest first: each goes in at the back when its answer has ended, so
/// their idle times only grow towards the front, and the expired ones are a prefix.
#[derive(Default)]
struct Pool {
    idle: Mutex<VecDeque<Idle>>,
}

impl Pool {
    /// The most recently used connection that can still take a request.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().expect("pool lock");
        while let Some(mut i) = idle.pop_back() {
            if i.since.elapsed() < POOL_IDLE && i.conn.reusable() {
                return Some(i.conn);
            }
        }
        None
    }

    fn checkin(&self, mut conn: Conn) {
        if !conn.reusable() {
            return;
        }
        conn.release();
        // One clock read per checkin: the expired connections are dropped from the front, and
        // the first one still fresh ends the search (a clock read per idle connection was 3 %
        // of the gateway's CPU at 64 concurrent requests).
        let mut idle = self.idle.lock().expect("pool lock");
        // Read under the lock, so the queue's times only grow towards the back.
        let now = Instant::now();
        while idle.front().is_some_and(|i| now.duration_since(i.since) >= POOL_IDLE) {
            idle.pop_front();
        }
        if idle.len() < POOL_MAX_IDLE {
            idle.push_back(Idle { conn, since: now });
        }
    }
}

/// An upstream response body; reading it reads its connection, which goes back to the pool
/// as soon as the body has ended (and is closed when the body is dropped before that, which
/// vLLM takes as an abort).
pub(crate) struct UpstreamBody {
    conn: Option<Conn>,
    decoder: Decoder,
    keep_alive: bool,
    pool: Weak<Pool>,
}

impl UpstreamBody {
    /// The body has ended: its connection goes back to the pool when it can carry another.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            if let (true, Some(pool)) = (self.keep_alive, self.pool.upgrade()) {
                pool.checkin(conn);
            }
        }
    }

    fn fail(&mut self, err: UpstreamError) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        self.conn = None;
        Poll::Ready(Some(Err(err)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut conn.pending) {
                Err(e) => return this.fail(UpstreamError::Wire(e)),
                Ok(Step::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    } else {
                        conn.release();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::Done) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    // Closed by the peer: never reused, whatever the answer said.
                    this.keep_alive = false;
                    if let Err(e) = this.decoder.at_eof() {
                        return this.fail(UpstreamError::Wire(e));
                    }
                }
                Ok(_) => {}
                Err(e) => return this.fail(UpstreamError::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n as u64),
            None => SizeHint::default(),
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").finish_non_exhaustive()
    }
}

/// How one exchange on one connection failed: `resend` when nothing of the answer arrived on
/// a pooled connection, so vLLM did not take the request (it closed the connection first).
struct Failed {
    err: UpstreamError,
    resend: bool,
    /// The whole request was written: vLLM may have taken it before the connection closed.
    written: bool,
}

/// Writes the request and reads the answer's head on `conn`.
async fn exchange(conn: &mut Conn, head: &[u8], body: &Bytes, method: &Method) -> Result<wire::ResponseHead, Failed> {
    let mut out = head.chain(body.clone());
    if let Err(e) = conn.io.write_all_buf(&mut out).await {
        return Err(Failed {
            err: UpstreamError::Io(e),
            resend: true,
            written: false,
        });
    }
    let mut seen = false;
    loop {
        match wire::parse_response(&mut conn.pending, method) {
            Ok(Some(head)) => return Ok(head),
            Ok(None) => {}
            Err(e) => {
                return Err(Failed {
                    err: UpstreamError::Wire(e),
                    resend: false,
                    written: true,
                })
            }
        }
        let read = std::future::poll_fn(|cx| conn.poll_fill(cx)).await;
        let err = match read {
            Ok(0) => UpstreamError::Wire(WireError::Incomplete),
            Ok(_) => {
                seen = true;
                continue;
            }
            Err(e) => UpstreamError::Io(e),
        };
        let quiet_close = matches!(&err, UpstreamError::Wire(_))
            || matches!(&err, UpstreamError::Io(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
        return Err(Failed {
            err,
            resend: !seen && quiet_close,
            written: true,
        });
    }
}

#[derive(Clone)]
pub(crate) struct Upstream {
    base: String,
    /// `host:port` of `base`: what is dialled and sent as Host.
    authority: String,
    api_key: Option<HeaderValue>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// `base` is `http://host:port` (validated by the config); `api_key` replaces the client's
    /// Authorization upstream.
    pub(crate) fn new(base: &str, api_key: Option<&Secret>) -> Self {
        let authority = base.strip_prefix("http://").unwrap_or(base).to_owned();
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !authority.ends_with(']')
        {
            authority
        } else {
            format!("{authority}:80")
        };
        let api_key = api_key
            .and_then(|k| HeaderValue::from_str(&format!("Bearer {}", k.expose())).ok())
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        Self {
            base: base.to_owned(),
            authority,
            api_key,
            pool: Arc::new(Pool::default()),
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    async fn connect(&self) -> Result<Conn, UpstreamError> {
        let connect_err = |source| UpstreamError::Connect {
            authority: self.authority.clone(),
            source,
        };
        let io = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.authority)).await {
            Err(_) => return Err(connect_err(std::io::ErrorKind::TimedOut.into())),
            Ok(r) => r.map_err(connect_err)?,
        };
        io.set_nodelay(true).map_err(connect_err)?;
        Ok(Conn {
            io,
            pending: BytesMut::new(),
        })
    }

    /// Sends one request; `headers` are the client's (hop-by-hop and length headers dropped).
    pub(crate) async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        request_id: &str,
        body: Bytes,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let mut head = Vec::with_capacity(256 + 64 * headers.len());
        let req = RequestHead {
            method: &method,
            path: path_and_query,
            host: &self.authority,
            headers,
            authorization: self.api_key.as_ref(),
            request_id,
            body_len: body.len(),
        };
        wire::encode_request(&mut head, &req, is_hop_by_hop);
        // A pooled connection that closed after the whole request went out: most often vLLM's
        // keep-alive expiring, but a rank that died with the request in hand looks the same. If
        // the resend then cannot connect, the earlier failure is the answer — the request may
        // have reached vLLM, so it is not one that never did (`is_connect`).
        let mut earlier: Option<UpstreamError> = None;
        loop {
            let (mut conn, pooled) = match self.pool.checkout() {
                Some(conn) => (conn, true),
                None => match self.connect().await {
                    Ok(conn) => (conn, false),
                    Err(e) => return Err(earlier.unwrap_or(e)),
                },
            };
            match exchange(&mut conn, &head, &body, &method).await {
                Ok(answer) => return Ok(self.response(answer, conn)),
                Err(f) if pooled && f.resend => {
                    if f.written && earlier.is_none() {
                        earlier = Some(f.err);
                    }
                }
                Err(f) => return Err(f.err),
            }
        }
    }

    fn response(&self, answer: wire::ResponseHead, conn: Conn) -> Response<UpstreamBody> {
        let mut body = UpstreamBody {
            conn: Some(conn),
            decoder: answer.body,
            keep_alive: answer.keep_alive,
            pool: Arc::downgrade(&self.pool),
        };
        if body.decoder.is_done() {
            body.finish();
        }
        let mut resp = Response::new(body);
        *resp.status_mut() = answer.status;
        *resp.headers_mut() = answer.headers;
        resp
    }

    /// `GET /version` with a short timeout: rank 0's vLLM release, placed among the known ones.
    pub(crate) async fn version(&self) -> Option<sparkgate_config::UpstreamVersion> {
        let (ok, body) = self.probe("/version", "sparkgate-version").await?;
        sparkgate_config::UpstreamVersion::from_answer(&body).filter(|_| ok)
    }

    /// `GET /health` with a short timeout: true on 200.
    pub(crate) async fn healthy(&self) -> bool {
        matches!(self.probe("/health", "sparkgate-health").await, Some((true, _)))
    }

    /// A probe's `GET path` within 2 s: whether it answered 200, and its body. The body is read
    /// whole, so the connection goes back to the pool for the next probe.
    async fn probe(&self, path: &str, request_id: &str) -> Option<(bool, Bytes)> {
        use http_body_util::BodyExt as _;
        let none = HeaderMap::new();
        let read = async {
            let r = self
                .send(Method::GET, path, &none, request_id, Bytes::new())
                .await
                .ok()?;
            let ok = r.status() == 200;
            Some((ok, r.into_body().collect().await.ok()?.to_bytes()))
        };
        tokio::time::timeout(Duration::from_secs(2), read).await.ok().flatten()
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
