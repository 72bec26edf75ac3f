//! HTTP probes of rank 0 on its loopback port: readiness (`/health` 200, the served name in
//! `/v1/models`, optionally a one-token completion), liveness (`/health`) and progress (vLLM's running-request gauge and generated-
//! token counter from `/metrics`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

#[derive(Debug, Clone)]
pub(crate) struct Probe {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    served: String,
    auth: Option<String>,
}

/// vLLM's counters that show whether rank 0 is making progress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub running: f64,
    pub waiting: f64,
    pub generated: f64,
    /// Engine steps so far: the count of `vllm:iteration_tokens_total`, one observation per
    /// step, prefill chunks included — the engine's heartbeat.
    pub steps: f64,
}

impl Progress {
    /// Read from rank 0's `/metrics` text (every engine's samples summed).
    pub fn of_exposition(text: &str) -> Progress {
        let value = |name: &str| {
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        Progress {
            running: value("vllm:num_requests_running"),
            waiting: value("vllm:num_requests_waiting"),
            generated: value("vllm:generation_tokens_total"),
            steps: value("vllm:iteration_tokens_total_count"),
        }
    }
}

/// How long a watch probe may take: a rank that does not answer within this is not well.
const WATCH_PROBE_LIMIT: Duration = Duration::from_secs(2);

impl Probe {
    pub(crate) fn new(base: String, served: String, api_key: Option<String>) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(3))
            .pool_timer(TokioTimer::new())
            .build(HttpConnector::new());
        Self {
            client,
            base,
            served,
            auth: api_key.map(|k| format!("Bearer {k}")),
        }
    }

    async fn get(&self, path: &str) -> Option<(u16, Bytes)> {
        self.send(
            Request::get(format!("{}{path}", self.base)),
            Bytes::new(),
            WATCH_PROBE_LIMIT,
        )
        .await
    }

    async fn send(&self, mut req: hyper::http::request::Builder, body: Bytes, limit: Duration) -> Option<(u16, Bytes)> {
        if let Some(a) = &self.auth {
            req = req.header("authorization", a);
        }
        let req = req.body(Full::new(body)).ok()?;
        let fut = async {
            let resp = self.client.request(req).await.ok()?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        };
        tokio::time::timeout(limit, fut).await.ok().flatten()
    }

    /// A one-token completion through the whole group: `/health` stays 200 on rank 0 even when a
    /// worker cannot take part, a generation cannot. `Err` says what came back instead.
    pub(crate) async fn generates(&self, limit: Duration) -> Result<(), String> {
        let body = serde_json::json!({"model": self.served, "prompt": "ping", "max_tokens": 1});
        let req = Request::post(format!("{}/v1/completions", self.base)).header("content-type", "application/json");
        match self.send(req, Bytes::from(body.to_string()), limit).await {
            Some((200, _)) => Ok(()),
            Some((status, body)) => Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))),
            None => Err(format!("no answer within {:.0} s", limit.as_secs_f64())),
        }
    }

    /// The boot-shape warm-up: for every concurrency 1..=`max_num_seqs`, that many short chats at
    /// once (thinking off, `draft_tokens + 2` tokens each, at least 8), so the engine has run
    /// each batch shape and the mode's draft length before clients arrive. Returns how many
    /// requests were sent and the failures' descriptions.
    pub(crate) async fn warm_up(&self, max_num_seqs: u32, draft_tokens: u32, limit: Duration) -> (usize, Vec<String>) {
        let body = serde_json::json!({
            "model": self.served,
            "messages": [{"role": "user", "content": "Warm-up. Reply with ok."}],
            "max_tokens": (draft_tokens + 2).max(8),
            "ignore_eos": true,
            "chat_template_kwargs": {"enable_thinking": false},
        })
        .to_string();
        let (mut sent, mut failures) = (0, Vec::new());
        for width in 1..=max_num_seqs {
            let requests = (0..width).map(|_| {
                let req = Request::post(format!("{}/v1/chat/completions", self.base))
                    .header("content-type", "application/json");
                self.send(req, Bytes::from(body.clone()), limit)
            });
            for answer in futures_util::future::join_all(requests).await {
                sent += 1;
                match answer {
                    Some((200, _)) => {}
                    Some((status, _)) => failures.push(format!("HTTP {status} at concurrency {width}")),
                    None => failures.push(format!("no answer within {} s at concurrency {width}", limit.as_secs())),
                }
            }
        }
        (sent, failures)
    }

    /// Rank 0's vLLM release, from `/version` (`{"version": "0.34.0"}`), placed among the
    /// releases sparkgate knows; `None` when it does not answer.
    pub(crate) async fn version(&self) -> Option<sparkgate_config::UpstreamVersion> {
        let (status, body) = self.get("/version").await?;
        sparkgate_config::UpstreamVersion::from_answer(&body).filter(|_| status == 200)
    }

    pub(crate) async fn healthy(&self) -> bool {
        matches!(self.get("/health").await, Some((200, _)))
    }

    /// Ready to serve: healthy and listing the served model.
    pub(crate) async fn ready(&self) -> bool {
        if !self.healthy().await {
            return false;
        }
        let needle = format!("\"id\":\"{}\"", self.served);
        matches!(self.get("/v1/models").await, Some((200, body)) if String::from_utf8_lossy(&body).contains(&needle))
    }

    /// Rank 0's `/metrics` text, when it answers 200.
    pub(crate) async fn scrape(&self) -> Option<std::sync::Arc<str>> {
        let (status, body) = self.get("/metrics").await?;
        if status != 200 {
            return None;
        }
        Some(String::from_utf8_lossy(&body).into())
    }
}
