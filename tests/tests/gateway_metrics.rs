//! `/metrics` on the gateway: its own `sparkgate_` families and rank 0's `vllm:` families in one
//! exposition that a Prometheus text parser reads (in front of vllm-sim and of the real vLLM
//! frontend), `sparkgate_upstream_up 0` with only the gateway's families when rank 0 is gone, and
//! every metric the Grafana dashboard in docs/ queries.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{post_json, request};
use sparkgate_tests::realvllm::RealVllm;

mod common;
use common::{ds_pair, SIM};
use sparkgate_tests::test_gateway::TestGateway;

/// The family names prometheus_client's text parser finds in `text` (it raises on bad syntax).
fn parse(text: &str) -> Vec<String> {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as f\nfor m in f(sys.stdin.read()): print(m.name)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with prometheus_client (bash .ci/run installs it)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "not a valid exposition: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn metrics(gw: &Gateway) -> String {
    request(gw.addr, "GET", "/metrics", &[], b"").text()
}

#[test]
fn one_exposition_with_both_families_and_the_upstream_gauge() {
    let (mut sim, gw) = ds_pair(&[], &[]);
    let smoke = json!({"messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 8});
    assert_eq!(post_json(gw.addr, "/v1/chat/completions", &smoke).status, 200);
    let text = metrics(&gw);
    let names = parse(&text);
    assert!(names.iter().any(|n| n == "sparkgate_requests"), "{names:?}");
    assert!(names.iter().any(|n| n == "vllm:num_requests_running"), "{names:?}");
    assert!(text.contains("sparkgate_upstream_up 1\n"), "{text}");
    sim.proc.kill();
    // The rank's text is reused for at most a second: wait for the next fetch.
    let deadline = Instant::now() + Duration::from_secs(10);
    let down = loop {
        let t = metrics(&gw);
        if t.contains("sparkgate_upstream_up 0\n") || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(down.contains("sparkgate_upstream_up 0\n"), "{down}");
    assert!(!down.contains("vllm:"), "only the gateway's families without rank 0");
    parse(&down);
}

#[test]
fn the_real_frontends_families_merge_into_a_valid_exposition() {
    let real = RealVllm::start(VllmRelease::V0_33, ProfileId::DeepSeekV41Flash);
    let gw = TestGateway::builder(SIM).upstream(real.addr).start();
    let names = parse(&metrics(&gw));
    for family in [
        "vllm:iteration_tokens_total",
        "vllm:num_requests_waiting",
        "sparkgate_upstream_up",
    ] {
        assert!(names.iter().any(|n| n == family), "{family} in {names:?}");
    }
}

/// The metric names the dashboard's queries use (`sparkgate_…` and `vllm:…`).
fn dashboard_metrics() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
                if (word.starts_with("sparkgate_") || word.starts_with("vllm:")) && !names.iter().any(|n| n == word) {
                    names.push(word.to_owned());
                }
            }
        }
    }
    names
}

#[test]
fn every_metric_the_dashboard_queries_is_in_the_exposition() {
    // Supervised, and restarted once: the group lifecycle panels read the supervisor's restarts.
    let gw = sparkgate_tests::test_gateway::TestGateway::builder(common::SIM).start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    assert!(sparkgate_tests::http::request(gw.addr, "POST", "/admin/restart", &[], b"").status < 300);
    gw.wait_status("serving again", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    // One answer of each kind, so the latency histograms have samples.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    assert_eq!(post_json(gw.addr, "/v1/chat/completions", &chat).status, 200);
    let mut stream = chat.clone();
    stream["stream"] = json!(true);
    assert_eq!(post_json(gw.addr, "/v1/chat/completions", &stream).status, 200);
    let text = metrics(&gw);
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let wanted = dashboard_metrics();
    assert!(wanted.len() >= 15, "{wanted:?}");
    let missing: Vec<&String> = wanted.iter().filter(|w| !samples.contains(&w.as_str())).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which /metrics lacks:\n{text}"
    );
}
