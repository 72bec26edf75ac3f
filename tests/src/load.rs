//! Request load for end-to-end tests: closed-loop clients (one request after another until told
//! to stop, keeping every answer), the speculation round trip both runtimes' tests assert with
//! it, concurrent streams sampled while they run, and the DeepSeek rank argv those tests start.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use crate::harness::Gateway;
use crate::http::{post_json, request, Streaming};

/// Running clients; each stops when its flag is set.
#[derive(Debug)]
pub struct Load {
    stops: Vec<Arc<AtomicBool>>,
    clients: Vec<JoinHandle<Vec<(u16, String)>>>,
}

impl Load {
    /// `clients` threads, each posting `body` to `/v1/chat/completions` in a loop.
    pub fn start(addr: SocketAddr, clients: usize, body: &Value) -> Load {
        let stops: Vec<_> = (0..clients).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let clients = stops
            .iter()
            .map(|stop| {
                let (stop, body) = (stop.clone(), body.clone());
                std::thread::spawn(move || {
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let r = post_json(addr, "/v1/chat/completions", &body);
                        answers.push((r.status, r.text()));
                    }
                    answers
                })
            })
            .collect();
        Load { stops, clients }
    }

    /// Stops all but the first `n` clients (their answers are kept for `finish`).
    pub fn narrow_to(&self, n: usize) {
        for stop in &self.stops[n..] {
            stop.store(true, Ordering::SeqCst);
        }
    }

    /// Stops every client and returns every (status, body) they got.
    pub fn finish(self) -> Vec<(u16, String)> {
        for stop in &self.stops {
            stop.store(true, Ordering::SeqCst);
        }
        self.clients
            .into_iter()
            .flat_map(|c| c.join().expect("client thread"))
            .collect()
    }
}

/// SPEC_POLICY=auto with its settings scaled from minutes to seconds (the rule is the same).
pub const FAST_AUTO_POLICY: [(&str, &str); 6] = [
    ("SPEC_POLICY", "auto"),
    ("SPEC_RESTART_S", "0.5"),
    ("SPEC_MIN_DWELL_S", "3"),
    ("SPEC_HOLD_S", "1"),
    ("SPEC_MARGIN", "1"),
    ("SPEC_RATE_TAU_S", "2"),
];

