//! Gateway overhead side by side: one vllm-sim (instant pacing, so the backend is not the
//! bottleneck) behind each front in turn — none, sparkgate, nginx, SMG, LiteLLM — driven by the
//! same load generator: (a) non-streaming small chats at concurrency 1/16/64, (b) streaming
//! 256-token answers (added TTFT and inter-token gaps, front CPU per 1000 requests), (c) idle
//! streams held open (front RSS per stream, against a simulator paced so slowly that they idle).
//! Prints ratio tables and writes JSON. `tests/overhead/run.sh` installs the peers and runs this.
//!
//! usage: overhead [--peers DIR] [--fronts direct,sparkgate,...] [--seconds S] [--rounds R]
//!                 [--streams N] [--idle N] [--out FILE] [--baseline SPARKGATE_BIN]
//!                 [--check RATIOS.json [--margin PCT]] [--bless RATIOS.json]
//!
//! After the tables, the same-run ratios (sparkgate ÷ nginx, SMG, LiteLLM per figure).
//! `--check` exits 1 when one is worse than the committed ratios by more than PCT (default 10);
//! `--bless` writes this run's ratios as the new baseline.
//!
//! `--baseline` adds a second sparkgate binary (say, a build of an earlier commit) as the front
//! `baseline`, right after `sparkgate`, so the two are compared within one run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::overhead::{ratios, Front, FrontKind, Peers};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const CONCURRENCIES: [usize; 3] = [1, 16, 64];
const STREAM_CONCURRENCY: usize = 16;

