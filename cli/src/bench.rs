//! `sparkgate bench`: the GLM guide's streaming decode benchmark (`tests/bench_decode.py`) as a
//! subcommand — structured and prose phases, several runs per concurrency, per-request TTFT,
//! inter-token latency and tokens/s, aggregates per concurrency, an optional coherence check —
//! against any OpenAI-compatible base URL (plain HTTP).

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::{json, Value};
use sparkgate_config::Config;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Phase {
    /// A counting task with a structured (JSON) answer: speculation's best case.
    Structured,
    /// An explanation in prose: speculation's typical case.
    Prose,
}

impl Phase {
    fn prompt(self) -> &'static str {
        match self {
            Phase::Structured => {
                "Count from 1 to 150. Answer with only a JSON array of the numbers, like [1, 2, 3], nothing else."
            }
            Phase::Prose => "Explain in plain prose how a hash map works: hashing, buckets, collisions and resizing.",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Structured => "structured",
            Phase::Prose => "prose",
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// OpenAI-compatible base URL, plain HTTP [default: http://127.0.0.1:PORT/v1].
    #[arg(long, visible_alias = "base-url", value_name = "URL")]
    url: Option<String>,
    /// Model name [default: the first of GET /models].
    #[arg(long)]
    model: Option<String>,
    /// Phases to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "structured,prose")]
    phase: Vec<Phase>,
    /// Accepted for the guide's command line (`--phase structured --structured`); no effect.
    #[arg(long, hide = true)]
    structured: bool,
    /// Runs per phase and concurrency.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// max_tokens of each request.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_tokens: u32,
    /// Concurrent streams per run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4", value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: Vec<u32>,
    /// Do not check that answers are usable (structured: parses as JSON; prose: ≥ 10 words).
    #[arg(long)]
    skip_coherence: bool,
    /// Ask for exactly max_tokens tokens (vLLM's `ignore_eos`), so every run decodes as long.
    #[arg(long)]
    ignore_eos: bool,
    /// Write every request's figures and the aggregates as JSON.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Bearer token [default: OPENAI_API_KEY, else the first of the configured API_KEYS].
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
}

/// One streamed request's figures.
#[derive(Debug, Clone, Serialize)]
struct RequestResult {
    ok: bool,
    error: Option<String>,
    tokens: u64,
    ttft_s: Option<f64>,
    /// Decode tokens/s after the first token: (tokens − 1) / (last − first).
    tokens_per_s: Option<f64>,
    itl_mean_s: Option<f64>,
    /// 95th percentile of the gaps between streamed chunks.
    itl_p95_s: Option<f64>,
    coherent: Option<bool>,
    /// Why the answer is not usable (when `coherent` is false).
    incoherent_because: Option<String>,
    #[serde(skip)]
    first_at: Option<Instant>,
    #[serde(skip)]
    last_at: Option<Instant>,
}

/// One phase at one concurrency, over its runs.
#[derive(Debug, Clone, Serialize)]
struct Aggregate {
    phase: Phase,
    concurrency: u32,
    requests: usize,
    failed: usize,
    incoherent: usize,
    /// Per run: Σ(tokens − 1) / (last token of the run − first token of the run).
    aggregate_tokens_per_s: Vec<f64>,
    aggregate_tokens_per_s_median: f64,
    aggregate_tokens_per_s_p95: f64,
    request_tokens_per_s_median: f64,
    request_tokens_per_s_p95: f64,
    ttft_s_median: f64,
    ttft_s_p95: f64,
    itl_s_median: f64,
    itl_s_p95: f64,
}

pub(super) fn run(config: &Config, args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.phase.is_empty() || args.concurrency.is_empty() {
        anyhow::bail!("--phase and --concurrency need at least one value");
    }
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}/v1", config.ports.public))
        .trim_end_matches('/')
        .to_owned();
    if base.starts_with("https://") {
        anyhow::bail!("{base}: sparkgate bench speaks plain HTTP only; point it at an http:// address");
    }
    let uri: hyper::Uri = base
        .parse()
        .map_err(|e| anyhow::anyhow!("--url {base:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        anyhow::bail!("--url {base:?} must look like http://host:port/v1");
    }
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()))
        .or_else(|| config.secrets.api_keys.first().map(|k| k.expose().to_owned()));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench(&base, api_key, args))
}

