//! `sparkgate bench`: the GLM guide's streaming decode benchmark (`tests/bench_decode.py`) as a
//! subcommand — structured and prose phases, several runs per concurrency, per-request TTFT,
//! inter-token latency and tokens/s, aggregates per concurrency, an optional coherence check —
//! against any OpenAI-compatible base URL (HTTP, or HTTPS checked against `--cacert`).

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};
use sparkgate_config::Config;

use crate::bench_request::{first_model, percentile, stream_one, HttpClient, Phase, RequestResult};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// OpenAI-compatible base URL, HTTP or HTTPS (--cacert) [default: http://127.0.0.1:PORT/v1,
    /// https:// under TLS_CERT].
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
        .unwrap_or_else(|| format!("{}/v1", super::https::local_base(config)))
        .trim_end_matches('/')
        .to_owned();
    let uri: hyper::Uri = base
        .parse()
        .map_err(|e| anyhow::anyhow!("--url {base:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        anyhow::bail!("--url {base:?} must look like http://host:port/v1 (or https://)");
    }
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()))
        .or_else(|| config.secrets.api_keys.first().map(|k| k.key.expose().to_owned()));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench(&base, api_key, args))
}

/// Every run's requests of one phase at one concurrency.
type Results = Vec<(Phase, u32, Vec<Vec<RequestResult>>)>;

async fn bench(base: &str, api_key: Option<String>, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let client: HttpClient = super::https::client_for(base)?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, base, api_key.as_deref()).await?,
    };
    let bench = Bench {
        client,
        base,
        api_key,
        model,
        args,
    };
    let results = bench.all_runs().await?;
    let aggregates: Vec<Aggregate> = results.iter().map(|(p, c, runs)| aggregate(*p, *c, runs)).collect();
    print_table(&aggregates);
    if let Some(path) = &bench.args.out {
        bench.write_out(path, &results, &aggregates)?;
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

/// One benchmark: the client, the endpoint and model, and the command line.
struct Bench<'a> {
    client: HttpClient,
    base: &'a str,
    api_key: Option<String>,
    model: String,
    args: BenchArgs,
}

impl Bench<'_> {
    /// Every phase at every concurrency, `--runs` times each, with a progress bar.
    async fn all_runs(&self) -> anyhow::Result<Results> {
        let args = &self.args;
        let progress = Progress::new(args.phase.len() * args.concurrency.len() * args.runs as usize);
        let mut results: Results = Vec::new();
        println!(
            "sparkgate bench: {} model {}, max_tokens {}, {} run(s) each",
            self.base, self.model, args.max_tokens, args.runs
        );
        for &phase in &args.phase {
            for &concurrency in &args.concurrency {
                let mut runs = Vec::new();
                for _ in 0..args.runs {
                    let run = self.run(phase, concurrency).await?;
                    progress.advance(phase, concurrency, aggregate_rate(&run));
                    runs.push(run);
                }
                results.push((phase, concurrency, runs));
            }
        }
        progress.finish();
        Ok(results)
    }

    /// One run: `concurrency` streams of `phase` at once; each answer checked unless
    /// `--skip-coherence`.
    async fn run(&self, phase: Phase, concurrency: u32) -> anyhow::Result<Vec<RequestResult>> {
        let body = request_body(&self.model, phase, &self.args);
        let tasks: Vec<_> = (0..concurrency)
            .map(|_| {
                let (client, url, key, body) = (
                    self.client.clone(),
                    format!("{}/chat/completions", self.base),
                    self.api_key.clone(),
                    body.clone(),
                );
                let timeout = Duration::from_secs(self.args.timeout_s);
                sparkgate_task::spawn("bench-stream", async move {
                    stream_one(&client, &url, key.as_deref(), body, phase, timeout).await
                })
            })
            .collect();
        let mut run = Vec::new();
        for t in tasks {
            let mut r = t.await?;
            if r.ok && !self.args.skip_coherence {
                r.coherent = Some(r.coherent.unwrap_or(false));
            } else {
                r.coherent = None;
            }
            run.push(r);
        }
        Ok(run)
    }

    /// `--out`: every request's figures and the aggregates as JSON.
    fn write_out(&self, path: &std::path::Path, results: &Results, aggregates: &[Aggregate]) -> anyhow::Result<()> {
        let requests: Vec<Value> = results
            .iter()
            .map(|(p, c, runs)| json!({"phase": p, "concurrency": c, "runs": runs}))
            .collect();
        let doc = json!({
            "base_url": self.base,
            "model": self.model,
            "max_tokens": self.args.max_tokens,
            "ignore_eos": self.args.ignore_eos,
            "aggregates": aggregates,
            "requests": requests,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
        Ok(())
    }
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

/// Σ(tokens − 1) over the run's requests / (the run's last token − its first token).
fn aggregate_rate(run: &[RequestResult]) -> Option<f64> {
    let ok: Vec<&RequestResult> = run.iter().filter(|r| r.ok && r.first_at.is_some()).collect();
    let first = ok.iter().filter_map(|r| r.first_at).min()?;
    let last = ok.iter().filter_map(|r| r.last_at).max()?;
    let span = last.duration_since(first).as_secs_f64();
    let tokens: u64 = ok.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    (span > 0.0 && tokens > 0).then(|| tokens as f64 / span)
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
fn failure_reasons(results: &Results) -> Vec<(String, usize)> {
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