struct Options {
    peers: Peers,
    fronts: Vec<FrontKind>,
    seconds: f64,
    rounds: usize,
    streams: usize,
    idle: usize,
    out: Option<String>,
    check: Option<String>,
    margin_pct: f64,
    bless: Option<String>,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| sparkgate_tests::harness::flag_value(&args, flag);
    let number = |flag: &str, default: f64| -> f64 {
        value(flag).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("overhead: {flag} needs a number, got {v:?}");
                std::process::exit(2)
            })
        })
    };
    let peers_dir = value("--peers").unwrap_or_else(|| {
        format!(
            "{}/.cache/sparkgate-overhead",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let baseline = value("--baseline").map(std::path::PathBuf::from);
    let mut fronts: Vec<FrontKind> = match value("--fronts") {
        None => FrontKind::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|n| {
                FrontKind::ALL
                    .into_iter()
                    .chain([FrontKind::Baseline])
                    .find(|k| k.name() == n)
                    .unwrap_or_else(|| {
                        eprintln!("overhead: unknown front {n:?} (direct, sparkgate, baseline, nginx, smg, litellm)");
                        std::process::exit(2)
                    })
            })
            .collect(),
    };
    if baseline.is_some() && !fronts.contains(&FrontKind::Baseline) {
        let at = fronts
            .iter()
            .position(|k| *k == FrontKind::Sparkgate)
            .map_or(fronts.len(), |i| i + 1);
        fronts.insert(at, FrontKind::Baseline);
    }
    Options {
        peers: Peers {
            venv: format!("{peers_dir}/venv").into(),
            nginx: value("--nginx").unwrap_or_else(|| "/usr/sbin/nginx".into()).into(),
            baseline,
        },
        fronts,
        seconds: number("--seconds", 5.0),
        rounds: number("--rounds", 3.0).max(1.0) as usize,
        streams: number("--streams", 2000.0) as usize,
        idle: number("--idle", 9_000.0) as usize,
        out: value("--out"),
        check: value("--check"),
        margin_pct: number("--margin", 10.0),
        bless: value("--bless"),
    }
}

fn main() {
    let o = options();
    let exe = std::env::current_exe().expect("exe");
    let sim_bin = exe.with_file_name("vllm-sim");
    let sparkgate = exe.with_file_name("sparkgate");
    for bin in [&sim_bin, &sparkgate] {
        if !bin.exists() {
            eprintln!(
                "overhead: {} is missing; build with `cargo build --release --bins`",
                bin.display()
            );
            std::process::exit(2);
        }
    }
    let sim_args = ["/model", "--served-model-name", MODEL, "--max-num-seqs", "20000"];
    let sim_bin = sim_bin.to_str().expect("utf-8 path");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut results: Vec<Value> = o
        .fronts
        .iter()
        .map(|k| json!({"front": k.name(), "setup": k.setup_note()}))
        .collect();

    // (a) Every front up at once in front of an instant simulator; rounds interleave the fronts
    // so that drift on a shared machine hits them alike; each figure is the median of rounds.
    {
        let fast = Sim::start(sim_bin, &sim_args, &[("SIM_SPEED", "instant")]);
        let fronts = start_all(&o, &mut results, &fast.addr().to_string(), &sparkgate);
        let mut rounds: Vec<Vec<Value>> = vec![Vec::new(); fronts.len()];
        for round in 0..o.rounds {
            for (i, front) in fronts.iter().enumerate() {
                let Some(front) = front else { continue };
                let client = client();
                let mut cells = json!({});
                for c in CONCURRENCIES {
                    let cpu = || front.usage().map(|u| u.cpu_s);
                    cells[c.to_string()] = runtime.block_on(non_streaming(&client, &front.base, c, o.seconds, &cpu));
                }
                eprintln!("   (a) round {} {}: {cells}", round + 1, front.kind.name());
                rounds[i].push(cells);
            }
        }
        for (i, r) in rounds.iter().enumerate() {
            if !r.is_empty() {
                results[i]["non_streaming"] = median_cells(r);
            }
        }
    }
    // (b) Streams from a paced simulator (about 2 ms between tokens per stream at 16 streams),
    // so inter-token gaps are the backend's pacing plus what the front adds.
    {
        let paced = Sim::start(sim_bin, &sim_args, &[("SIM_SPEED", "150")]);
        for (i, &kind) in o.fronts.iter().enumerate() {
            if !results[i]["error"].is_null() {
                continue;
            }
            match Front::start(kind, &paced.addr().to_string(), MODEL, &sparkgate, &o.peers) {
                Ok(front) => {
                    let before = front.usage();
                    let mut r = runtime.block_on(streaming(&client(), &front.base, STREAM_CONCURRENCY, o.streams));
                    if let (Some(b), Some(a)) = (before, front.usage()) {
                        r["cpu_s_per_1000"] = json!((a.cpu_s - b.cpu_s) / o.streams as f64 * 1000.0);
                    }
                    eprintln!("   (b) {}: {r}", kind.name());
                    results[i]["streaming"] = r;
                }
                Err(e) => results[i]["streaming"] = json!({"error": e}),
            }
        }
    }
    // (c) Idle streams: 53.7 tok/s × 0.05 shared by thousands of streams — hours per token.
    if o.idle > 0 {
        let slow = Sim::start(sim_bin, &sim_args, &[("SIM_SPEED", "0.05")]);
        for (i, &kind) in o.fronts.iter().enumerate() {
            if !results[i]["error"].is_null() || kind == FrontKind::Direct {
                continue;
            }
            results[i]["idle"] = match Front::start(kind, &slow.addr().to_string(), MODEL, &sparkgate, &o.peers) {
                Ok(front) => runtime.block_on(idle_streams(&front, o.idle)),
                Err(e) => json!({"error": e}),
            };
            eprintln!("   (c) {}: {}", kind.name(), results[i]["idle"]);
        }
    }
    report(&results, &o);
    std::process::exit(check_ratios(&results, &o));
}

/// `--bless` writes this run's ratios; `--check` compares them with a committed set: the exit code.
fn check_ratios(results: &[Value], o: &Options) -> i32 {
    let now = ratios::ratios(results);
    if let Some(path) = &o.bless {
        let text = serde_json::to_string_pretty(&ratios::baseline_json(&now)).unwrap_or_default() + "\n";
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("overhead: cannot write {path}: {e}");
            return 2;
        }
        println!("wrote the ratios to {path}");
    }
    let Some(path) = &o.check else { return 0 };
    let baseline: Value = match std::fs::read_to_string(path).map(|t| serde_json::from_str(&t)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            eprintln!("overhead: {path} is not JSON: {e}");
            return 2;
        }
        Err(e) => {
            eprintln!("overhead: cannot read {path}: {e}");
            return 2;
        }
    };
    let worse = ratios::regressions(&now, &baseline, o.margin_pct / 100.0);
    if worse.is_empty() {
        println!("check: no ratio is worse than {path} by more than {} %", o.margin_pct);
        return 0;
    }
    eprintln!(
        "check: {} ratio(s) worse than {path} by more than {} %:",
        worse.len(),
        o.margin_pct
    );
    for w in &worse {
        eprintln!("  {w}");
    }
    1
}

