//! The wedge watch (issue #35): each node's GPUs (`nvidia-smi`'s query, in its real CSV format)
//! are read every second and its kernel log (`dmesg`) every fifth, under the node's NODE_ROOT — here a `bin/`
//! with a stand-in `nvidia-smi` or `dmesg`, since this machine has no GPU. A stall whose GPUs
//! are busy at low power is restarted as a collective hang; an Xid line in the worker's kernel
//! log (read over SSH) shows in `status`, and a fatal one (79: the GPU fell off the bus) ends
//! the group with the line as the reason. A node without `nvidia-smi` says so once.

use serde_json::json;
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::hosts::{stand_in, Sshd};
use sparkgate_tests::http::Streaming;
use sparkgate_tests::logevents;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn stream(gw: &Gateway) -> Streaming {
    let body = json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}],
        "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let mut s = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    assert_eq!(s.status, 200);
    let mut raw = Vec::new();
    while sparkgate_tests::sse::events(&raw).len() < 3 {
        raw.extend(s.next_chunk().expect("the stream runs"));
    }
    s
}

#[test]
fn a_stall_with_busy_gpus_at_low_power_is_restarted_as_a_collective_hang() {
    let roots = tempfile::tempdir().unwrap();
    stand_in(
        &roots.path().join("head"),
        "nvidia-smi",
        "echo '0, 99, 31.50, 150.00, 61'",
    );
    let template = roots.path().join("{node}").display().to_string();
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("NODE_ROOT", template.as_str()),
            ("STALL_TIMEOUT", "6"),
            ("SIM_SPEED", "0.3"),
        ])
        .start();
    let s = gw.wait_status("the GPUs sampled", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["gpus"].as_array().is_some_and(|g| !g.is_empty())
    });
    let gpu = &s["supervisor"]["gpus"][0];
    assert_eq!(gpu["node"], "head", "{s}");
    assert_eq!(gpu["gpus"][0]["utilization_pct"], 99.0, "{s}");
    assert_eq!(gpu["gpus"][0]["power_limit_w"], 150.0, "{s}");
    let _stream = stream(&gw);
    let rank1 = gw.signal_rank(1, "-STOP").to_string();
    let s = gw.wait_status("restarted", |s| {
        s["supervisor"]["epoch"] == 2 && s["supervisor"]["state"] == "ready"
    });
    let _ = std::process::Command::new("kill").args(["-CONT", &rank1]).status();
    let reason = s["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("collective hang (the GPUs are busy at low power): no engine step"),
        "{reason}"
    );
}

#[test]
fn an_xid_in_the_workers_kernel_log_shows_in_status_and_a_fatal_one_ends_the_group() {
    let roots = tempfile::tempdir().unwrap();
    let kern = roots.path().join("worker/kern.log");
    std::fs::create_dir_all(kern.parent().unwrap()).unwrap();
    std::fs::write(&kern, "[    1.000000] Linux version 6.11.0-1016-nvidia\n").unwrap();
    stand_in(
        &roots.path().join("worker"),
        "dmesg",
        &format!("cat '{}'", kern.display()),
    );
    let sshd = Sshd::start();
    let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
    let mut env = sshd.worker_env(control.path());
    env.push(("NODE_ROOT".into(), roots.path().join("{node}").display().to_string()));
    let gw = TestGateway::builder(SIM).envs(&env).start();
    // The worker read over SSH: that round also read its kernel log (its history) before the Xid.
    gw.wait_status("ready and the worker read", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["memory"][1]["mem_available_gib"].is_number()
    });
    let append = |line: &str| {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().append(true).open(&kern).unwrap();
        writeln!(f, "{line}").unwrap();
    };
    append("[  812.004000] NVRM: Xid (PCI:0000:01:00): 13, pid=4415, name=python3, Graphics SM Warp Exception");
    let s = gw.wait_status("the Xid in status", |s| {
        s["supervisor"]["kernel_events"]
            .as_array()
            .is_some_and(|k| !k.is_empty())
    });
    let e = &s["supervisor"]["kernel_events"][0];
    assert_eq!(e["node"], "worker", "{s}");
    assert_eq!(e["kind"], json!({"xid": {"xid": 13, "fatal": false}}), "{s}");
    assert_eq!(
        (s["supervisor"]["epoch"].as_u64(), s["supervisor"]["state"].as_str()),
        (Some(1), Some("ready")),
        "{s}"
    );
    append("[  813.100000] NVRM: Xid (PCI:0000:01:00): 79, pid=4415, name=python3, GPU has fallen off the bus.");
    let s = gw.wait_status("the group restarted", |s| s["supervisor"]["epoch"] == 2);
    let reason = s["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("worker kernel: [  813.100000] NVRM: Xid (PCI:0000:01:00): 79"),
        "{reason}"
    );
    let lines = logevents::parse(&gw.proc.log());
    assert_eq!(logevents::named(&lines, "kernel_log").len(), 2, "{lines:#?}");
    // Neither node has nvidia-smi here: each says so once, whatever the epochs.
    let off = logevents::named(&lines, "gpu_watch_off");
    assert_eq!(off.len(), 2, "{off:#?}");
    assert!(off.iter().all(|l| l.level == "INFO"));
}
