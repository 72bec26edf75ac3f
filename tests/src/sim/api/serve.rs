//! The HTTP listener: uvicorn's behaviour the gateway can observe — HTTP/1.1 keep-alive closed
//! after `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` (5 s) idle, the `--api-key` scope, and the refuse-
//! connections fault.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::{json_response, Shared};
use crate::sim::faults::Faults;

/// A TCP stream that records when bytes last moved.
struct Tracked {
    inner: TcpStream,
    start: Instant,
    last: Arc<AtomicU64>,
}

impl Tracked {
    fn touch(&self) {
        self.last.store(self.start.elapsed().as_millis() as u64, SeqCst);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Holds a connection's in-flight count up until the response body is finished or dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

struct Guarded {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `--api-key` guards only `/v1`, `/v2`, `/inference` and `/cohere`; failure is a bare 401.
fn authorised(keys: &[[u8; 32]], req: &Request<Incoming>) -> bool {
    let path = req.uri().path();
    let guarded = ["/v1", "/v2", "/inference", "/cohere"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")));
    if keys.is_empty() || !guarded || req.method() == axum::http::Method::OPTIONS {
        return true;
    }
    let Some(value) = req.headers().get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some((scheme, token)) = value.split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer") && matches_any(token.trim(), keys)
}

/// A key's SHA-256: keys are compared as digests of one length, in constant time (`subtle`),
/// so neither a key's length nor where a guess first differs shows in the time taken.
fn digest(key: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(key.as_bytes()).into()
}

fn matches_any(token: &str, keys: &[[u8; 32]]) -> bool {
    use subtle::ConstantTimeEq as _;
    let presented = digest(token);
    // Compared with every key, so the time taken does not reveal which one matched.
    let hit = keys
        .iter()
        .fold(subtle::Choice::from(0), |hit, k| hit | k.ct_eq(&presented));
    hit.into()
}

async fn serve_connection(stream: TcpStream, router: Router, keys: Arc<Vec<[u8; 32]>>, idle: Duration) {
    let _ = stream.set_nodelay(true);
    let last = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let io = Tracked {
        inner: stream,
        start: Instant::now(),
        last: last.clone(),
    };
    let start = io.start;
    let flight = in_flight.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        let keys = keys.clone();
        let flight = flight.clone();
        async move {
            if !authorised(&keys, &req) {
                return Ok::<_, std::convert::Infallible>(json_response(
                    StatusCode::UNAUTHORIZED,
                    &serde_json::json!({"error": "Unauthorized"}),
                ));
            }
            flight.fetch_add(1, SeqCst);
            let guard = InFlight(flight);
            let resp: Response<Body> = match TowerToHyperService::new(router).call(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok(resp.map(|inner| Body::new(Guarded { inner, _guard: guard })))
        }
    });
    // uvicorn's httptools parser sets no limit on the number of headers; hyper's default is 100.
    let conn = hyper::server::conn::http1::Builder::new()
        .max_headers(1024)
        .timer(TokioTimer::new())
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)), if !closing => {
                let idle_for = start.elapsed().saturating_sub(Duration::from_millis(last.load(SeqCst)));
                if in_flight.load(SeqCst) == 0 && idle_for >= idle {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// Accepts connections until the process ends. While the refuse-connections fault is armed
/// the listener is closed and the open connections are dropped, as by a dead process: connects
/// are refused and kept-alive connections reset.
pub(crate) async fn serve(listener: TcpListener, app: Shared, faults: Arc<Faults>) {
    let addr = listener.local_addr().expect("bound listener");
    let keys: Arc<Vec<[u8; 32]>> = Arc::new(app.args.api_keys.iter().map(|k| digest(k)).collect());
    let idle = std::env::var("VLLM_HTTP_TIMEOUT_KEEP_ALIVE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(Duration::from_secs(5), Duration::from_secs_f64);
    let router = super::router(app);
    let mut listener = Some(listener);
    let mut open = tokio::task::JoinSet::new();
    loop {
        while open.try_join_next().is_some() {}
        if faults.refuse_connections.load(SeqCst) {
            listener = None;
            open.abort_all();
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let l = match &listener {
            Some(l) => l,
            None => match TcpListener::bind(addr).await {
                Ok(l) => listener.insert(l),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            accepted = l.accept() => {
                if let Ok((stream, _)) = accepted {
                    open.spawn(serve_connection(stream, router.clone(), keys.clone(), idle));
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{digest, matches_any};

    #[test]
    fn a_key_matches_only_itself_whatever_its_length() {
        let keys = [digest("sk-one"), digest("sk-two")];
        assert!(matches_any("sk-two", &keys));
        assert!(!matches_any("sk-tw", &keys), "a prefix");
        assert!(!matches_any("sk-two-and-more", &keys), "a longer key");
        assert!(!matches_any("sk-two", &[]), "no keys");
    }
}
