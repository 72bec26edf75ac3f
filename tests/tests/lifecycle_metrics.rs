//! A group's restarts as metrics and its logs' retention (docs/operations.md): an operator's
//! restart counts as planned, a SIGKILL of rank 0 as an unplanned `killed` one, the epoch and
//! state follow; with LOG_KEEP_EPOCHS=3 the fourth restart removes the oldest epoch directory
//! only, and the removal is counted.

use serde_json::Value;
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::request;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn metrics(gw: &Gateway) -> String {
    request(gw.addr, "GET", "/metrics", &[], b"").text()
}

/// The value of the sample whose line starts with `name{` and holds every label in `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn ready_in(gw: &Gateway, epoch: u64) -> Value {
    gw.wait_status(&format!("epoch {epoch} ready"), |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == epoch
    })
}

fn restart(gw: &Gateway, epoch: u64) {
    assert!(request(gw.addr, "POST", "/admin/restart", &[], b"").status < 300);
    ready_in(gw, epoch);
}

fn epochs(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("epoch-"))
        .collect();
    names.sort();
    names
}

#[test]
fn restarts_are_counted_by_reason_and_plan_and_old_epochs_are_pruned() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("LOG_KEEP_EPOCHS", "3")
        .start();
    ready_in(&gw, 1);
    let m = metrics(&gw);
    assert_eq!(sample(&m, "sparkgate_group_epoch", &[]), Some(1.0), "{m}");
    assert_eq!(sample(&m, "sparkgate_group_state", &["state=\"ready\""]), Some(1.0));
    assert_eq!(
        sample(&m, "sparkgate_group_state", &["state=\"restarting\""]),
        Some(0.0)
    );
    restart(&gw, 2);
    ready_in(&gw, 2);
    gw.signal_rank(0, "-KILL");
    ready_in(&gw, 3);
    assert_eq!(epochs(logs.path()), ["epoch-1", "epoch-2", "epoch-3"]);
    let m = metrics(&gw);
    let planned = sample(
        &m,
        "sparkgate_group_restarts_total",
        &["reason=\"operator\"", "planned=\"true\""],
    );
    let killed = sample(
        &m,
        "sparkgate_group_restarts_total",
        &["reason=\"killed\"", "planned=\"false\""],
    );
    assert_eq!((planned, killed), (Some(1.0), Some(1.0)), "{m}");
    assert_eq!(sample(&m, "sparkgate_group_epoch", &[]), Some(3.0));
    assert!(sample(
        &m,
        "sparkgate_group_last_restart_timestamp_seconds",
        &["reason=\"killed\""]
    )
    .is_some());
    let since = sample(&m, "sparkgate_group_state_since_timestamp_seconds", &[]).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(since <= now && now - since < 120.0, "{since} {now}");
    assert_eq!(sample(&m, "sparkgate_log_epochs_removed_total", &[]), Some(0.0));
    // The fourth epoch: with three kept, the oldest goes, and only it.
    restart(&gw, 4);
    assert_eq!(epochs(logs.path()), ["epoch-2", "epoch-3", "epoch-4"]);
    let m = metrics(&gw);
    assert_eq!(sample(&m, "sparkgate_log_epochs_removed_total", &[]), Some(1.0), "{m}");
    assert!(sample(&m, "sparkgate_log_bytes_removed_total", &[]).unwrap() > 0.0);
    assert_eq!(
        sample(&m, "sparkgate_group_restarts_total", &["reason=\"operator\""]),
        Some(2.0)
    );
    assert!(gw.status()["supervisor"]["logs_pruned"]["epochs"] == 1);
}
