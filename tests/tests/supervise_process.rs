//! The supervisor with RUNTIME=process: `sparkgate serve` starts two vllm-sim ranks (worker first),
//! serves when rank 0 is ready, restarts the group as a unit when a rank dies, gives up after the
//! budget, diagnoses a stalled start, and obeys the operator commands.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_tests::harness::{Gateway, SMOKE};
use sparkgate_tests::hosts::{kill_pid, processes_with};
use sparkgate_tests::http::{post_json, request, sse_data, Streaming};
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn pids(status: &Value) -> Vec<u64> {
    status["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].as_u64().unwrap())
        .collect()
}

fn pid_of(status: &Value, rank: u64) -> u64 {
    status["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rank"] == rank)
        .unwrap()["pid"]
        .as_u64()
        .unwrap()
}

fn alive(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
}

#[test]
fn cold_start_of_both_profiles_answers_the_smoke_request() {
    for profile in ["deepseek-v4.1-flash", "glm-5.3-flash"] {
        let logs = tempfile::tempdir().unwrap();
        let gw = TestGateway::builder(SIM).profile(profile).logs(logs.path()).start();
        let b = gw.smoke();
        assert_eq!(b["choices"][0]["message"]["content"], "323", "{profile}");
        let s = gw.status();
        assert_eq!(s["supervisor"]["state"], "ready");
        assert_eq!(s["supervisor"]["epoch"], 1);
        let ranks = s["supervisor"]["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2);
        assert!(ranks.iter().all(|r| r["running"] == true));
        let log0 = std::fs::read_to_string(logs.path().join("epoch-1/rank0.log")).unwrap();
        assert!(
            log0.contains("Application startup complete."),
            "rank logs are captured per epoch"
        );
        let log1 = std::fs::read_to_string(logs.path().join("epoch-1/rank1.log")).unwrap();
        assert!(log1.contains("headless"));
    }
}

#[test]
fn a_killed_worker_restarts_the_group_and_queued_requests_complete() {
    let gw = TestGateway::builder(SIM).env("SIM_SPEED", "1").start();
    let old = gw.status();
    let old_pids = pids(&old);
    // One stream in flight, one more request filling MAX_NUM_SEQS=2, one queued.
    let long = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000, "ignore_eos": true, "stream": true});
    let mut stream = Streaming::post_json(gw.addr, "/v1/chat/completions", &long);
    let mut got = stream.next_chunk().unwrap();
    let addr = gw.addr;
    let second = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "ignore_eos": true}),
        )
    });
    let queued = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": SMOKE}], "max_tokens": 32, "chat_template_kwargs": {"enable_thinking": false}}),
        )
    });
    gw.wait_status("2 running, 1 queued", |s| {
        s["admission"]["queued"] == 1 && s["admission"]["in_flight"] == 2
    });
    let killed_at = Instant::now();
    kill_pid(pid_of(&old, 1));
    let restarting = gw.wait_status("restart noticed", |s| s["supervisor"]["state"] != "ready");
    let detection = killed_at.elapsed();
    eprintln!(
        "group restart detected {:.3}s after the worker was killed ({})",
        detection.as_secs_f64(),
        restarting["supervisor"]["state"]
    );
    assert!(detection <= Duration::from_secs(5), "detected in {detection:?}");
    got.extend(stream.read_all());
    let events = sse_data(&got);
    assert_eq!(events.last().unwrap(), "[DONE]");
    // Cut by the restart, it is continued on the new group (docs/resume.md).
    assert!(
        !events
            .iter()
            .any(|e| e.contains("\"error\"") || e.contains("token_ids\":["))
            && events.iter().any(|e| e.contains("\"finish_reason\":\"")),
        "the stream in flight is continued: {}",
        events.join("\n")
    );
    // A non-streaming request whose answer had not started is queued again and answered by the
    // new group; the queued one was held through the restart.
    let second = second.join().unwrap();
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["usage"]["completion_tokens"], 60);
    let q = queued.join().unwrap();
    assert_eq!(q.status, 200, "{}", q.text());
    assert_eq!(q.json()["choices"][0]["message"]["content"], "323");
    let new = gw.wait_status("ready epoch 2", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    assert!(new["supervisor"]["last_restart"]["reason"]
        .as_str()
        .unwrap()
        .contains("rank 1 exited"));
    for pid in old_pids {
        assert!(!alive(pid), "rank of epoch 1 (pid {pid}) outlived its epoch");
        assert!(!pids(&new).contains(&pid));
    }
}

