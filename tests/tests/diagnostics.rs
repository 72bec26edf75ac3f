//! Every unplanned restart leaves a trail (docs/operations.md, "Events" and "Diagnostics"):
//! after a SIGKILL of rank 0 and after a mid-serve stall, `LOG_DIR/epoch-N/diagnostics/` holds
//! the reason, each rank's log tail, rank 0's last `/metrics` scrape and heartbeat history, the
//! requests in flight by key name and route, and the node's facts; `status` (JSON and the CLI's
//! table) names it and `sparkgate logs --diagnostics` prints it; no key and no request body is
//! in it. The loss logs exactly one WARN line (`group_lost`, naming the bundle), and a 30 s
//! stall at most five lines, one of them a WARN.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::Streaming;
use sparkgate_tests::logevents::{self, Line};
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const KEY: &str = "sk-diag-0123456789abcdef-secret";
/// A word only the request body holds.
const MARKER: &str = "quokka-marmalade-7731";

fn start(logs: &Path, extra: &[(&str, &str)]) -> Gateway {
    let mut env = vec![("API_KEYS", format!("alice={KEY}")), ("SIM_SPEED", "0.3".to_owned())];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let gw = TestGateway::builder(SIM).logs(logs).envs(&env).start();
    // Serving, and sampled once (rank 0's scrape comes with the first memory sample).
    gw.wait_status("serving and sampled", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["memory"].as_array().is_some_and(|m| !m.is_empty())
    });
    gw
}

/// A stream from alice, open and past its first events when this returns (closed with it).
fn stream_in_flight(gw: &Gateway) -> Streaming {
    let body = json!({"model": "DeepSeek-v4.1-Flash-EXL3", "stream": true, "max_tokens": 400,
        "messages": [{"role": "user", "content": format!("tell me about the {MARKER}")}]});
    let auth = format!("Bearer {KEY}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200);
    let mut raw = Vec::new();
    while sparkgate_tests::sse::events(&raw).len() < 3 {
        raw.extend(s.next_chunk().expect("the stream runs"));
    }
    s
}

/// The status once epoch 2 serves, with the lost epoch's restart.
fn after_restart(gw: &Gateway) -> Value {
    gw.wait_status("epoch 2 ready", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    })
}

/// The bundle `status` names, read whole; holds it to every part and to no secret.
fn bundle(status: &Value, cause: &str) -> (String, std::collections::BTreeMap<String, String>) {
    let last = &status["supervisor"]["last_restart"];
    assert_eq!(last["cause"], cause, "{status}");
    let dir = last["diagnostics"]
        .as_str()
        .unwrap_or_else(|| panic!("status names the bundle: {status}"));
    assert!(dir.ends_with("epoch-1/diagnostics"), "{dir}");
    let files: std::collections::BTreeMap<String, String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let text = String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned();
            (e.file_name().into_string().unwrap(), text)
        })
        .collect();
    for part in [
        "summary.txt",
        "rank0-tail.log",
        "rank1-tail.log",
        "heartbeat.tsv",
        "rank0-metrics.txt",
        "in-flight.tsv",
        "node-head.txt",
    ] {
        assert!(files.contains_key(part), "{part} in {:?}", files.keys());
    }
    let summary = &files["summary.txt"];
    assert!(
        summary.starts_with("reason: ") && summary.contains(&format!("cause: {cause}")),
        "{summary}"
    );
    assert!(
        files["rank0-tail.log"].lines().count() > 3,
        "{}",
        files["rank0-tail.log"]
    );
    assert!(files["rank0-metrics.txt"].contains("vllm:num_requests_running"));
    let beats = &files["heartbeat.tsv"];
    assert!(
        beats.starts_with("unix_time\thealthy\tengine_steps") && beats.lines().count() >= 2,
        "{beats}"
    );
    let in_flight = &files["in-flight.tsv"];
    let row = in_flight
        .lines()
        .find(|l| l.contains("\talice\tchat\t"))
        .unwrap_or_else(|| panic!("alice's stream is listed: {in_flight}"));
    let cols: Vec<&str> = row.split('\t').collect();
    assert!(
        cols[0].starts_with("sg-") && cols[4].parse::<u64>().unwrap() > 0,
        "{row}"
    );
    let node = &files["node-head.txt"];
    assert!(
        node.contains("MemAvailable:") && node.contains("== nvidia-smi") && node.contains("== kernel log"),
        "{node}"
    );
    for (name, text) in &files {
        assert!(!text.contains(KEY) && !text.contains("sk-diag"), "{name} holds the key");
        assert!(!text.contains(MARKER), "{name} holds the request body");
    }
    (dir.to_owned(), files)
}

