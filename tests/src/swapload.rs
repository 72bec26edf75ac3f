//! Two models on one simulated pair (MODELS, issue #50): a gateway whose ranks are vllm-sim
//! processes of either profile on the same loopback "nodes", and clients of both models sending
//! in closed loops — streams and whole answers, alternately — for a while. What they saw (every
//! answer, its model, errors, resumed streams), the swaps counted in `/metrics` and the most
//! requests rank 0 ever held at once (vllm-sim's `/state`, read every 50 ms) are the outcome.
//! Shared by the test (`tests/model_swap.rs`) and the benchmark (`bin/model-swap.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{free_port, Gateway};
use crate::http::{request, Streaming};
use crate::test_gateway::TestGateway;

/// The two models' served names, as the profiles name them.
pub const DEEPSEEK: &str = "DeepSeek-v4.1-Flash-EXL3";
pub const GLM: &str = "GLM-5.3-Flash-EXL3";
/// The cap both models run with here.
pub const MAX_NUM_SEQS: u64 = 2;

/// The run's settings.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub duration: Duration,
    /// SWAP_MIN_DWELL_S.
    pub dwell_s: u64,
    /// SWAP_DRAIN_S: short, so some streams are cut by the drain and continued after the swap.
    pub drain_s: u64,
    /// Closed-loop clients per model.
    pub clients: usize,
    /// vllm-sim's SIM_LOAD_SECONDS: what a model's load costs.
    pub load_s: f64,
    /// One more client per model sending streams longer than the drain: a swap cuts them, and
    /// they are continued once their model is loaded again.
    pub long_streams: bool,
}

/// A long stream's `max_tokens`: several seconds at SIM_SPEED 4, longer than the drain.
const LONG: u64 = 600;

/// A gateway serving both models from one simulated pair; `control` is rank 0's control port.
pub fn start(sim: &str, mix: &Mix, extra: &[(&str, &str)]) -> (Gateway, u16) {
    let control = free_port();
    let (dwell, drain, load, control_s) = (
        mix.dwell_s.to_string(),
        mix.drain_s.to_string(),
        mix.load_s.to_string(),
        control.to_string(),
    );
    let gw = TestGateway::builder(sim)
        .envs(&[
            ("MODELS", "deepseek-v4.1-flash,glm-5.3-flash"),
            ("MAX_NUM_SEQS", "2"),
            ("SWAP_MIN_DWELL_S", dwell.as_str()),
            ("SWAP_DRAIN_S", drain.as_str()),
            ("SIM_LOAD_SECONDS", load.as_str()),
            ("SIM_SPEED", "4"),
            ("SIM_CONTROL_PORT", control_s.as_str()),
            ("RESUME_TIMEOUT", "600"),
        ])
        .envs(extra)
        .start();
    gw.wait_status("the default model serving", |s| s["swap"]["phase"] == "serving");
    (gw, control)
}

/// What one run saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Answers by model asked: (whole answers, streams).
    pub answered: [(u64, u64); 2],
    /// Anything but a complete answer of the model asked for, in words.
    pub failures: Vec<String>,
    /// The most requests rank 0 held at once.
    pub peak: u64,
    /// `sparkgate_model_swaps_total`, summed.
    pub swaps: u64,
    /// `sparkgate_stream_resumes_total`.
    pub resumed: u64,
    /// Long streams answered whole (counted in `answered` too).
    pub long_answered: u64,
    /// Each answer's time from sent to last byte, by model.
    pub latencies: [Vec<Duration>; 2],
}

fn chat(model: &str, n: u64, stream: bool, long: bool) -> Value {
    let max_tokens = if long { LONG } else { 24 + (n % 5) * 24 };
    // A long one runs to its max_tokens (the simulated model would end its answer sooner).
    json!({"model": model, "messages": [{"role": "user", "content": format!("turn {n}: tell me about tensor parallel decoding")}],
           "max_tokens": max_tokens, "stream": stream, "temperature": 0, "ignore_eos": long,
           "chat_template_kwargs": {"enable_thinking": false}})
}