/// Starts every front against `backend`; a front that cannot run gets its reason in `results`.
fn start_all(o: &Options, results: &mut [Value], backend: &str, sparkgate: &std::path::Path) -> Vec<Option<Front>> {
    o.fronts
        .iter()
        .enumerate()
        .map(
            |(i, &kind)| match Front::start(kind, backend, MODEL, sparkgate, &o.peers) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("== {}: not run: {e}", kind.name());
                    results[i]["error"] = json!(e);
                    None
                }
            },
        )
        .collect()
}

/// Per concurrency, the median of each figure over the rounds.
fn median_cells(rounds: &[Value]) -> Value {
    let mut out = json!({});
    for c in CONCURRENCIES {
        let key = c.to_string();
        let mut cell = json!({});
        for field in ["rps", "p50_ms", "p99_ms", "errors", "requests", "cpu_us_per_req"] {
            let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[&key][field].as_f64()).collect();
            v.sort_by(f64::total_cmp);
            if !v.is_empty() {
                cell[field] = json!(percentile(&v, 0.5));
            }
        }
        cell["rps_rounds"] = json!(rounds.iter().map(|r| r[&key]["rps"].clone()).collect::<Vec<_>>());
        out[key] = cell;
    }
    out
}

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(20_000)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

fn chat_body(stream: bool, max_tokens: u32) -> Bytes {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    if stream {
        body["stream"] = json!(true);
    }
    Bytes::from(body.to_string())
}

fn post(base: &str, body: Bytes) -> hyper::Request<Full<Bytes>> {
    hyper::Request::post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer none")
        .body(Full::new(body))
        .expect("request")
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// (a) `concurrency` closed-loop clients sending small non-streaming chats for `seconds`
/// (after a one-second warm-up that is not counted).
/// `cpu` reads the front's CPU seconds so far (none for the simulator alone).
async fn non_streaming(
    client: &HttpClient,
    base: &str,
    concurrency: usize,
    seconds: f64,
    cpu: &dyn Fn() -> Option<f64>,
) -> Value {
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, base, stop, counting) = (client.clone(), base.to_owned(), stop.clone(), counting.clone());
            sparkgate_task::spawn("overhead-client", async move {
                let (mut latencies, mut errors) = (Vec::new(), 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let ok = match client.request(post(&base, chat_body(false, 16))).await {
                        Ok(resp) => {
                            let status = resp.status();
                            resp.into_body().collect().await.is_ok() && status.is_success()
                        }
                        Err(_) => false,
                    };
                    if counting.load(Ordering::Relaxed) {
                        if ok {
                            latencies.push(started.elapsed().as_secs_f64());
                        } else {
                            errors += 1;
                        }
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    counting.store(true, Ordering::Relaxed);
    let (began, cpu_before) = (Instant::now(), cpu());
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    counting.store(false, Ordering::Relaxed);
    let (elapsed, cpu_after) = (began.elapsed().as_secs_f64(), cpu());
    stop.store(true, Ordering::Relaxed);
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in tasks {
        let (l, e) = t.await.expect("client task");
        all.extend(l);
        errors += e;
    }
    all.sort_by(f64::total_cmp);
    // The front's CPU per request while counted: what its throughput on shared cores costs.
    let cpu_us = match (cpu_before, cpu_after) {
        (Some(b), Some(a)) if !all.is_empty() => json!((a - b) / all.len() as f64 * 1e6),
        _ => Value::Null,
    };
    json!({
        "requests": all.len(),
        "rps": all.len() as f64 / elapsed,
        "cpu_us_per_req": cpu_us,
        "p50_ms": percentile(&all, 0.5) * 1e3,
        "p99_ms": percentile(&all, 0.99) * 1e3,
        "errors": errors,
    })
}

/// (b) `total` streaming requests of 256 tokens, `concurrency` at a time: time to first byte of
/// the first event and the gaps between body frames.
async fn streaming(client: &HttpClient, base: &str, concurrency: usize, total: usize) -> Value {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, base, next) = (client.clone(), base.to_owned(), next.clone());
            sparkgate_task::spawn("overhead-stream", async move {
                let (mut ttft, mut gaps, mut errors, mut tokens) = (Vec::new(), Vec::new(), 0u64, 0u64);
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let started = Instant::now();
                    let Ok(resp) = client.request(post(&base, chat_body(true, 256))).await else {
                        errors += 1;
                        continue;
                    };
                    if !resp.status().is_success() {
                        errors += 1;
                        let _ = resp.into_body().collect().await;
                        continue;
                    }
                    let mut body = resp.into_body();
                    // Every content event gets its frame's arrival time: the gaps between
                    // consecutive tokens as the client sees them (0 within one frame).
                    let mut last = None::<Instant>;
                    while let Some(frame) = body.frame().await {
                        let Ok(frame) = frame else {
                            errors += 1;
                            break;
                        };
                        let Ok(data) = frame.into_data() else { continue };
                        let now = Instant::now();
                        let events = data.windows(10).filter(|w| w == b"\"content\":").count();
                        for _ in 0..events {
                            match last {
                                None => ttft.push(now.duration_since(started).as_secs_f64()),
                                Some(l) => gaps.push(now.duration_since(l).as_secs_f64()),
                            }
                            last = Some(now);
                        }
                        tokens += events as u64;
                    }
                }
                (ttft, gaps, errors, tokens)
            })
        })
        .collect();
    let began = Instant::now();
    let (mut ttft, mut gaps, mut errors, mut tokens) = (Vec::new(), Vec::new(), 0, 0);
    for t in tasks {
        let (a, b, e, n) = t.await.expect("stream task");
        ttft.extend(a);
        gaps.extend(b);
        errors += e;
        tokens += n;
    }
    let elapsed = began.elapsed().as_secs_f64();
    ttft.sort_by(f64::total_cmp);
    gaps.sort_by(f64::total_cmp);
    json!({
        "requests": total,
        "seconds": elapsed,
        "content_events": tokens,
        "ttft_p50_ms": percentile(&ttft, 0.5) * 1e3,
        "ttft_p99_ms": percentile(&ttft, 0.99) * 1e3,
        "gap_p50_us": percentile(&gaps, 0.5) * 1e6,
        "gap_p99_us": percentile(&gaps, 0.99) * 1e6,
        "errors": errors,
    })
}

