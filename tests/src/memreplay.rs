//! The memory replay (issue #35, the memory guard): vllm-sim's node memory (SIM_MEMINFO) read by
//! the supervisor (MEMINFO_PATH, memguard on), a burst of long prompts whose prefills together
//! would take the node under MEM_GUARD_GIB, and short prompts sent one after another meanwhile —
//! with the gateway's memory guard (PREFILL_BYTES_PER_TOKEN) and without. Shared by the test
//! (`tests/memory_guard.rs`) and the benchmark (`bin/memory-replay.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::Gateway;
use crate::http::{post_json, request};
use crate::test_gateway::TestGateway;

/// The node as the replay plays it: 4 GiB available with no prefill running, the line at
/// 1.5 GiB, and a long prompt (4 000 words: about 9 500 vllm-sim tokens) holding about 1.2 GiB
/// while it is prefilled — the guide's bytes per token scaled up, so the prompts stay short.
pub const AVAILABLE_GIB: &str = "4";
pub const LINE_GIB: f64 = 1.5;
pub const LONG_WORDS: usize = 4_000;
/// vllm-sim's transient memory per prompt token.
pub const SIM_BYTES_PER_TOKEN: &str = "131072";
/// The gateway's PREFILL_BYTES_PER_TOKEN: twice vllm-sim's, since the gateway's estimate (body
/// bytes / 4) counts about half of vllm-sim's tokens for this text — as an operator sets the
/// knob over a measured figure with the estimate's error in mind. A long prompt's need is then
/// about 1.65 GiB: one fits under the 2.5 GiB above the line, two do not.
pub const GATEWAY_BYTES_PER_TOKEN: &str = "262144";
/// How often a short prompt is sent while the long ones run.
const SHORT_EVERY: Duration = Duration::from_millis(500);

/// The replay's settings.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Long prompts sent at once.
    pub longs: usize,
    /// vllm-sim's pacing (prefill at 970 tokens/s × this).
    pub speed: f64,
    /// The gateway's memory guard on (PREFILL_BYTES_PER_TOKEN) or off (0).
    pub guard: bool,
    /// End the run when memguard has restarted the group (rather than when every long prompt
    /// has its answer).
    pub until_memguard: bool,
}

/// One prompt's answer: its status, and when it was sent and when its answer ended (from the
/// burst's start).
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: u16,
    pub sent: Duration,
    pub ended: Duration,
}

impl Answer {
    pub fn latency(&self) -> Duration {
        self.ended.saturating_sub(self.sent)
    }
}

/// What one run saw.
#[derive(Debug, Clone)]
pub struct Replay {
    pub longs: Vec<Answer>,
    pub shorts: Vec<Answer>,
    /// `sparkgate_memory_guard_holds_total` at the end.
    pub holds: u64,
    /// Memguard's restarts of the group (`restart_counts`, reason memory).
    pub memguard_restarts: u64,
    /// The lowest MemAvailable the node's meminfo showed (polled every 50 ms), GiB.
    pub lowest_gib: f64,
}

/// A gateway over supervised vllm-sim ranks whose rank 0 keeps `dir`/meminfo.
pub fn start(sim: &str, dir: &Path, mix: Mix) -> (Gateway, PathBuf) {
    let meminfo = dir.join("meminfo");
    let path = meminfo.display().to_string();
    let speed = mix.speed.to_string();
    let line = LINE_GIB.to_string();
    let per_token = if mix.guard { GATEWAY_BYTES_PER_TOKEN } else { "0" };
    let gw = TestGateway::builder(sim)
        .envs(&[
            ("SIM_SPEED", speed.as_str()),
            ("SIM_MEMINFO", &path),
            ("SIM_MEM_AVAILABLE_GIB", AVAILABLE_GIB),
            ("SIM_PREFILL_BYTES_PER_TOKEN", SIM_BYTES_PER_TOKEN),
            ("MEMINFO_PATH", &path),
            ("MEM_GUARD", "1"),
            ("MEM_GUARD_GIB", &line),
            ("PREFILL_BYTES_PER_TOKEN", per_token),
            ("MAX_NUM_SEQS", "8"),
        ])
        .start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready" && s["ready"] == true);
    (gw, meminfo)
}