/// The sum of a Prometheus metric's samples on rank 0, read from the upstream the gateway
/// proxies to.
pub fn rank0_metric(gw: &Gateway, name: &str) -> f64 {
    let url = gw.status()["upstream_url"].as_str().expect("upstream_url").to_owned();
    let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("upstream address");
    let text = request(addr, "GET", "/metrics", &[], b"").text();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// vLLM's running-request gauge on rank 0.
pub fn running_on_rank0(gw: &Gateway) -> f64 {
    rank0_metric(gw, "vllm:num_requests_running")
}

/// With SPEC_POLICY=auto on the DeepSeek profile: four closed-loop clients switch dspark → none
/// (capacity 4, four running on the rank), one client switches back to dspark (capacity 2),
/// and every request of the run answers 200.
pub fn assert_auto_round_trip(gw: &Gateway, body: &Value) {
    let load = Load::start(gw.addr, 4, body);
    let wide = gw.wait_status("switched to none", |s| {
        s["supervisor"]["mode"] == "none" && s["supervisor"]["state"] == "ready" && s["admission"]["capacity"] == 4
    });
    assert_eq!(wide["supervisor"]["max_num_seqs"], 4);
    let saw_four = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        running_on_rank0(gw) >= 4.0
    });
    assert!(saw_four, "the simulator ran 4 requests at once in mode none");
    // The policy learns none's width-4 rate from the tokens it delivers (checked every second).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let learned_wide = loop {
        let spec = request(gw.addr, "GET", "/admin/spec", &[], b"").json();
        let cell = spec["learned"]["tables"][1]["measured"][3].clone();
        if cell["tokens"].as_f64() > Some(0.0) {
            break spec;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "none's width-4 cell never measured: {spec}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(learned_wide["learned"]["tables"][1]["name"], "none");
    assert_ne!(
        learned_wide["settings"]["restart_s"].as_f64(),
        Some(0.5),
        "the switch's measured restart replaced SPEC_RESTART_S: {learned_wide}"
    );
    let spec = request(gw.addr, "GET", "/admin/spec", &[], b"").json();
    assert_eq!(spec["policy"], "auto");
    let taken: Vec<&Value> = spec["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .filter(|d| d["taken"] == true)
        .collect();
    assert_eq!(taken.len(), 1, "{spec}");
    assert_eq!(taken[0]["to"], "none");
    assert!(taken[0]["gain_tokens"].as_f64() >= taken[0]["cost_tokens"].as_f64());

    load.narrow_to(1);
    gw.wait_status("switched back to dspark", |s| {
        s["supervisor"]["mode"] == "dspark" && s["supervisor"]["state"] == "ready" && s["admission"]["capacity"] == 2
    });
    let answers = load.finish();
    assert!(answers.len() > 10, "{}", answers.len());
    for (status, text) in &answers {
        assert_eq!(*status, 200, "a request failed across the switches: {text}");
    }
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("sparkgate_spec_decisions_total{to=\"none\",taken=\"true\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        gw.status()["supervisor"]["epoch"],
        3,
        "two switches, nothing else restarted"
    );
}

/// vllm-sim's argv for a DeepSeek rank serving the profile's model with 2 slots.
pub const DEEPSEEK_SIM_ARGS: [&str; 7] = [
    "/model",
    "--served-model-name",
    "DeepSeek-v4.1-Flash-EXL3",
    "--reasoning-parser",
    "deepseek_v41",
    "--max-num-seqs",
    "2",
];

/// One simulated rank's argv (from `serve`) in a group of `nnodes` on loopback (TP = nnodes, one
/// GPU per node, as the siblings run; model `M` with DeepSeek's parser), meeting rank 0 at
/// `master_port` (0: rank 0 picks one); the workers run headless.
pub fn group_rank_args(rank: u32, nnodes: u32, master_port: u16) -> Vec<String> {
    let mut a: Vec<String> = [
        "serve",
        "/model",
        "--served-model-name",
        "M",
        "--reasoning-parser",
        "deepseek_v41",
        "--tensor-parallel-size",
    ]
    .map(String::from)
    .to_vec();
    a.push(nnodes.to_string());
    a.extend(
        [
            "--nnodes",
            &nnodes.to_string(),
            "--node-rank",
            &rank.to_string(),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &master_port.to_string(),
        ]
        .map(String::from),
    );
    a.extend(
        [
            "--distributed-executor-backend",
            "mp",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ]
        .map(String::from),
    );
    if rank > 0 {
        a.push("--headless".into());
    }
    a
}

/// The same with `max_num_seqs` slots.
pub fn deepseek_sim_args(max_num_seqs: &'static str) -> [&'static str; 7] {
    let mut a = DEEPSEEK_SIM_ARGS;
    a[6] = max_num_seqs;
    a
}

/// Opens `n` streaming POSTs of `body` on `path` at once and calls `sample` every `every` until
/// all have finished; the largest sample and every stream's text.
pub fn concurrent_streams(
    addr: SocketAddr,
    path: &'static str,
    body: &serde_json::Value,
    n: usize,
    every: Duration,
    mut sample: impl FnMut() -> u64,
) -> (u64, Vec<String>) {
    let workers: Vec<_> = (0..n)
        .map(|_| {
            let body = body.to_string();
            std::thread::spawn(move || {
                let mut s = Streaming::open(
                    addr,
                    "POST",
                    path,
                    &[("Content-Type", "application/json")],
                    body.as_bytes(),
                );
                String::from_utf8_lossy(&s.read_all()).into_owned()
            })
        })
        .collect();
    let mut most = 0;
    while !workers.iter().all(|w| w.is_finished()) {
        most = most.max(sample());
        std::thread::sleep(every);
    }
    (
        most,
        workers.into_iter().map(|w| w.join().expect("stream thread")).collect(),
    )
}