/// (c) `n` streams opened and held (each has its response headers); the front's resident memory
/// before and with them, per stream.
async fn idle_streams(front: &Front, n: usize) -> Value {
    let client = client();
    let Some(baseline) = front.usage() else {
        return json!({"note": "no front process (direct)"});
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    let release = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (client, base, tx, release) = (client.clone(), front.base.clone(), tx.clone(), release.clone());
        tasks.push(sparkgate_task::spawn("overhead-idle-stream", async move {
            match client.request(post(&base, chat_body(true, 64))).await {
                Ok(resp) if resp.status().is_success() => {
                    let _ = tx.send(true);
                    let _body = resp.into_body();
                    release.notified().await;
                }
                _ => {
                    let _ = tx.send(false);
                }
            }
        }));
        // Open in waves so the listen backlogs keep up.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(tx);
    let (mut open, mut failed) = (0usize, 0usize);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while open + failed < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(true)) => open += 1,
            Ok(Some(false)) => failed += 1,
            _ => break,
        }
    }
    // Let allocations settle after the last stream opened.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = front.usage().unwrap_or_default();
    release.notify_waiters();
    for t in tasks {
        t.abort();
    }
    let per_stream = if open > 0 {
        (held.rss_kib as f64 - baseline.rss_kib as f64) / open as f64
    } else {
        f64::NAN
    };
    json!({
        "wanted": n,
        "open": open,
        "failed": failed,
        "rss_before_kib": baseline.rss_kib,
        "rss_held_kib": held.rss_kib,
        "kib_per_stream": per_stream,
        "processes": held.processes,
    })
}

