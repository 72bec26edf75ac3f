//! The operator's side of the CLI against a supervised gateway with simulated ranks: every
//! operator command's human and `--json` output, commands that wait for their outcome and say
//! it in the exit code, errors in words, `--url` without a serving configuration, and the demo
//! (two at once on their own ports, its logs removed on exit, `config --demo`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{post_json, request};
use sparkgate_tests::snapshot::assert_snapshot;
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

#[test]
fn operator_commands_through_the_cli() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("ADMIN_TOKEN", "t0ken")
        .start();
    assert_eq!(
        request(gw.addr, "GET", "/admin/status", &[], b"").status,
        401,
        "the token is required"
    );
    assert_eq!(gw.with_token("POST", "/admin/restart", "wrong").status, 401);
    let port = gw.addr.port().to_string();
    let log_dir = logs.path().display().to_string();
    // Numbers, the log directory and the port are masked; words, order and layout are compared.
    let snap = |name: &str, out: &str| {
        assert_snapshot(
            &format!("operator/{name}"),
            out,
            &[(&log_dir, "LOG_DIR"), (&port, "PORT")],
        )
    };
    let authed = |path: &str| request(gw.addr, "GET", path, &[("Authorization", "Bearer t0ken")], b"").json();
    // The snapshot shows the memory line: wait for the first sample.
    let deadline = Instant::now() + Duration::from_secs(60);
    while authed("/admin/status")["supervisor"]["memory"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < deadline, "memory is sampled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(sparkgate_bin(SIM))
            .args(args)
            .env("PORT", &port)
            .env("ADMIN_TOKEN", "t0ken")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&["status"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("group      ready: epoch 1, mode dspark · process runtime"),
        "{out}"
    );
    let (rank0, rank1) = (
        out.find("\n0     head    running  pid "),
        out.find("\n1     worker  running  pid "),
    );
    assert!(rank0.is_some() && rank0 < rank1, "ranks in order:\n{out}");
    assert!(!out.contains('{'), "words, not JSON:\n{out}");
    // The supervisor read rank 0's /version when the group became ready (vllm-sim plays the
    // newest release unless told otherwise).
    assert!(out.contains("vllm       0.34.0 · rules 0.34.0\n"), "{out}");
    assert!(
        out.contains("throughput ") && out.contains(" tokens/s over the last 10 s"),
        "{out}"
    );
    snap("status", &out);
    let (ok, out) = cli(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(ok && v["supervisor"]["epoch"] == 1, "{out}");
    assert_eq!(v["supervisor"]["vllm"]["reported"], "0.34.0", "{out}");
    assert_eq!(
        (&v["vllm"]["version"], &v["vllm"]["fit"]),
        (&"0.34.0".into(), &"known".into()),
        "{out}"
    );
    snap("status-json", &out);
    let (ok, out) = cli(&["spec"]);
    assert!(ok && out.starts_with("mode      dspark (policy fixed)"), "{out}");
    snap("spec", &out);
    let (ok, out) = cli(&["logs", "worker", "--tail", "3"]);
    assert!(ok && out.lines().count() == 3 && out.contains("Worker_TP1"), "{out}");
    // The command waits for the new group and says when it is ready (one line per phase when
    // stdout is not a terminal).
    let (ok, out) = cli(&["restart", "--force"]);
    assert!(ok, "{out}");
    assert!(
        out.lines()
            .last()
            .is_some_and(|l| l.starts_with("ready in ") && l.contains("epoch 2")),
        "{out}"
    );
    let phases: Vec<&str> = out.lines().filter(|l| l.contains(" s  ")).collect();
    assert!(
        phases.len() >= 2 && phases.last().unwrap().contains("ready: epoch 2"),
        "the phases it passed:\n{out}"
    );
    snap("restart", &out);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(authed("/admin/status")["supervisor"]["epoch"] == 2
        && authed("/admin/status")["supervisor"]["state"] == "ready")
    {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, out) = cli(&["stop", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(
        ok && v["supervisor"]["state"] == "stopped",
        "the final status as JSON: {out}"
    );
    snap("stop-json", &out);
    let (ok, out) = cli(&["stop"]);
    assert!(ok && out.contains("already stopped; nothing changed"), "{out}");
    snap("stop-when-stopped", &out);
    while authed("/admin/status")["supervisor"]["state"] != "stopped" {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        authed("/admin/status")["supervisor"]["ranks"]
            .as_array()
            .unwrap()
            .is_empty(),
        "no rank runs after stop"
    );
    let r = post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 503);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("stopped"));
    let (ok, out) = cli(&["start", "--no-wait"]);
    assert!(ok && out.trim() == "starting; `sparkgate status` follows it", "{out}");
    gw.wait_ready();
    let (ok, out) = cli(&["start"]);
    assert!(ok && out.contains("already running (ready); nothing changed"), "{out}");
    snap("start-when-running", &out);
    let (ok, out) = cli(&["spec", "none"]);
    assert!(
        ok && out.lines().last().is_some_and(|l| l.contains("mode none")),
        "{out}"
    );
    snap("spec-switch", &out);
    let (ok, out) = cli(&["spec", "none"]);
    assert!(ok && out.contains("already in mode none; nothing changed"), "{out}");
    let (ok, out) = cli(&["spec", "none", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(ok && v == json!({"mode": "none", "switching": false}), "{out}");
    snap("spec-when-in-mode-json", &out);
    let (ok, out) = cli(&["spec", "mtp"]);
    assert!(!ok && out.contains("is not a mode of this profile"), "{out}");
    snap("spec-unknown-mode", &out);
    let (ok, out) = cli(&["spec", "turbo"]);
    assert!(
        !ok && out.contains("`turbo` is not one of: dspark, dflash, mtp, none"),
        "{out}"
    );
    snap("spec-not-a-mode", &out);
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    let (ok, out) = cli(&["status", "--url", "http://127.0.0.1:9"]);
    assert!(
        !ok && out
            .contains("no sparkgate answers at http://127.0.0.1:9 (nothing is listening there: Connection refused")
            && out.contains("); check the URL given with --url"),
        "{out}"
    );
    snap("status-nothing-listening", &out);
    // With --url no serving configuration is loaded: an invalid one does not matter.
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["status", "--url", &format!("http://{}", gw.addr)])
        .env("PORT", "18888")
        .env("ADMIN_TOKEN", "t0ken")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("group      ready"), "{text}");
    let (ok, out) = cli(&["logs", "rank", "7"]);
    assert!(
        !ok && out.contains("rank 7") && out.contains("(HTTP 4") && !out.contains("sparkgate: 4"),
        "an error in words, its status last: {out}"
    );
    snap("logs-unknown-rank", &out);
    for command in ["status", "restart", "stop", "start", "spec", "logs", "top", "bench"] {
        let (ok, out) = cli(&[command, "--help"]);
        assert!(ok, "{out}");
        snap(&format!("help-{command}"), &out);
    }
}

#[test]
fn a_start_whose_group_fails_exits_non_zero_saying_why() {
    let gw = TestGateway::builder(SIM)
        .envs(&[
            // Each rank dies while it loads: no start ever gets ready.
            ("SIM_LOAD_SECONDS", "1"),
            ("SIM_FAULT_CRASH_AFTER_S", "0.3"),
            ("RESTART_BUDGET", "1"),
            ("RESTART_BACKOFF_INITIAL", "0.1"),
        ])
        .start_unready();
    gw.wait_status("failed", |s| s["supervisor"]["state"] == "failed");
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["start", "--url", &format!("http://{}", gw.addr)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("did not come up: gave up after 1 failures in a row"),
        "{text}"
    );
    // Which rank died first is a race, so the reason after the verdict is not compared.
    let verdict = text.lines().last().unwrap_or_default();
    let verdict = verdict.split_once(" in a row").map_or(verdict, |(v, _)| v);
    assert_snapshot("operator/start-fails", verdict, &[]);
}

#[test]
fn the_demo_serves_the_smoke_request() {
    let (vllm, master) = (
        sparkgate_tests::harness::free_port().to_string(),
        sparkgate_tests::harness::free_port().to_string(),
    );
    let env = [
        ("PORT", "0"),
        ("VLLM_PORT", vllm.as_str()),
        ("MASTER_PORT", master.as_str()),
        ("SIM_LOAD_SECONDS", "0"),
        ("SIM_SPEED", "20"),
    ];
    let proc = sparkgate_tests::harness::Proc::spawn(&sparkgate_bin(SIM), &["demo".to_owned()], &env);
    let gw = Gateway::listening(proc);
    gw.proc
        .wait_for("sparkgate demo: deepseek-v4.1-flash with two simulated ranks");
    gw.wait_ready();
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    assert!(gw
        .proc
        .log()
        .iter()
        .any(|l| l.contains("HEAD_IP") || l.contains("rank started")));
    // Structured output in the demo, as the openai SDK and pydantic-ai ask for it.
    let base = gw.base_url();
    let ran = sparkgate_tests::python::script("demo_structured.py", &[&base, "DeepSeek-v4.1-Flash-EXL3"], &[])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        ran.stdout.contains("openai parse:") && ran.stdout.contains("pydantic-ai native:"),
        "{}\n{}",
        ran.stdout,
        ran.stderr
    );
}

