//! One request of `sparkgate bench`: the phases' prompts, a streamed chat completion timed
//! chunk by chunk (time to first token, gaps, decode rate), and whether its answer is usable.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::ValueEnum;
use eventsource_stream::Eventsource as _;
use futures_util::StreamExt as _;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde_json::Value;

pub(crate) use super::https::HttpClient;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Phase {
    /// A counting task with a structured (JSON) answer: speculation's best case.
    Structured,
    /// An explanation in prose: speculation's typical case.
    Prose,
}

impl Phase {
    pub(crate) fn prompt(self) -> &'static str {
        match self {
            Phase::Structured => {
                "Count from 1 to 150. Answer with only a JSON array of the numbers, like [1, 2, 3], nothing else."
            }
            Phase::Prose => "Explain in plain prose how a hash map works: hashing, buckets, collisions and resizing.",
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Structured => "structured",
            Phase::Prose => "prose",
        }
    }
}

/// One streamed request's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RequestResult {
    pub(crate) ok: bool,
    pub(crate) error: Option<String>,
    pub(crate) tokens: u64,
    pub(crate) ttft_s: Option<f64>,
    /// Decode tokens/s after the first token: (tokens − 1) / (last − first).
    pub(crate) tokens_per_s: Option<f64>,
    pub(crate) itl_mean_s: Option<f64>,
    /// 95th percentile of the gaps between streamed chunks.
    pub(crate) itl_p95_s: Option<f64>,
    pub(crate) coherent: Option<bool>,
    /// Why the answer is not usable (when `coherent` is false).
    pub(crate) incoherent_because: Option<String>,
    #[serde(skip)]
    pub(crate) first_at: Option<Instant>,
    #[serde(skip)]
    pub(crate) last_at: Option<Instant>,
}

/// Nearest-rank percentile of sorted values (0 for none).
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub(crate) async fn first_model(client: &HttpClient, base: &str, api_key: Option<&str>) -> anyhow::Result<String> {
    let url = format!("{base}/models");
    let mut req = hyper::Request::get(&url);
    if let Some(k) = api_key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = client
        .request(req.body(Full::new(Bytes::new()))?)
        .await
        .map_err(|e| anyhow::anyhow!("nothing answers at {url}: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !status.is_success() {
        anyhow::bail!("GET {url}: {status}: {}", error_message(&v));
    }
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("GET {url} lists no model; pass --model"))
}

/// Sends one streaming chat request and times its chunks.
pub(crate) async fn stream_one(
    client: &HttpClient,
    url: &str,
    api_key: Option<&str>,
    body: Bytes,
    phase: Phase,
    timeout: Duration,
) -> RequestResult {
    match tokio::time::timeout(timeout, stream_inner(client, url, api_key, body, phase == Phase::Prose)).await {
        Ok(r) => r,
        Err(_) => failed(format!("no complete answer within {} s", timeout.as_secs())),
    }
}

fn failed(error: String) -> RequestResult {
    RequestResult {
        ok: false,
        error: Some(error),
        tokens: 0,
        ttft_s: None,
        tokens_per_s: None,
        itl_mean_s: None,
        itl_p95_s: None,
        coherent: None,
        incoherent_because: None,
        first_at: None,
        last_at: None,
    }
}

async fn stream_inner(
    client: &HttpClient,
    url: &str,
    api_key: Option<&str>,
    body: Bytes,
    prose: bool,
) -> RequestResult {
    let mut req = hyper::Request::post(url).header("content-type", "application/json");
    if let Some(k) = api_key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = match req.body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    let started = Instant::now();
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => return failed(format!("{url}: {e}")),
    };
    let status = resp.status();
    let body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        return failed(format!("{status}: {}", error_message(&v)));
    }
    let mut events = Events::default();
    let mut stream = std::pin::pin!(body.into_data_stream().eventsource());
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => return failed(format!("stream broke: {e}")),
        };
        if let Err(e) = events.on_event(&event.data, Instant::now()) {
            return failed(e);
        }
    }
    if !events.done {
        return failed("the stream ended without [DONE]".into());
    }
    events.result(started, prose)
}

/// A chat completion's server-sent events as they arrive (read by eventsource-stream): the
/// answer's text, when each chunk with text came, the token count and finish reason the stream
/// reported, and `[DONE]`.
#[derive(Debug, Default)]
struct Events {
    text: String,
    chunk_times: Vec<Instant>,
    tokens: Option<u64>,
    done: bool,
    finish: Option<String>,
}