fn report(results: &[Value], o: &Options) {
    let find = |name: &str| results.iter().find(|r| r["front"] == name);
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    println!("\n### (a) non-streaming chat, 16 output tokens: req/s and latency (ms)\n");
    println!("| front | c=1 req/s | c=16 req/s | c=64 req/s | c=64 vs direct | c=64 vs sparkgate | c=1 p50 | c=1 added p50 | c=64 p50 | c=64 p99 | c=64 front CPU µs/req | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let direct = find("direct");
    let sparkgate = find("sparkgate");
    for r in results {
        if let Some(e) = r["error"].as_str() {
            println!(
                "| {} | not run: {} ||||||||||| ",
                r["front"].as_str().unwrap_or("?"),
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        let a = &r["non_streaming"];
        let rps64 = num(&a["64"]["rps"]);
        let ratio = |other: Option<&Value>| other.map_or(f64::NAN, |o| rps64 / num(&o["non_streaming"]["64"]["rps"]));
        let added = direct.map_or(f64::NAN, |d| {
            num(&a["1"]["p50_ms"]) - num(&d["non_streaming"]["1"]["p50_ms"])
        });
        let errors: f64 = ["1", "16", "64"].iter().map(|c| num(&a[*c]["errors"])).sum();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {:.3} | {:+.3} | {:.3} | {:.3} | {:.1} | {} |",
            r["front"].as_str().unwrap_or("?"),
            num(&a["1"]["rps"]),
            num(&a["16"]["rps"]),
            rps64,
            ratio(direct),
            ratio(sparkgate),
            num(&a["1"]["p50_ms"]),
            added,
            num(&a["64"]["p50_ms"]),
            num(&a["64"]["p99_ms"]),
            num(&a["64"]["cpu_us_per_req"]),
            errors
        );
    }
    println!(
        "\n### (b) streaming, 256 tokens, {STREAM_CONCURRENCY} at a time, {} requests, paced backend (~2 ms/token)\n",
        o.streams
    );
    println!("| front | TTFT p50 ms | added TTFT p50 ms | token gap p50 µs | token gap p99 µs | added gap p50 µs | added gap p99 µs | front CPU s / 1000 req | errors |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in results.iter().filter(|r| r["error"].is_null()) {
        let s = &r["streaming"];
        if let Some(e) = s["error"].as_str() {
            println!(
                "| {} | not run: {} ||||||||",
                r["front"].as_str().unwrap_or("?"),
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        let d = direct.map(|d| &d["streaming"]);
        println!(
            "| {} | {:.3} | {:+.3} | {:.1} | {:.1} | {:+.1} | {:+.1} | {} | {} |",
            r["front"].as_str().unwrap_or("?"),
            num(&s["ttft_p50_ms"]),
            d.map_or(f64::NAN, |d| num(&s["ttft_p50_ms"]) - num(&d["ttft_p50_ms"])),
            num(&s["gap_p50_us"]),
            num(&s["gap_p99_us"]),
            d.map_or(f64::NAN, |d| num(&s["gap_p50_us"]) - num(&d["gap_p50_us"])),
            d.map_or(f64::NAN, |d| num(&s["gap_p99_us"]) - num(&d["gap_p99_us"])),
            s["cpu_s_per_1000"]
                .as_f64()
                .map_or("—".to_owned(), |c| format!("{c:.2}")),
            s["errors"]
        );
    }
    println!("\n### (c) {} idle streams held\n", o.idle);
    println!("| front | streams open | RSS before MiB | RSS held MiB | KiB per stream |");
    println!("|---|---|---|---|---|");
    for r in results
        .iter()
        .filter(|r| r["error"].is_null() && r["front"] != "direct")
    {
        let i = &r["idle"];
        if let Some(e) = i["error"].as_str() {
            println!(
                "| {} | not run: {} ||||",
                r["front"].as_str().unwrap_or("?"),
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        println!(
            "| {} | {} / {} | {:.1} | {:.1} | {:.1} |",
            r["front"].as_str().unwrap_or("?"),
            i["open"],
            i["wanted"],
            num(&i["rss_before_kib"]) / 1024.0,
            num(&i["rss_held_kib"]) / 1024.0,
            num(&i["kib_per_stream"])
        );
    }
    println!("\nSetups:");
    for r in results {
        println!(
            "- {}: {}",
            r["front"].as_str().unwrap_or("?"),
            r["setup"].as_str().unwrap_or("")
        );
    }
    println!("\n### Same-run ratios\n\n{}", ratios::table(results));
    if let Some(path) = &o.out {
        let doc = json!({"machine": machine(), "seconds": o.seconds, "streams": o.streams, "idle": o.idle, "fronts": results});
        match std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default()) {
            Ok(()) => println!("\nwrote {path}"),
            Err(e) => eprintln!("overhead: cannot write {path}: {e}"),
        }
    }
}

fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    json!({"cpus": cpus, "cpu": model})
}
