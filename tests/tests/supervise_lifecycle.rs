//! The supervisor's state machine and rank hygiene from outside (RUNTIME=process, vllm-sim
//! ranks): a start on a running group touches nothing, a mode switch asked during backoff is
//! applied next, a terminal's Ctrl-C never reaches the ranks, a stop takes a rank's own
//! processes with it, a killed gateway takes its ranks with it, ranks see only the plan's
//! environment, and a rank's invalid UTF-8 never ends its log capture.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_tests::harness::addr_in;
use sparkgate_tests::http::{post_json, request, sse_data, Streaming};
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn rank_pids(status: &Value) -> Vec<u32> {
    status["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].as_u64().unwrap() as u32)
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
}

/// Polls `cond` for up to `within`.
fn eventually(within: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn signal(target: &str, sig: &str) {
    assert!(std::process::Command::new("kill")
        .args([sig, "--", target])
        .status()
        .unwrap()
        .success());
}

#[test]
fn start_on_a_running_group_touches_nothing() {
    let gw = TestGateway::builder(SIM).env("SIM_SPEED", "20").start();
    let before = gw.status();
    let body = json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}],
                      "max_tokens": 120, "ignore_eos": true, "stream": true,
                      "chat_template_kwargs": {"enable_thinking": false}});
    let mut stream = Streaming::post_json(gw.addr, "/v1/chat/completions", &body);
    assert!(stream.next_chunk().is_some(), "the stream runs");
    for _ in 0..2 {
        let r = request(gw.addr, "POST", "/admin/start", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["already_running"], true, "{}", r.text());
    }
    let events = sse_data(&stream.read_all());
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "the stream was not cut"
    );
    assert!(!events.iter().any(|e| e.contains("\"error\"")), "{events:?}");
    let after = gw.status();
    assert_eq!(
        after["supervisor"]["epoch"], before["supervisor"]["epoch"],
        "no new epoch"
    );
    assert_eq!(rank_pids(&after), rank_pids(&before), "the same ranks");
    assert_eq!(after["supervisor"]["restarts"], 0);
}

#[test]
fn a_mode_switch_asked_during_backoff_is_applied_next() {
    // Every rank dies 2 s after it starts: the group keeps failing and backs off 3 s each time.
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("SIM_FAULT_CRASH_AFTER_S", "2"),
            ("RESTART_BACKOFF_INITIAL", "3"),
            ("RESTART_BUDGET", "5"),
        ])
        .start_unready();
    let waiting = gw.wait_status("backoff", |s| {
        s["supervisor"]["retry_in_s"].as_f64().is_some_and(|r| r > 0.0)
    });
    assert_eq!(waiting["supervisor"]["mode"], "dspark", "{waiting}");
    let epoch = waiting["supervisor"]["epoch"].as_u64().unwrap();
    let r = post_json(gw.addr, "/admin/spec?force=1", &json!({"mode": "none"}));
    assert_eq!(r.status, 202, "{}", r.text());
    let next = gw.wait_status("the next epoch", |s| s["supervisor"]["epoch"].as_u64() > Some(epoch));
    assert_eq!(
        next["supervisor"]["mode"], "none",
        "the switch asked during backoff applies: {next}"
    );
    assert_eq!(next["supervisor"]["max_num_seqs"], 4, "{next}");
}

