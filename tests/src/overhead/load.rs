//! The load the overhead benchmark drives through a front, from one hyper client: closed-loop
//! non-streaming chats, streams whose token gaps are timed, and idle streams held open.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::Front;

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The model name every front serves (the simulator's `--served-model-name`).
pub const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

/// The load's client: `http://` and `https://` (trusting the TLS fronts' CA), connections
/// kept alive.
pub fn client() -> HttpClient {
    client_keeping(20_000)
}

/// A client that opens a new connection for every request (a TLS front's full handshake each:
/// no session is resumed), for the cost of a connection.
pub fn fresh_client() -> HttpClient {
    client_keeping(0)
}

fn client_keeping(idle_per_host: usize) -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let mut roots = rustls::RootCertStore::empty();
    if let Ok(pem) = super::tls::ca().and_then(|p| std::fs::read(p).map_err(|e| e.to_string())) {
        use rustls::pki_types::pem::PemObject as _;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
            let _ = roots.add(cert);
        }
    }
    #[allow(deprecated)] // ring, as the gateway's own TLS.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.resumption = rustls::client::Resumption::disabled();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle_per_host)
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

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// (a) `concurrency` closed-loop clients sending small non-streaming chats for `seconds`
/// (after a one-second warm-up that is not counted).
/// `cpu` reads the front's CPU seconds so far (none for the simulator alone).
pub async fn non_streaming(
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
pub async fn streaming(client: &HttpClient, base: &str, concurrency: usize, total: usize) -> Value {
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
pub async fn idle_streams(front: &Front, n: usize) -> Value {
    let client = client();
    let Some(baseline) = front.usage() else {
        return json!({"note": "no front process (direct)"});
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<(), String>>();
    let release = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (client, base, tx, release) = (client.clone(), front.base.clone(), tx.clone(), release.clone());
        tasks.push(sparkgate_task::spawn("overhead-idle-stream", async move {
            match client.request(post(&base, chat_body(true, 64))).await {
                Ok(resp) if resp.status().is_success() => {
                    let _ = tx.send(Ok(()));
                    let _body = resp.into_body();
                    release.notified().await;
                }
                Ok(resp) => {
                    let _ = tx.send(Err(format!("HTTP {}", resp.status())));
                }
                Err(e) => {
                    let _ = tx.send(Err(error_chain(&e)));
                }
            }
        }));
        // Open in waves so the listen backlogs keep up.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(tx);
    let (mut open, mut failed) = (0usize, Vec::<String>::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while open + failed.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Ok(()))) => open += 1,
            Ok(Some(Err(why))) => failed.push(why),
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
        "failed": failed.len(),
        // Streams whose response headers had not come when the wait ended (a front that holds
        // them until the first token does not count as holding idle streams).
        "no_headers": n - open - failed.len(),
        "failed_because": reasons(&failed),
        "rss_before_kib": baseline.rss_kib,
        "rss_held_kib": held.rss_kib,
        "kib_per_stream": per_stream,
        "processes": held.processes,
    })
}

/// An error with its sources (hyper's "client error (Connect)" says little on its own).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// Each distinct reason with how often it came, most frequent first, at most three.
fn reasons(failed: &[String]) -> Vec<String> {
    let mut counted: Vec<(usize, &String)> = Vec::new();
    for why in failed {
        match counted.iter_mut().find(|(_, w)| *w == why) {
            Some((n, _)) => *n += 1,
            None => counted.push((1, why)),
        }
    }
    counted.sort_by_key(|c| std::cmp::Reverse(c.0));
    counted.iter().take(3).map(|(n, why)| format!("{n} × {why}")).collect()
}
