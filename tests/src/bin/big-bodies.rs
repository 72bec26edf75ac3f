//! `cargo run --release -p sparkgate-tests --bin big-bodies`: the gateway's memory and
//! responsiveness with large request bodies — 8 concurrent 32 MB bodies (a list of small
//! numbers, the worst case for a JSON value tree) queued behind two long streams, the
//! gateway's RSS and high-water mark meanwhile, and `/health` latency while such a body is read
//! and parsed. Prints one line per figure (BENCHMARKS.md has the reference run).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use sparkgate_tests::harness::{binary_next_to, Sim};
use sparkgate_tests::http::{hold_streams, request, HttpResponse, Streaming};
use sparkgate_tests::load::deepseek_sim_args;
use sparkgate_tests::test_gateway::TestGateway;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn big_body(bytes: usize) -> Vec<u8> {
    let mut b =
        format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":1,"x_numbers":["#)
            .into_bytes();
    while b.len() < bytes {
        b.extend_from_slice(b"1,");
    }
    b.extend_from_slice(b"1]}");
    b
}

fn main() {
    let exe = std::env::current_exe().expect("exe").to_string_lossy().into_owned();
    let sim_bin = binary_next_to(&exe, "vllm-sim");
    let sim = Sim::start(&sim_bin, &deepseek_sim_args("2"), &[("SIM_SPEED", "1")]);
    let gw = TestGateway::builder(&sim_bin).upstream(sim.addr()).start();
    let (pid, addr) = (gw.proc.pid(), gw.addr);
    let holders = hold_both_slots(addr);
    let body = big_body(32_000_000);
    println!("body: {} MB of small numbers", body.len() / 1_000_000);
    let baseline = status_kib(pid, "VmRSS:");
    let (worst, sender) = health_while_parsing(addr, body.clone());
    println!(
        "/health worst latency while a 32 MB body is read and parsed: {:.1} ms",
        worst.as_secs_f64() * 1e3
    );
    let senders: Vec<_> = (0..7)
        .map(|_| {
            let b = body.clone();
            std::thread::spawn(move || post_chat(addr, &b).status)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let queued = queued(addr);
        if queued >= 8 || Instant::now() > deadline {
            println!("queued: {queued}");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "gateway RSS with 8 bodies queued: {} MiB (high-water {} MiB, idle {} MiB)",
        status_kib(pid, "VmRSS:") >> 10,
        status_kib(pid, "VmHWM:") >> 10,
        baseline >> 10
    );
    drop(holders);
    let statuses: Vec<u16> = senders.into_iter().map(|s| s.join().expect("sender")).collect();
    println!("after the holders left, the queued bodies were answered: {statuses:?}");
    let _ = sender.join();
}

fn post_chat(addr: SocketAddr, body: &[u8]) -> HttpResponse {
    request(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body,
    )
}

/// The requests the gateway's admission queue holds now.
fn queued(addr: SocketAddr) -> u64 {
    request(addr, "GET", "/admin/status", &[], b"").json()["admission"]["queued"]
        .as_u64()
        .unwrap_or(0)
}

/// Two endless streams that take both of the simulator's slots (MAX_NUM_SEQS=2), each past its
/// first chunk, so every body after them queues.
fn hold_both_slots(addr: SocketAddr) -> Vec<Streaming> {
    let hold = json!({"messages": [{"role": "user", "content": "hold"}], "max_tokens": 100000, "ignore_eos": true, "stream": true});
    hold_streams(addr, 2, &hold)
}

/// The worst `/health` latency while `body` is sent, read and parsed (until it queues), and the
/// thread that sent it.
fn health_while_parsing(addr: SocketAddr, body: Vec<u8>) -> (Duration, std::thread::JoinHandle<HttpResponse>) {
    let sender = std::thread::spawn(move || post_chat(addr, &body));
    let mut worst = Duration::ZERO;
    while !sender.is_finished() {
        let t = Instant::now();
        let _ = request(addr, "GET", "/health", &[], b"");
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(5));
        if queued(addr) >= 1 {
            break;
        }
    }
    (worst, sender)
}