#[test]
fn a_killed_head_restarts_the_group_too() {
    let gw = TestGateway::builder(SIM).profile("glm-5.3-flash").start();
    let old = gw.status();
    kill_pid(pid_of(&old, 0));
    let new = gw.wait_status("ready epoch 2", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    // The worker exits too when its head is gone; whichever exit is seen first names it.
    let reason = new["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("rank 0 exited") || reason.contains("rank 1 exited"),
        "{reason}"
    );
    assert!(!alive(pid_of(&old, 0)));
    assert!(
        !alive(pid_of(&old, 1)),
        "the worker of the old epoch was stopped with the group"
    );
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
}

#[test]
fn a_rank_that_keeps_crashing_ends_failed_with_nothing_left_running() {
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("SIM_FAULT_CRASH_AFTER_S", "0.3"),
            ("RESTART_BUDGET", "2"),
            ("RESTART_BACKOFF_INITIAL", "0.1"),
        ])
        .start_unready();
    let failed = gw.wait_status("failed", |s| s["supervisor"]["state"] == "failed");
    assert!(
        failed["supervisor"]["reason"]
            .as_str()
            .unwrap()
            .contains("gave up after 2 failures"),
        "{failed}"
    );
    assert_eq!(failed["supervisor"]["epoch"], 3, "the first start and two restarts");
    assert!(
        failed["supervisor"]["reason"]
            .as_str()
            .unwrap()
            .contains("last lines: "),
        "the operator's status quotes the rank's log: {failed}"
    );
    // Anyone may ask /ready: one word, no log line.
    let ready = request(gw.addr, "GET", "/ready", &[], b"");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json(), json!({"ready": false, "state": "failed"}));
    let r = post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 503);
    let vllm_port = format!("--port {}", gw.upstream_port());
    assert!(
        processes_with(&vllm_port).is_empty(),
        "no rank of any epoch is left running"
    );
}

#[test]
fn a_stalled_start_writes_diagnostics_and_fails_clearly() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .envs(&[
            ("SIM_FAULT_HANG_AT_START", "1"),
            ("HANG_SECONDS", "1"),
            ("RESTART_BUDGET", "1"),
        ])
        .start_unready();
    let s = gw.wait_status("restarting after the stall", |s| {
        s["supervisor"]["last_restart"]["reason"].is_string()
    });
    let reason = s["supervisor"]["last_restart"]["reason"].as_str().unwrap().to_owned();
    assert!(reason.starts_with("start stalled: no rank-0 log line for"), "{reason}");
    let dir = logs.path().join("epoch-1/diagnostics");
    assert_eq!(
        s["supervisor"]["last_restart"]["diagnostics"],
        dir.display().to_string(),
        "status names the bundle: {s}"
    );
    let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
    assert!(
        summary.contains("HANG_SECONDS=1") && summary.contains("MemAvailable"),
        "{summary}"
    );
    let tail = std::fs::read_to_string(dir.join("rank0-tail.log")).unwrap();
    assert!(tail.contains("Loading safetensors checkpoint shards:  20%"), "{tail}");
    gw.wait_status("failed", |s| s["supervisor"]["state"] == "failed");
}

#[test]
fn sigterm_stops_the_rank_processes() {
    let mut gw = TestGateway::builder(SIM).start();
    let ranks = pids(&gw.status());
    gw.proc.terminate();
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
    for pid in ranks {
        assert!(
            !alive(pid),
            "rank pid {pid} outlived the gateway (process runtime cannot be adopted)"
        );
    }
}

/// The log of a gateway over `logs` with `env` that refuses to start (it exits unsuccessfully).
fn refused(logs: &std::path::Path, env: &[(&str, &str)]) -> String {
    let mut p = TestGateway::builder(SIM).logs(logs).envs(env).spawn();
    assert!(!p.wait_exit(Duration::from_secs(30)).success());
    p.log().join("\n")
}

#[test]
fn memguard_restarts_the_group_when_memory_stays_low() {
    let logs = tempfile::tempdir().unwrap();
    let log = refused(logs.path(), &[("MIN_FREE_DISK_GIB", "1000000")]);
    assert!(log.contains("GiB free but MIN_FREE_DISK_GIB is 1000000"), "{log}");
    let meminfo = logs.path().join("meminfo");
    std::fs::write(&meminfo, "MemTotal: 25165824 kB\nMemAvailable: 8388608 kB\n").unwrap();
    let path = meminfo.display().to_string();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .envs(&[("MEM_GUARD", "1"), ("MEM_GUARD_GIB", "1.5"), ("MEMINFO_PATH", &path)])
        .start();
    assert_eq!(gw.status()["supervisor"]["epoch"], 1);
    // 1 GiB available: under the 1.5 GiB threshold on consecutive samples.
    std::fs::write(&meminfo, "MemTotal: 25165824 kB\nMemAvailable: 1048576 kB\n").unwrap();
    let s = gw.wait_status("memguard restart", |s| {
        s["supervisor"]["last_restart"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("memguard"))
    });
    assert!(
        s["supervisor"]["last_restart"]["reason"]
            .as_str()
            .unwrap()
            .contains("MemAvailable 1.00 GiB < MEM_GUARD_GIB 1.5"),
        "{s}"
    );
    std::fs::write(&meminfo, "MemTotal: 25165824 kB\nMemAvailable: 8388608 kB\n").unwrap();
    gw.wait_status("ready again", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"].as_u64().unwrap() >= 2
    });
}

