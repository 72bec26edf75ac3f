//! The cap holds at disconnects: streams whose clients leave at random moments under load give
//! their slot to the next queued request only once vLLM has let go of them, so vLLM's own
//! running + waiting never exceeds MAX_NUM_SEQS — in front of vllm-sim and of the real vLLM
//! 0.33.0 frontend.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{in_vllm, request, Streaming};
use sparkgate_tests::realvllm::{plan_argv, RealVllm};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const CAP: u64 = 2;

/// 20 streams at once, each cut by its client after 1 to 8 chunks (a fixed pseudo-random
/// pattern), 6 non-streaming requests whose clients give up after 0.2 to 1.2 s, two more
/// streams that run to the end; the most `sample` saw while they ran.
fn random_disconnects(gw: SocketAddr, sample: impl Fn() -> u64 + Send + 'static) -> u64 {
    let most = Arc::new(AtomicU64::new(0));
    let running = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (most, running) = (most.clone(), running.clone());
        std::thread::spawn(move || {
            while running.load(Ordering::Relaxed) {
                most.fetch_max(sample(), Ordering::Relaxed);
            }
        })
    };
    let mut clients: Vec<_> = (0..6u64)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"messages": [{"role": "user", "content": format!("whole {i}")}],
                                  "max_tokens": 400, "ignore_eos": true,
                                  "chat_template_kwargs": {"enable_thinking": false}});
                let mut s = std::net::TcpStream::connect(gw).unwrap();
                let text = body.to_string();
                let head = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                );
                std::io::Write::write_all(&mut s, head.as_bytes()).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200 + (i * 211) % 1000))).unwrap();
                let _ = std::io::Read::read(&mut s, &mut [0u8; 64]);
                // Dropped: the client gave up before its answer.
            })
        })
        .collect();
    clients.extend((0..22u64).map(|i| {
        std::thread::spawn(move || {
            let body = json!({"messages": [{"role": "user", "content": format!("stream {i}")}],
                                  "max_tokens": 400, "ignore_eos": true, "stream": true,
                                  "chat_template_kwargs": {"enable_thinking": false}});
            let mut s = Streaming::post_json(gw, "/v1/chat/completions", &body);
            assert_eq!(s.status, 200);
            if i >= 20 {
                // These run to the end, after the cut ones queued before them.
                let body = s.read_all();
                let done = sse::events(&body).iter().any(sse::is_done);
                assert!(done, "{}", String::from_utf8_lossy(&body));
                return;
            }
            let chunks = 1 + (i * 7919) % 8;
            for _ in 0..chunks {
                if s.next_chunk().is_none() {
                    break;
                }
            }
            // Dropping the stream closes the connection: the client is gone.
        })
    }));
    for c in clients {
        c.join().unwrap();
    }
    running.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    most.load(Ordering::Relaxed)
}

/// The gateway's abort fence over the run: (streams fenced, mean seconds held, timed out).
fn fence(gw: SocketAddr) -> (u64, f64, u64) {
    let text = request(gw, "GET", "/metrics", &[], b"").text();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let count = value("sparkgate_abort_fence_seconds_count");
    let sum = value("sparkgate_abort_fence_seconds_sum");
    let timed_out = value(r#"sparkgate_abort_fence_seconds_count{outcome="timed_out"}"#);
    (count as u64, sum / count.max(1.0), timed_out as u64)
}

fn check(gw: SocketAddr, most: u64, upstream: &str) {
    // Histogram samples reach the exposition when the gateway's upkeep folds them in (5 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let (fenced, mean, timed_out) = loop {
        let seen = fence(gw);
        if seen.0 >= 20 || std::time::Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    eprintln!("{upstream}: at most {most} in vLLM; {fenced} cut requests fenced, held {:.1} ms on average, {timed_out} timed out", mean * 1000.0);
    assert!(
        (1..=CAP).contains(&most),
        "{upstream}: {most} requests inside vLLM at once (MAX_NUM_SEQS {CAP})"
    );
    assert!(
        fenced >= 20,
        "every cut stream kept its slot until vLLM let go: {fenced}"
    );
    assert_eq!(timed_out, 0, "vLLM's own count released each one");
}

#[test]
fn random_disconnects_never_put_more_than_max_num_seqs_into_vllm_sim() {
    let sim = Sim::start(SIM, common_args(), &[("SIM_SPEED", "8")]);
    let gw = TestGateway::builder(SIM).upstream(sim.addr()).start();
    let probe = sim.addr();
    let most = random_disconnects(gw.addr, move || in_vllm(probe));
    check(gw.addr, most, "vllm-sim");
}

#[test]
fn random_disconnects_never_put_more_than_max_num_seqs_into_the_real_frontend() {
    let real = RealVllm::start_with(
        VllmRelease::V0_33,
        ProfileId::DeepSeekV41Flash,
        &plan_argv(ProfileId::DeepSeekV41Flash, None),
        &[("FAKE_STEP_S", "0.01")],
    );
    let gw = TestGateway::builder(SIM).upstream(real.addr).start();
    let probe = real.addr;
    let most = random_disconnects(gw.addr, move || in_vllm(probe));
    check(gw.addr, most, "vLLM 0.33.0");
}

fn common_args() -> &'static [&'static str] {
    &sparkgate_tests::load::DEEPSEEK_SIM_ARGS
}