#[test]
fn ctrl_c_to_the_foreground_group_drains_the_gateway_and_never_reaches_the_ranks() {
    let env = [("SIM_SPEED", "3"), ("DRAIN_TIMEOUT", "30")];
    let mut proc = TestGateway::builder(SIM).envs(&env).own_process_group().spawn();
    let addr = addr_in(&proc.wait_for("sparkgate listening on http://"));
    let gw_pid = proc.pid();
    let ready = eventually(Duration::from_secs(60), || {
        request(addr, "GET", "/ready", &[], b"").status == 200
    });
    assert!(ready, "{}", proc.log().join("\n"));
    let status = request(addr, "GET", "/admin/status", &[], b"").json();
    let ranks = rank_pids(&status);
    let body = json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}],
                      "max_tokens": 80, "ignore_eos": true, "stream": true,
                      "chat_template_kwargs": {"enable_thinking": false}});
    let mut stream = Streaming::post_json(addr, "/v1/chat/completions", &body);
    assert!(stream.next_chunk().is_some(), "the stream runs");
    // What a terminal does on Ctrl-C: SIGINT to every process of the foreground group.
    signal(&format!("-{gw_pid}"), "-INT");
    let events = sse_data(&stream.read_all());
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "the open stream finishes within the drain: {events:?}"
    );
    assert!(
        !events.iter().any(|e| e.contains("\"error\"")),
        "the ranks kept serving through the drain: {events:?}"
    );
    assert!(
        proc.wait_exit(Duration::from_secs(60)).success(),
        "{}",
        proc.log().join("\n")
    );
    let log = proc.log().join("\n");
    assert!(
        !log.contains("epoch=2"),
        "no new group is started during shutdown:\n{log}"
    );
    for pid in ranks {
        assert!(!alive(pid), "rank {pid} outlived the gateway");
    }
}

#[test]
fn a_stop_takes_the_processes_a_rank_started_with_it() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("SIM_SPAWN_HELPER", "1")
        .start();
    let rank0_log = logs.path().join("epoch-1").join("rank0.log");
    let text = std::fs::read_to_string(&rank0_log).unwrap();
    let helper: u32 = text
        .lines()
        .find_map(|l| l.split("spawned helper pid ").nth(1))
        .unwrap_or_else(|| panic!("no helper line in {text}"))
        .trim()
        .parse()
        .unwrap();
    assert!(alive(helper));
    let r = request(gw.addr, "POST", "/admin/stop", &[], b"");
    assert_eq!(r.status, 202, "{}", r.text());
    gw.wait_status("stopped", |s| s["supervisor"]["state"] == "stopped");
    assert!(
        eventually(Duration::from_secs(5), || !alive(helper)),
        "the rank's helper process {helper} outlived the stop"
    );
}

#[test]
fn a_killed_gateway_takes_its_ranks_with_it() {
    let logs = tempfile::tempdir().unwrap();
    let mut gw = TestGateway::builder(SIM).logs(logs.path()).start();
    let ranks = rank_pids(&gw.status());
    assert_eq!(ranks.len(), 2);
    gw.proc.kill();
    for pid in ranks {
        assert!(
            eventually(Duration::from_secs(10), || !alive(pid)),
            "rank {pid} outlived its SIGKILLed gateway"
        );
    }
    // The next gateway counts epochs from 1 again: its ranks' logs start files of their own,
    // and the killed gateway's are set aside, not appended to.
    let old = std::fs::read_to_string(logs.path().join("epoch-1/rank0.log")).unwrap();
    let next = TestGateway::builder(SIM).logs(logs.path()).start();
    assert_eq!(next.status()["supervisor"]["epoch"], 1);
    let fresh = std::fs::read_to_string(logs.path().join("epoch-1/rank0.log")).unwrap();
    assert!(
        !fresh.contains(&old),
        "the new rank 0 log does not continue the old one"
    );
    let aside: Vec<String> = std::fs::read_dir(logs.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("epoch-1.before-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let kept = std::fs::read_to_string(logs.path().join(&aside[0]).join("rank0.log")).unwrap();
    assert_eq!(kept, old, "the killed gateway's log is kept whole");
}

#[test]
fn ranks_see_the_plans_environment_and_none_of_the_gateways_secrets() {
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("ADMIN_TOKEN", "admin-secret-1"),
            ("GHCR_TOKEN", "ghcr-secret-2"),
            ("SOME_OTHER_TOOL_KEY", "other-secret-3"),
            ("NCCL_DEBUG", "INFO"),
        ])
        .start();
    let status = gw.with_token("GET", "/admin/status", "admin-secret-1").json();
    let pids = rank_pids(&status);
    assert_eq!(pids.len(), 2, "{status}");
    for pid in pids {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        for secret in ["admin-secret-1", "ghcr-secret-2", "other-secret-3"] {
            assert!(!environ.contains(secret), "rank {pid} has {secret} in its environment");
        }
        assert!(
            environ.split('\0').any(|v| v == "NCCL_DEBUG=INFO"),
            "the plan's pass-through reaches the rank"
        );
        assert!(
            environ.split('\0').any(|v| v.starts_with("PATH=")),
            "a rank can still find programs"
        );
    }
}