fn chat(words: usize, tag: usize) -> Value {
    const VOCAB: [&str; 8] = [
        "tensor", "parallel", "decode", "expert", "cache", "prefix", "rank", "group",
    ];
    let text: Vec<&str> = (0..words).map(|i| VOCAB[(i * 7 + i / 8 + tag) % VOCAB.len()]).collect();
    json!({"messages": [{"role": "user", "content": format!("{tag} {}", text.join(" "))}],
           "max_tokens": 4, "temperature": 0, "chat_template_kwargs": {"enable_thinking": false}})
}

/// Sends `body` on its own thread; its answer comes on `tx`.
fn send(gw: &Gateway, body: Value, t0: Instant, tx: mpsc::Sender<Answer>) {
    let addr = gw.addr;
    std::thread::spawn(move || {
        let sent = t0.elapsed();
        let r = post_json(addr, "/v1/chat/completions", &body);
        let _ = tx.send(Answer {
            status: r.status,
            sent,
            ended: t0.elapsed(),
        });
    });
}

/// The lowest MemAvailable of `meminfo` until `stop`, GiB.
fn watch_lowest(meminfo: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        let mut lowest = f64::MAX;
        while !stop.load(Ordering::Relaxed) {
            let text = std::fs::read_to_string(&meminfo).unwrap_or_default();
            if let Some(gib) = sparkgate_docker::mem_available_gib(&text) {
                lowest = lowest.min(gib);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        lowest
    })
}

/// Runs the replay on `gw`: `mix.longs` long prompts at once, then a short prompt every
/// `SHORT_EVERY` until every long one has its answer (or memguard fired, with `until_memguard`;
/// or `within` passed), then the short ones' answers.
pub fn run(gw: &Gateway, meminfo: &Path, mix: Mix, within: Duration) -> Replay {
    let stop = Arc::new(AtomicBool::new(false));
    let lowest = watch_lowest(meminfo.to_path_buf(), stop.clone());
    let t0 = Instant::now();
    let (long_tx, long_rx) = mpsc::channel();
    for i in 0..mix.longs {
        send(gw, chat(LONG_WORDS, i), t0, long_tx.clone());
    }
    let (short_tx, short_rx) = mpsc::channel();
    let (mut longs, mut sent) = (Vec::new(), 0);
    let mut memguard_restarts = 0;
    while longs.len() < mix.longs && t0.elapsed() < within && !(mix.until_memguard && memguard_restarts > 0) {
        sent += 1;
        send(gw, chat(40, 100 + sent), t0, short_tx.clone());
        std::thread::sleep(SHORT_EVERY);
        longs.extend(long_rx.try_iter());
        memguard_restarts = restarts(gw);
    }
    stop.store(true, Ordering::Relaxed);
    let wait = |rx: &mpsc::Receiver<Answer>, n: usize| -> Vec<Answer> {
        (0..n).map_while(|_| rx.recv_timeout(within).ok()).collect()
    };
    let shorts = wait(&short_rx, sent);
    if !mix.until_memguard {
        longs.extend(wait(&long_rx, mix.longs - longs.len()));
    }
    Replay {
        longs,
        shorts,
        holds: metric(gw, "sparkgate_memory_guard_holds_total"),
        memguard_restarts: restarts(gw),
        lowest_gib: lowest.join().expect("the meminfo watcher"),
    }
}

/// Memguard's restarts of the group so far (`restart_counts`, reason memory).
fn restarts(gw: &Gateway) -> u64 {
    let status = gw.status();
    status["supervisor"]["restart_counts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["reason"] == "memory")
        .filter_map(|c| c["count"].as_u64())
        .sum()
}

/// An unlabelled counter's value from `/metrics`.
fn metric(gw: &Gateway, name: &str) -> u64 {
    let text = request(gw.addr, "GET", "/metrics", &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
        .unwrap_or(0.0) as u64
}