/// One request, checked: a 200 whose `model` (every chunk's, for a stream) is the one asked
/// for, a stream ending in `[DONE]` with no error event.
fn one(addr: std::net::SocketAddr, model: &str, n: u64, (stream, long): (bool, bool)) -> Result<(), String> {
    let body = chat(model, n, stream, long);
    let mut s = Streaming::post_json(addr, "/v1/chat/completions", &body);
    let status = s.status;
    let bytes = s.read_all();
    let text = String::from_utf8_lossy(&bytes);
    if status != 200 {
        return Err(format!("{model}: HTTP {status}: {text}"));
    }
    if !stream {
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{model}: not JSON ({e}): {text}"))?;
        return match v["model"].as_str() {
            Some(m) if m == model => Ok(()),
            other => Err(format!("{model}: answered as {other:?}")),
        };
    }
    let events = crate::sse::events(&bytes);
    if !events.last().is_some_and(crate::sse::is_done) {
        return Err(format!("{model}: stream without [DONE]: {text}"));
    }
    for e in events.iter().filter(|e| !crate::sse::is_done(e)) {
        let v = crate::sse::json(e);
        if v.get("error").is_some() {
            return Err(format!("{model}: error event: {v}"));
        }
        if v["model"] != model {
            return Err(format!("{model}: a chunk of {}", v["model"]));
        }
    }
    Ok(())
}

/// Clients of both models, `mix.clients` each, until `mix.duration` has passed.
pub fn run(gw: &Gateway, control: u16, mix: &Mix) -> Outcome {
    let out = Arc::new(Mutex::new(Outcome::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            let at = std::net::SocketAddr::from(([127, 0, 0, 1], control));
            while !stop.load(Ordering::Relaxed) {
                // Refused while no rank 0 runs (a swap): nothing to read then.
                if let Some(seen) = state_peak(at) {
                    peak.fetch_max(seen, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let end = Instant::now() + mix.duration;
    let long_clients = if mix.long_streams { 2 } else { 0 };
    let clients: Vec<_> = (0..2 * mix.clients + long_clients)
        .map(|c| {
            let long = c >= 2 * mix.clients;
            let (gw_addr, out) = (gw.addr, out.clone());
            std::thread::spawn(move || {
                let m = c % 2;
                let model = [DEEPSEEK, GLM][m];
                let mut n = c as u64;
                let mut k = 0u64;
                while Instant::now() < end {
                    let stream = long || k % 2 == 0;
                    k += 1;
                    let t0 = Instant::now();
                    let r = one(gw_addr, model, n, (stream, long));
                    let mut o = out.lock().expect("outcome");
                    if long {
                        o.long_answered += u64::from(r.is_ok());
                    }
                    match r {
                        Ok(()) if stream => o.answered[m].1 += 1,
                        Ok(()) => o.answered[m].0 += 1,
                        Err(e) => o.failures.push(e),
                    }
                    o.latencies[m].push(t0.elapsed());
                    n += 2 * 7;
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client thread");
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("the watcher");
    let mut o = out.lock().expect("outcome").clone();
    o.peak = peak.load(Ordering::Relaxed);
    o.swaps = sum(gw, "sparkgate_model_swaps_total");
    o.resumed = sum(gw, "sparkgate_stream_resumes_total");
    o
}

/// rank 0's `peak_in_flight` from its control endpoint, when it answers.
fn state_peak(at: std::net::SocketAddr) -> Option<u64> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&at, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /state HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split("\r\n\r\n").nth(1)?;
    serde_json::from_str::<Value>(body).ok()?["peak_in_flight"].as_u64()
}

/// A family's samples from `/metrics`, summed over labels.
pub fn sum(gw: &Gateway, family: &str) -> u64 {
    let text = request(gw.addr, "GET", "/metrics", &[], b"").text();
    text.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The `p`-th percentile (0..=100) of `v`.
pub fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(((v.len().saturating_sub(1)) as f64 * p / 100.0).round() as usize)
        .copied()
        .unwrap_or_default()
}