#[test]
fn invalid_utf8_from_a_rank_never_ends_its_log_capture() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("SIM_LOG_INVALID_UTF8", "1")
        .start();
    let raw = std::fs::read(logs.path().join("epoch-1").join("rank0.log")).unwrap();
    let at = raw
        .windows(2)
        .position(|w| w == b"\xff\xfe")
        .expect("the invalid bytes are kept");
    let after = String::from_utf8_lossy(&raw[at..]);
    assert!(
        after.contains("Application startup complete"),
        "lines after the invalid bytes are captured:\n{after}"
    );
    let tail = request(gw.addr, "GET", "/admin/logs?rank=0&tail=400", &[], b"").text();
    assert!(
        tail.contains("binary noise") && tail.contains("Application startup complete"),
        "{tail}"
    );
}

#[test]
fn requests_that_never_reached_a_rank_wait_for_the_next_group_instead_of_502() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("SIM_CONTROL_PORT", "0")
        .start();
    let rank0 = std::fs::read_to_string(logs.path().join("epoch-1").join("rank0.log")).unwrap();
    let control = addr_in(
        rank0
            .lines()
            .find(|l| l.contains("vllm-sim control endpoint on http://"))
            .expect("rank 0's control endpoint"),
    );
    // Rank 0's port goes dead as a killed process's does: connects refused, connections reset.
    assert_eq!(
        request(control, "POST", "/fault/refuse-connections", &[], b"").status,
        204
    );
    let vllm_port = gw.upstream_port();
    assert!(
        eventually(Duration::from_secs(5), || std::net::TcpStream::connect((
            "127.0.0.1",
            vllm_port
        ))
        .is_err()),
        "rank 0's port refuses"
    );
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let addr = gw.addr;
            std::thread::spawn(move || {
                let body = json!({"messages": [{"role": "user", "content": format!("What is 17*19? ({i})")}],
                                  "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": false}});
                post_json(addr, "/v1/chat/completions", &body)
            })
        })
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(
            r.status,
            200,
            "a request that never reached vLLM waits for the new group: {}",
            r.text()
        );
    }
    let s = gw.status();
    assert!(
        s["supervisor"]["epoch"].as_u64() >= Some(2),
        "the group was restarted: {s}"
    );
}

/// Field 22 of `/proc/<pid>/stat`: when the process started.
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_rank_an_earlier_gateway_left_running_is_removed_before_the_preflight() {
    use std::os::unix::process::CommandExt as _;
    let logs = tempfile::tempdir().unwrap();
    let port = sparkgate_tests::harness::free_port();
    // A rank of an earlier gateway, still holding VLLM_PORT, recorded in LOG_DIR/ranks.json.
    let mut leftover = std::process::Command::new(SIM)
        .args(["serve", "/model", "--host", "127.0.0.1", "--port", &port.to_string()])
        .env("SIM_LOAD_SECONDS", "0")
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = leftover.id();
    assert!(eventually(Duration::from_secs(30), || std::net::TcpStream::connect((
        "127.0.0.1",
        port
    ))
    .is_ok()));
    let state = json!({"epoch": 7, "config_hash": "earlier", "vllm_port": port,
                       "ranks": [{"rank": 0, "pid": pid, "started": start_time(pid)}]});
    std::fs::write(logs.path().join("ranks.json"), state.to_string()).unwrap();
    let port = port.to_string();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .envs(&[("VLLM_PORT", port.as_str())])
        .start();
    let _ = leftover.wait();
    let log = gw.proc.log().join("\n");
    assert!(
        log.contains(&format!("rank 0 (pid {pid}, epoch 7, port {port})")),
        "the removed process is named:\n{log}"
    );
    let r = post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let recorded: Value = serde_json::from_slice(&std::fs::read(logs.path().join("ranks.json")).unwrap()).unwrap();
    assert_eq!(
        recorded["ranks"].as_array().map(Vec::len),
        Some(2),
        "this gateway's ranks are recorded: {recorded}"
    );
}
