//! The HTTP/1.1 client to vLLM rank 0. Each connection is driven inline by the task that uses
//! it: the request's own task polls the connection while it waits for the answer and while it
//! reads the body, so a token crosses no task boundary on its way to the client (a pooled
//! client runs every connection in a task of its own and hands each frame over a channel).
//! Idle connections wait in a pool and are dropped after 3 s, under vLLM's 5 s keep-alive, so
//! the gateway never reuses a connection vLLM is closing; one that closed anyway is noticed
//! before the request is written and the request goes out on a new one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use sparkgate_config::Secret;
use tokio::net::TcpStream;

const POOL_IDLE: Duration = Duration::from_secs(3);
const POOL_MAX_IDLE: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Why a request got no answer from rank 0.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The connection could not be made: the request never reached vLLM.
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    /// Connected, but the exchange failed.
    #[error("the request to rank 0 failed")]
    Send(#[source] hyper::Error),
}

impl UpstreamError {
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect { .. })
    }
}

type Driver = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// One connection: where requests go in, and the state machine that moves its bytes.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    driver: Driver,
    /// The driver finished (the connection closed); the connection is not reused.
    ended: bool,
}

impl Conn {
    /// Moves the connection's bytes as far as the socket allows, under `cx`.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.ended && Pin::new(&mut self.driver).poll(cx).is_ready() {
            self.ended = true;
        }
    }

    /// Whether an idle connection can take a request: open, and not closed by the peer
    /// (polled once, without a waker, to read a pending close).
    fn reusable(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        !self.ended && !self.send.is_closed() && self.send.is_ready()
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

#[derive(Default)]
struct Pool {
    idle: Mutex<Vec<Idle>>,
}

impl Pool {
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().expect("pool lock");
        while let Some(mut i) = idle.pop() {
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
        let mut idle = self.idle.lock().expect("pool lock");
        idle.retain(|i| i.since.elapsed() < POOL_IDLE);
        if idle.len() < POOL_MAX_IDLE {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

/// An upstream response body; reading it drives its connection, which goes back to the pool
/// once the body has ended.
pub(crate) struct UpstreamBody {
    body: Incoming,
    conn: Option<Conn>,
    pool: Weak<Pool>,
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(conn) = this.conn.as_mut() {
            conn.drive(cx);
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            if let (Some(conn), Some(pool)) = (this.conn.take(), this.pool.upgrade()) {
                pool.checkin(conn);
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").finish_non_exhaustive()
    }
}

#[derive(Clone)]
pub(crate) struct Upstream {
    base: String,
    /// `host:port` of `base`: what is dialled and sent as Host.
    authority: String,
    host: HeaderValue,
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
            host: HeaderValue::from_str(&authority).unwrap_or(HeaderValue::from_static("localhost")),
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
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.authority)).await {
            Err(_) => return Err(connect_err(std::io::ErrorKind::TimedOut.into())),
            Ok(r) => r.map_err(connect_err)?,
        };
        stream.set_nodelay(true).map_err(connect_err)?;
        let (send, driver) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Send)?;
        Ok(Conn {
            send,
            driver,
            ended: false,
        })
    }

    fn request(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        request_id: &str,
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        let mut req = Request::builder().method(method).uri(path_and_query);
        let h = req.headers_mut().expect("builder without errors");
        for (name, value) in headers {
            if !is_hop_by_hop(name) && name != header::CONTENT_LENGTH && name != "x-request-id" {
                h.append(name.clone(), value.clone());
            }
        }
        h.insert(header::HOST, self.host.clone());
        if let Some(key) = &self.api_key {
            h.insert(header::AUTHORIZATION, key.clone());
        }
        if let Ok(id) = HeaderValue::from_str(request_id) {
            h.insert("x-request-id", id);
        }
        req.body(Full::new(body)).expect("valid request parts")
    }

    /// Sends one request; `headers` are the client's (hop-by-hop and length headers dropped).
    pub(crate) async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        request_id: &str,
        body: Bytes,
    ) -> Result<hyper::Response<UpstreamBody>, UpstreamError> {
        let mut req = self.request(method, path_and_query, headers, request_id, body);
        loop {
            let (mut conn, pooled) = match self.pool.checkout() {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            let answer = {
                let mut answer = std::pin::pin!(conn.send.try_send_request(req));
                std::future::poll_fn(|cx| {
                    conn.drive(cx);
                    answer.as_mut().poll(cx)
                })
                .await
            };
            match answer {
                Ok(resp) => {
                    let pool = Arc::downgrade(&self.pool);
                    return Ok(resp.map(|body| UpstreamBody {
                        body,
                        conn: Some(conn),
                        pool,
                    }));
                }
                // A pooled connection that closed before the request was written: the request
                // never left, so it goes out again on a fresh connection.
                Err(mut e) if pooled && e.message().is_some() => {
                    req = e.take_message().expect("checked");
                }
                Err(e) => return Err(UpstreamError::Send(e.into_error())),
            }
        }
    }

    /// `GET /health` with a short timeout: true on 200. The body is read, so the connection
    /// goes back to the pool for the next probe.
    pub(crate) async fn healthy(&self) -> bool {
        use http_body_util::BodyExt as _;
        let none = HeaderMap::new();
        let probe = async {
            let r = self
                .send(Method::GET, "/health", &none, "sparkgate-health", Bytes::new())
                .await
                .ok()?;
            let ok = r.status() == 200;
            r.into_body().collect().await.ok()?;
            Some(ok)
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), probe).await,
            Ok(Some(true))
        )
    }
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