#[test]
fn preflight_refuses_busy_ports_too_little_memory_or_disk() {
    let logs = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let log = refused(logs.path(), &[("VLLM_PORT", &port)]);
    assert!(
        log.contains(&format!("preflight: head: VLLM_PORT={port} is already in use")),
        "{log}"
    );
    let log = refused(logs.path(), &[("MIN_FREE_DISK_GIB", "1000000")]);
    assert!(log.contains("GiB free but MIN_FREE_DISK_GIB is 1000000"), "{log}");
    let meminfo = logs.path().join("meminfo");
    std::fs::write(&meminfo, "MemAvailable: 20971520 kB\n").unwrap();
    let path = meminfo.display().to_string();
    let log = refused(
        logs.path(),
        &[
            ("WEIGHTS_GIB_PER_RANK", "99.5"),
            ("BOOT_MARGIN_GIB", "12"),
            ("MEMINFO_PATH", &path),
        ],
    );
    assert!(
        log.contains("preflight: head: MemAvailable is 20.0 GiB but a rank needs 111.5 GiB"),
        "{log}"
    );
}

#[test]
fn a_remote_worker_runs_its_rank_over_ssh() {
    let sshd = sparkgate_tests::hosts::Sshd::start();
    let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
    let logs = tempfile::tempdir().unwrap();
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let (port, key, known, ctl) = (
        sshd.port.to_string(),
        sshd.key().display().to_string(),
        sshd.dir.path().join("known_hosts").display().to_string(),
        control.path().display().to_string(),
    );
    let env = [
        ("HEAD_IP", "127.0.0.1"),
        ("WORKER_IP", "127.0.0.2"),
        ("WORKER_USER", user.as_str()),
        ("WORKER_SSH_PORT", port.as_str()),
        ("WORKER_SSH_KEY", key.as_str()),
        ("SSH_KNOWN_HOSTS_FILE", known.as_str()),
        ("SSH_CONTROL_DIR", ctl.as_str()),
        ("RANK_ENV", "SIM_LOAD_SECONDS=0"),
    ];
    let mut gw = TestGateway::builder(SIM).logs(logs.path()).envs(&env).start();
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    assert!(
        sshd.log().contains("Accepted publickey"),
        "the worker rank was started over SSH:\n{}",
        sshd.log()
    );
    let worker_pid = pid_of(&gw.status(), 1);
    assert!(alive(worker_pid));
    let log1 = std::fs::read_to_string(logs.path().join("epoch-1/rank1.log")).unwrap();
    assert!(
        log1.contains("headless"),
        "the remote rank's output is captured: {log1}"
    );
    // The remote rank dying restarts the group, the worker rank again over SSH.
    let killed = Instant::now();
    sparkgate_tests::hosts::kill_pid(worker_pid);
    gw.wait_status("restart noticed", |s| s["supervisor"]["state"] != "ready");
    eprintln!(
        "process over SSH: group restart detected {:.3}s after the remote worker was killed",
        killed.elapsed().as_secs_f64()
    );
    let new = gw.wait_status("ready epoch 2", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    let reason = new["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("rank 1 exited (killed by a signal); last lines: "),
        "{reason}"
    );
    let worker_pid = pid_of(&new, 1);
    assert!(alive(worker_pid));
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    gw.proc.terminate();
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
    assert!(!alive(worker_pid), "the remote rank was stopped over SSH");
}

#[test]
fn readiness_needs_a_one_token_completion() {
    // The ranks come up and answer /health, then stop generating (as vLLM does when a rank
    // is lost): /health and /v1/models alone would call this group ready.
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("SIM_FAULT_HANG_AFTER_S", "0"),
            ("READY_TIMEOUT", "2"),
            ("RESTART_BUDGET", "1"),
        ])
        .start_unready();
    let s = gw.wait_status("the start failed", |s| {
        s["supervisor"]["last_restart"]["reason"].is_string()
    });
    let reason = s["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("READY_TIMEOUT=2s") && reason.contains("one-token completion failed"),
        "{reason}"
    );
    assert_ne!(s["supervisor"]["state"], "ready");
}

/// Finished requests on rank 0, from its Prometheus counter.
fn rank0_finished_requests(gw: &Gateway) -> f64 {
    sparkgate_tests::load::rank0_metric(gw, "vllm:request_success_total")
}

#[test]
fn warm_up_requests_reach_the_ranks_before_admission_opens() {
    // DeepSeek dspark: MAX_NUM_SEQS 2 → warm-up at concurrency 1 and 2 (3 requests), after the
    // one-token readiness probe; nothing is sent by a client before these counts are read.
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM).logs(logs.path()).start();
    assert_eq!(rank0_finished_requests(&gw), 4.0, "probe + 1 + 2 warm-up requests");
    assert!(
        gw.proc.has_line("boot-shape warm-up done"),
        "{}",
        gw.proc.log().join("\n")
    );
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        !metrics.contains("route=\"chat\""),
        "no client request was served yet: {metrics}"
    );

    let logs = tempfile::tempdir().unwrap();
    let cold = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("BOOT_SHAPE_WARMUP", "0")
        .start();
    assert_eq!(rank0_finished_requests(&cold), 1.0, "only the readiness probe");
}