async fn bench(base: &str, api_key: Option<String>, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, base, api_key.as_deref()).await?,
    };
    let total_runs = args.phase.len() * args.concurrency.len() * args.runs as usize;
    let progress = Progress::new(total_runs);
    let mut results: Vec<(Phase, u32, Vec<Vec<RequestResult>>)> = Vec::new();
    println!(
        "sparkgate bench: {base} model {model}, max_tokens {}, {} run(s) each",
        args.max_tokens, args.runs
    );
    for &phase in &args.phase {
        for &concurrency in &args.concurrency {
            let mut runs = Vec::new();
            for _ in 0..args.runs {
                let body = request_body(&model, phase, &args);
                let tasks: Vec<_> = (0..concurrency)
                    .map(|_| {
                        let (client, url, key, body) = (
                            client.clone(),
                            format!("{base}/chat/completions"),
                            api_key.clone(),
                            body.clone(),
                        );
                        let timeout = Duration::from_secs(args.timeout_s);
                        sparkgate_task::spawn("bench-stream", async move {
                            stream_one(&client, &url, key.as_deref(), body, phase, timeout).await
                        })
                    })
                    .collect();
                let mut run = Vec::new();
                for t in tasks {
                    let mut r = t.await?;
                    if r.ok && !args.skip_coherence {
                        r.coherent = Some(r.coherent.unwrap_or(false));
                    } else {
                        r.coherent = None;
                    }
                    run.push(r);
                }
                progress.advance(phase, concurrency, aggregate_rate(&run));
                runs.push(run);
            }
            results.push((phase, concurrency, runs));
        }
    }
    progress.finish();
    let aggregates: Vec<Aggregate> = results.iter().map(|(p, c, runs)| aggregate(*p, *c, runs)).collect();
    print_table(&aggregates);
    if let Some(path) = &args.out {
        let requests: Vec<Value> = results
            .iter()
            .map(|(p, c, runs)| json!({"phase": p, "concurrency": c, "runs": runs}))
            .collect();
        let doc = json!({
            "base_url": base,
            "model": model,
            "max_tokens": args.max_tokens,
            "ignore_eos": args.ignore_eos,
            "aggregates": aggregates,
            "requests": requests,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let reasons = failure_reasons(&results);
    if !reasons.is_empty() {
        let (failed, incoherent): (usize, usize) = aggregates
            .iter()
            .fold((0, 0), |(f, i), a| (f + a.failed, i + a.incoherent));
        eprintln!("sparkgate bench: {failed} request(s) failed, {incoherent} gave an unusable answer:");
        for (why, count) in reasons {
            eprintln!("  {count} × {why}");
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn request_body(model: &str, phase: Phase, args: &BenchArgs) -> Bytes {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": phase.prompt()}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "chat_template_kwargs": {"enable_thinking": false},
    });
    if args.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    Bytes::from(body.to_string())
}

async fn first_model(client: &HttpClient, base: &str, api_key: Option<&str>) -> anyhow::Result<String> {
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
async fn stream_one(
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
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        return failed(format!("{status}: {}", error_message(&v)));
    }
    let (mut buf, mut text, mut chunk_times) = (Vec::<u8>::new(), String::new(), Vec::<Instant>::new());
    let (mut tokens, mut done, mut finish) = (None::<u64>, false, None::<String>);
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(f) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            Err(e) => return failed(format!("stream broke: {e}")),
        };
        let now = Instant::now();
        buf.extend_from_slice(&data);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let Some(payload) = event.strip_prefix(b"data: ") else {
                continue;
            };
            let payload = &payload[..payload.len() - 2];
            if payload == b"[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_slice(payload).unwrap_or(Value::Null);
            if let Some(msg) = v["error"]["message"].as_str() {
                return failed(format!("error event: {msg}"));
            }
            if let Some(t) = v["usage"]["completion_tokens"].as_u64() {
                tokens = Some(t);
            }
            if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
            let delta = &v["choices"][0]["delta"];
            let piece = [&delta["content"], &delta["reasoning_content"], &delta["reasoning"]]
                .iter()
                .filter_map(|p| p.as_str())
                .collect::<String>();
            if !piece.is_empty() {
                chunk_times.push(now);
                if delta["content"].is_string() {
                    text.push_str(delta["content"].as_str().unwrap_or_default());
                }
            }
        }
    }
    if !done {
        return failed("the stream ended without [DONE]".into());
    }
    let tokens = tokens.unwrap_or(chunk_times.len() as u64);
    let (first, last) = (chunk_times.first().copied(), chunk_times.last().copied());
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    let mut gaps: Vec<f64> = chunk_times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    gaps.sort_by(f64::total_cmp);
    let decode = (tokens > 1 && span > 0.0).then(|| (tokens - 1) as f64 / span);
    RequestResult {
        ok: true,
        error: None,
        tokens,
        ttft_s: first.map(|f| f.duration_since(started).as_secs_f64()),
        tokens_per_s: decode,
        itl_mean_s: decode.map(|d| 1.0 / d),
        itl_p95_s: (!gaps.is_empty()).then(|| percentile(&gaps, 0.95)),
        coherent: Some(incoherence(&text, prose, finish.as_deref()).is_none()),
        incoherent_because: incoherence(&text, prose, finish.as_deref()),
        first_at: first,
        last_at: last,
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

/// Σ(tokens − 1) over the run's requests / (the run's last token − its first token).
fn aggregate_rate(run: &[RequestResult]) -> Option<f64> {
    let ok: Vec<&RequestResult> = run.iter().filter(|r| r.ok && r.first_at.is_some()).collect();
    let first = ok.iter().filter_map(|r| r.first_at).min()?;
    let last = ok.iter().filter_map(|r| r.last_at).max()?;
    let span = last.duration_since(first).as_secs_f64();
    let tokens: u64 = ok.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    (span > 0.0 && tokens > 0).then(|| tokens as f64 / span)
}

/// Nearest-rank percentile of sorted values (0 for none).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v
}

fn aggregate(phase: Phase, concurrency: u32, runs: &[Vec<RequestResult>]) -> Aggregate {
    let all: Vec<&RequestResult> = runs.iter().flatten().collect();
    let rates: Vec<f64> = runs.iter().filter_map(|r| aggregate_rate(r)).collect();
    let sorted_rates = sorted(rates.iter().copied());
    let per_request = sorted(all.iter().filter_map(|r| r.tokens_per_s));
    let ttft = sorted(all.iter().filter_map(|r| r.ttft_s));
    let itl = sorted(all.iter().filter_map(|r| r.itl_mean_s));
    Aggregate {
        phase,
        concurrency,
        requests: all.len(),
        failed: all.iter().filter(|r| !r.ok).count(),
        incoherent: all.iter().filter(|r| r.coherent == Some(false)).count(),
        aggregate_tokens_per_s: rates,
        aggregate_tokens_per_s_median: percentile(&sorted_rates, 0.5),
        aggregate_tokens_per_s_p95: percentile(&sorted_rates, 0.95),
        request_tokens_per_s_median: percentile(&per_request, 0.5),
        request_tokens_per_s_p95: percentile(&per_request, 0.95),
        ttft_s_median: percentile(&ttft, 0.5),
        ttft_s_p95: percentile(&ttft, 0.95),
        itl_s_median: percentile(&itl, 0.5),
        itl_s_p95: percentile(&itl, 0.95),
    }
}

/// Each distinct reason a request failed or was unusable, with how often.
fn failure_reasons(results: &[(Phase, u32, Vec<Vec<RequestResult>>)]) -> Vec<(String, usize)> {
    let mut reasons: Vec<(String, usize)> = Vec::new();
    let all = results
        .iter()
        .flat_map(|(p, _, runs)| runs.iter().flatten().map(move |r| (p, r)));
    for (phase, r) in all {
        let why = match (&r.error, r.coherent, &r.incoherent_because) {
            (Some(e), _, _) => format!("{} failed: {e}", phase.name()),
            (None, Some(false), Some(because)) => format!("{}: {because}", phase.name()),
            _ => continue,
        };
        match reasons.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => reasons.push((why, 1)),
        }
    }
    reasons
}