#[test]
fn a_demo_with_its_own_log_dir_keeps_it_and_says_so() {
    let logs = tempfile::tempdir().unwrap();
    let log_dir = logs.path().join("demo-logs");
    let port = sparkgate_tests::harness::free_port().to_string();
    let env = [
        ("SIM_LOAD_SECONDS", "0"),
        ("SIM_SPEED", "20"),
        ("LOG_DIR", log_dir.to_str().unwrap()),
    ];
    let args = ["demo".to_owned(), "--port".to_owned(), port];
    let proc = sparkgate_tests::harness::Proc::spawn(&sparkgate_bin(SIM), &args, &env);
    let banner = proc.wait_for("  logs: ");
    assert!(banner.contains(log_dir.to_str().unwrap()), "{banner}");
    assert!(
        !banner.contains("removed on exit"),
        "a LOG_DIR the user set is kept: {banner}"
    );
    let gw = Gateway::listening(proc);
    gw.wait_ready();
    let mut proc = gw.proc;
    proc.terminate();
    assert!(proc.wait_exit(Duration::from_secs(60)).success());
    assert!(log_dir.join("epoch-1/rank0.log").is_file(), "the logs are still there");
}

#[test]
fn two_demos_run_side_by_side_and_each_removes_its_logs_on_exit() {
    // Only the public ports are given: vLLM's and the rendezvous port are picked free.
    let ports = [
        sparkgate_tests::harness::free_port(),
        sparkgate_tests::harness::free_port(),
    ];
    let env = [("SIM_LOAD_SECONDS", "0"), ("SIM_SPEED", "20")];
    let mut demos: Vec<Gateway> = ports
        .iter()
        .map(|p| {
            let args = ["demo".to_owned(), "--port".to_owned(), p.to_string()];
            let proc = sparkgate_tests::harness::Proc::spawn(&sparkgate_bin(SIM), &args, &env);
            Gateway::listening(proc)
        })
        .collect();
    let mut dirs = Vec::new();
    for (gw, port) in demos.iter().zip(ports) {
        assert_eq!(gw.addr.port(), port);
        gw.wait_ready();
        assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
        let banner = gw.proc.wait_for("  logs: ");
        let dir = banner
            .split("logs: ")
            .nth(1)
            .unwrap()
            .split(" (")
            .next()
            .unwrap()
            .trim()
            .to_owned();
        assert!(banner.contains("removed on exit"), "{banner}");
        assert!(std::path::Path::new(&dir).is_dir(), "{dir}");
        dirs.push(dir);
    }
    assert_ne!(dirs[0], dirs[1]);
    for gw in &demos {
        gw.proc.terminate();
    }
    for (gw, dir) in demos.iter_mut().zip(&dirs) {
        assert!(gw.proc.wait_exit(Duration::from_secs(60)).success());
        assert!(!std::path::Path::new(dir).exists(), "{dir} removed on exit");
    }
    // What the demo runs, before running it.
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["config", "--demo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}=")))
            .unwrap_or("")
            .to_owned()
    };
    assert!(
        line("RUNTIME").contains("process") && line("RUNTIME").contains("demo default"),
        "{text}"
    );
    assert!(line("HEAD_IP").contains("127.0.0.1"), "{text}");
    assert!(
        !line("VLLM_PORT").contains("18888"),
        "picked free: {}",
        line("VLLM_PORT")
    );
}