impl Events {
    /// Takes in one event's data (received at `now`); Err: the stream's error event.
    fn on_event(&mut self, payload: &str, now: Instant) -> Result<(), String> {
        {
            if payload == "[DONE]" {
                self.done = true;
                return Ok(());
            }
            let v: Value = serde_json::from_str(payload).unwrap_or(Value::Null);
            if let Some(msg) = v["error"]["message"].as_str() {
                return Err(format!("error event: {msg}"));
            }
            if let Some(t) = v["usage"]["completion_tokens"].as_u64() {
                self.tokens = Some(t);
            }
            if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                self.finish = Some(f.to_owned());
            }
            let delta = &v["choices"][0]["delta"];
            let piece = [&delta["content"], &delta["reasoning_content"], &delta["reasoning"]]
                .iter()
                .filter_map(|p| p.as_str())
                .collect::<String>();
            if !piece.is_empty() {
                self.chunk_times.push(now);
                if delta["content"].is_string() {
                    self.text.push_str(delta["content"].as_str().unwrap_or_default());
                }
            }
        }
        Ok(())
    }

    /// The figures of a finished stream that was sent at `started`.
    fn result(self, started: Instant, prose: bool) -> RequestResult {
        let tokens = self.tokens.unwrap_or(self.chunk_times.len() as u64);
        let (first, last) = (self.chunk_times.first().copied(), self.chunk_times.last().copied());
        let span = match (first, last) {
            (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
            _ => 0.0,
        };
        let mut gaps: Vec<f64> = self
            .chunk_times
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
            .collect();
        gaps.sort_by(f64::total_cmp);
        let decode = (tokens > 1 && span > 0.0).then(|| (tokens - 1) as f64 / span);
        let incoherent_because = incoherence(&self.text, prose, self.finish.as_deref());
        RequestResult {
            ok: true,
            error: None,
            tokens,
            ttft_s: first.map(|f| f.duration_since(started).as_secs_f64()),
            tokens_per_s: decode,
            itl_mean_s: decode.map(|d| 1.0 / d),
            itl_p95_s: (!gaps.is_empty()).then(|| percentile(&gaps, 0.95)),
            coherent: Some(incoherent_because.is_none()),
            incoherent_because,
            first_at: first,
            last_at: last,
        }
    }
}

/// The message of an OpenAI error envelope, or of FastAPI's `{"detail": …}` (unknown routes).
fn error_message(v: &Value) -> String {
    match (&v["error"]["message"], &v["detail"]) {
        (Value::String(m), _) | (_, Value::String(m)) => m.clone(),
        (_, Value::Null) => "no detail".to_owned(),
        (_, other) => other.to_string(),
    }
}

/// Why an answer is not usable, if it is not: structured answers must parse as JSON (an
/// object or array); prose needs at least ten words. A cut at max_tokens is said so.
fn incoherence(text: &str, prose: bool, finish: Option<&str>) -> Option<String> {
    let cut = if finish == Some("length") {
        " (cut at max_tokens: raise --max-tokens)"
    } else {
        ""
    };
    if prose {
        let words = text.split_whitespace().count();
        (words < 10).then(|| format!("prose answer of {words} words, fewer than 10{cut}"))
    } else {
        let parses = serde_json::from_str::<Value>(text.trim()).is_ok_and(|v| v.is_array() || v.is_object());
        (!parses).then(|| format!("structured answer is not a JSON object or array{cut}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coherence_rules_say_why() {
        assert_eq!(incoherence("[1, 2, 3]", false, Some("stop")), None);
        assert_eq!(
            incoherence("The numbers are one two three.", false, Some("stop")).as_deref(),
            Some("structured answer is not a JSON object or array")
        );
        assert_eq!(
            incoherence("[1, 2,", false, Some("length")).as_deref(),
            Some("structured answer is not a JSON object or array (cut at max_tokens: raise --max-tokens)")
        );
        let prose = "A hash map stores keys and values in buckets chosen by hashing the key.";
        assert_eq!(incoherence(prose, true, None), None);
        assert_eq!(
            incoherence("", true, None).as_deref(),
            Some("prose answer of 0 words, fewer than 10")
        );
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert_eq!(percentile(&v, 0.95), 5.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