fn print_table(aggregates: &[Aggregate]) {
    println!(
        "\n{:<10} {:>4} {:>8} {:>20} {:>20} {:>18} {:>18} {:>15}",
        "phase",
        "conc",
        "requests",
        "aggregate tok/s p50",
        "per-request tok/s",
        "TTFT ms p50/p95",
        "ITL ms p50/p95",
        "failed/unusable"
    );
    for a in aggregates {
        println!(
            "{:<10} {:>4} {:>8} {:>20.1} {:>20.1} {:>18} {:>18} {:>15}",
            a.phase.name(),
            a.concurrency,
            a.requests,
            a.aggregate_tokens_per_s_median,
            a.request_tokens_per_s_median,
            format!("{:.1}/{:.1}", a.ttft_s_median * 1e3, a.ttft_s_p95 * 1e3),
            format!("{:.2}/{:.2}", a.itl_s_median * 1e3, a.itl_s_p95 * 1e3),
            format!("{}/{}", a.failed, a.incoherent),
        );
    }
}

/// A progress bar on stderr when it is a terminal; nothing otherwise.
struct Progress {
    total: usize,
    done: std::sync::atomic::AtomicUsize,
    tty: bool,
}

impl Progress {
    fn new(total: usize) -> Self {
        Self {
            total,
            done: Default::default(),
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn advance(&self, phase: Phase, concurrency: u32, rate: Option<f64>) {
        let done = self.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if !self.tty {
            return;
        }
        let width = 30;
        let filled = done * width / self.total.max(1);
        let rate = rate.map_or("-".to_owned(), |r| format!("{r:.1} tok/s"));
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r[{}{}] {done}/{} runs  {} ×{concurrency}  last {rate}   ",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.total,
            phase.name()
        );
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
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