#[test]
fn the_plan_of_a_four_node_group_gives_each_worker_its_rank_pins_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["plan", "--profile", "glm-5.3-flash"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs([
            ("HOME", "/home/op"),
            ("USER", "op"),
            ("HEAD_IP", "127.0.0.1"),
            ("WORKERS", "127.0.0.2,ops@127.0.0.3:2222,127.0.0.4"),
            ("WORKER_CX7_IF", "enp1s0f0np0"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    // Workers first, rank 0 last; one rank per node, each with its own place in the group.
    let order: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("# rank") && l.contains(" on "))
        .collect();
    assert_eq!(
        order,
        [
            "# rank 3 on worker 3 (ssh op@127.0.0.4 port 22)",
            "# rank 2 on worker 2 (ssh ops@127.0.0.3 port 2222)",
            "# rank 1 on worker 1 (ssh op@127.0.0.2 port 22)",
            "# rank 0 on head (local Docker)",
        ]
    );
    for rank in 1..=3 {
        assert!(text.contains(&format!("--nnodes 4 --node-rank {rank}")), "{text}");
        assert!(text.contains(&format!("VLLM_HOST_IP=127.0.0.{}", rank + 1)), "{text}");
    }
    assert!(text.contains("--tensor-parallel-size 4"), "TP follows NNODES: {text}");
    assert!(
        text.contains("/home/ops/.cache/vllm-glm53-flash:/root/.cache/vllm"),
        "worker 2's home: {text}"
    );
    assert_eq!(
        text.matches("--headless").count(),
        3 * 2,
        "each worker's docker run and vLLM command: {text}"
    );
    // The deployment directory (rank 0's template) and so the hash differ from run to run.
    let deploy = dir.path().display().to_string();
    let hash = text
        .split("config hash ")
        .nth(1)
        .and_then(|t| t.lines().next())
        .unwrap_or_default();
    assert_snapshot(
        "operator/plan-four-nodes",
        &text,
        &[(deploy.as_str(), "deploy-dir"), (hash, "hash")],
    );
}
