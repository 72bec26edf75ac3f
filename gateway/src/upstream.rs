//! The pooled HTTP/1.1 client to vLLM rank 0. Pooled connections idle out after 3 s, under
//! vLLM's 5 s keep-alive, so the gateway never reuses a connection vLLM is closing.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use sparkgate_config::Secret;

const POOL_IDLE: Duration = Duration::from_secs(3);

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

#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    api_key: Option<HeaderValue>,
}

impl Upstream {
    /// `base` is `http://host:port`; `api_key` replaces the client's Authorization upstream.
    pub(crate) fn new(base: &str, api_key: Option<&Secret>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(256)
            .build(connector);
        let api_key = api_key
            .and_then(|k| HeaderValue::from_str(&format!("Bearer {}", k.expose())).ok())
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        Self {
            client,
            base: base.to_owned(),
            api_key,
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Sends one request; `headers` are the client's (hop-by-hop and length headers dropped).
    pub(crate) async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        request_id: &str,
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, hyper_util::client::legacy::Error> {
        let uri: Uri = format!("{}{}", self.base, path_and_query)
            .parse()
            .expect("base URL and path form a URI");
        let mut req = Request::builder().method(method).uri(uri);
        let h = req.headers_mut().expect("builder without errors");
        for (name, value) in headers {
            if !is_hop_by_hop(name) && name != header::CONTENT_LENGTH && name != "x-request-id" {
                h.append(name.clone(), value.clone());
            }
        }
        if let Some(key) = &self.api_key {
            h.insert(header::AUTHORIZATION, key.clone());
        }
        if let Ok(id) = HeaderValue::from_str(request_id) {
            h.insert("x-request-id", id);
        }
        let req = req.body(Full::new(body)).expect("valid request parts");
        self.client.request(req).await
    }

    /// `GET /health` with a short timeout: true on 200.
    pub(crate) async fn healthy(&self) -> bool {
        let none = HeaderMap::new();
        let probe = self.send(Method::GET, "/health", &none, "sparkgate-health", Bytes::new());
        matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Ok(r)) if r.status() == 200)
    }
}