/// The lines about the loss: exactly one loud one, the `group_lost` naming the bundle.
fn one_warning_names(lines: &[Line], dir: &str) {
    let lost = logevents::named(lines, "group_lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].level, "WARN", "{lost:?}");
    assert!(lost[0].text.contains(&format!("diagnostics in {dir}")), "{lost:?}");
    for l in lines.iter().filter(|l| l.loud()) {
        assert!(
            l.event.is_some(),
            "every WARN or ERROR line is an event of the table: {l:?}"
        );
    }
}

#[test]
fn a_killed_rank_0_leaves_a_bundle_that_status_and_the_cli_name() {
    let logs = tempfile::tempdir().unwrap();
    let gw = start(logs.path(), &[]);
    let stream = stream_in_flight(&gw);
    gw.signal_rank(0, "-KILL");
    let status = after_restart(&gw);
    drop(stream);
    let (dir, files) = bundle(&status, "killed");
    assert!(
        files["summary.txt"].contains("rank 0 exited"),
        "{}",
        files["summary.txt"]
    );
    let lines = logevents::parse(&gw.proc.log());
    one_warning_names(&lines, &dir);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(sparkgate_bin(SIM))
            .args(args)
            .env("PORT", gw.addr.port().to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = cli(&["status"]);
    assert!(table.contains(&format!("diagnosed  {dir}")), "{table}");
    let printed = cli(&["logs", "--diagnostics"]);
    assert!(printed.contains("epoch 1 ") && printed.contains(&dir), "{printed}");
    assert!(
        printed.contains("==> in-flight.tsv <==") && printed.contains("\talice\tchat\t"),
        "{printed}"
    );
    assert!(!printed.contains(KEY), "{printed}");
}

#[test]
fn a_thirty_second_stall_logs_at_most_five_lines_and_leaves_a_bundle() {
    let logs = tempfile::tempdir().unwrap();
    let gw = start(logs.path(), &[("STALL_TIMEOUT", "30"), ("PROGRESS_TIMEOUT", "600")]);
    let stream = stream_in_flight(&gw);
    let rank1 = gw.signal_rank(1, "-STOP").to_string();
    let status = after_restart(&gw);
    let _ = std::process::Command::new("kill").args(["-CONT", &rank1]).status();
    drop(stream);
    let (dir, files) = bundle(&status, "unwell");
    assert!(
        files["summary.txt"].contains("STALL_TIMEOUT=30s"),
        "{}",
        files["summary.txt"]
    );
    // The heartbeat shows the engine's steps standing still with work pending.
    let still: Vec<&str> = files["heartbeat.tsv"].lines().rev().take(5).collect();
    assert!(
        still
            .windows(2)
            .all(|w| w[0].split('\t').nth(2) == w[1].split('\t').nth(2)),
        "{still:?}"
    );
    let lines = logevents::parse(&gw.proc.log());
    one_warning_names(&lines, &dir);
    let stall: Vec<&Line> = lines
        .iter()
        .filter(|l| l.is("stalled") || l.is("still_stalled") || l.is("stall_over") || l.is("group_lost"))
        .collect();
    assert!(stall.len() <= 5, "{stall:#?}");
    assert_eq!(
        stall.iter().filter(|l| l.loud()).count(),
        2,
        "the stall's and the loss's: {stall:#?}"
    );
    assert_eq!(logevents::named(&lines, "stalled").len(), 1, "{stall:#?}");
    let waited = Duration::from_secs(30);
    assert!(status["supervisor"]["last_restart"]["detected_in_s"].as_f64().unwrap() >= waited.as_secs_f64());
}
