//! The supervisor with RUNTIME=docker on the machine's Docker daemon, running the simulator
//! image built from nothing (no registry): cold start, group restart on a killed container,
//! adoption by a restarted gateway without a reload, stop, give-up and preflight errors.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_tests::harness::{free_port, Gateway, Proc};
use sparkgate_tests::http::{post_json, request, sse_data, Streaming};
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// Containers of this test, removed whatever happens.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for id in containers(&self.0) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
    }
}

/// Ids of containers whose sparkgate.group label is `group`.
fn containers(group: &str) -> Vec<String> {
    sparkgate_tests::hosts::group_containers(group)
}

fn label(id: &str, key: &str) -> String {
    let out = Command::new("docker")
        .args([
            "inspect",
            "--format",
            &format!("{{{{index .Config.Labels \"{key}\"}}}}"),
            id,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Settings that make the plan run on a machine without GPUs or CAP_SYS_RESOURCE.
struct Deployment {
    model: String,
    group: String,
    env: Vec<(String, String)>,
    _logs: tempfile::TempDir,
    _cleanup: Cleanup,
}

impl Deployment {
    fn new(profile: &str, name: &str, extra: &[(&str, &str)]) -> Deployment {
        let model = format!("{name}-{}", std::process::id());
        let group = format!("{profile}.{model}");
        let logs = tempfile::tempdir().unwrap();
        // Fixed for the deployment's life: the ports are part of the plan, hence of its hash.
        let (vllm_port, master_port) = (free_port().to_string(), free_port().to_string());
        let mut env = sparkgate_tests::hosts::docker_env(SIM, &model, logs.path());
        env.extend(
            [
                ("VLLM_PORT", vllm_port.as_str()),
                ("MASTER_PORT", master_port.as_str()),
                ("HEAD_IP", "127.0.0.1"),
                ("WORKER_IP", "127.0.0.1"),
                ("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_SPEED=instant"),
                ("RESTART_BACKOFF_INITIAL", "0.2"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        Deployment {
            _cleanup: Cleanup(group.clone()),
            model,
            group,
            env,
            _logs: logs,
        }
    }

    fn env(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    fn start(&self, profile: &str) -> Gateway {
        TestGateway::builder(SIM)
            .profile(profile)
            .logs(self._logs.path())
            .envs(&self.env)
            .start_unready()
    }

    fn smoke(&self, gw: &Gateway) -> Value {
        post_json(gw.addr, "/v1/chat/completions", &json!({"model": self.model, "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 32, "chat_template_kwargs": {"enable_thinking": false}})).json()
    }
}

#[test]
fn cold_start_of_both_profiles_in_containers() {
    for profile in ["deepseek-v4.1-flash", "glm-5.3-flash"] {
        let d = Deployment::new(profile, "cold", &[]);
        let gw = d.start(profile);
        gw.wait_ready();
        assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323", "{profile}");
        let ids = containers(&d.group);
        assert_eq!(ids.len(), 2);
        for id in &ids {
            assert_eq!(label(id, "sparkgate.epoch"), "1");
            assert!(!label(id, "sparkgate.config-hash").is_empty());
            assert!(!label(id, "sparkgate.mode").is_empty());
        }
        let s = gw.status();
        assert_eq!(s["supervisor"]["runtime"], "docker");
    }
}

/// The container of `rank` among the group's running containers.
fn container_of(group: &str, rank: u32) -> String {
    containers(group)
        .into_iter()
        .find(|id| label(id, "sparkgate.rank") == rank.to_string())
        .unwrap_or_else(|| panic!("no rank {rank} container in {group}"))
}

fn docker_kill(id: &str) {
    assert!(Command::new("docker").args(["kill", id]).status().unwrap().success());
}

#[test]
fn a_killed_worker_container_restarts_the_group_in_a_new_epoch() {
    // Paced like the real model so requests are still running when the container dies.
    let d = Deployment::new(
        "deepseek-v4.1-flash",
        "kill",
        &[("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_SPEED=1")],
    );
    let gw = d.start("deepseek-v4.1-flash");
    gw.wait_ready();
    let old = containers(&d.group);
    // One stream in flight, one more request filling MAX_NUM_SEQS=2, one queued.
    let long = json!({"model": d.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000, "ignore_eos": true, "stream": true});
    let mut stream = Streaming::post_json(gw.addr, "/v1/chat/completions", &long);
    let mut got = stream.next_chunk().unwrap();
    let (addr, model) = (gw.addr, d.model.clone());
    let second = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "ignore_eos": true}),
        )
    });
    let model = d.model.clone();
    let queued = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 32, "chat_template_kwargs": {"enable_thinking": false}}),
        )
    });
    gw.wait_status("2 running, 1 queued", |s| {
        s["admission"]["queued"] == 1 && s["admission"]["in_flight"] == 2
    });
    let killed = Instant::now();
    docker_kill(&container_of(&d.group, 1));
    gw.wait_status("restart noticed", |s| s["supervisor"]["state"] != "ready");
    let detection = killed.elapsed();
    eprintln!(
        "docker: group restart detected {:.3}s after the worker container was killed",
        detection.as_secs_f64()
    );
    assert!(detection <= Duration::from_secs(5), "{detection:?}");
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
    let second = second.join().unwrap();
    assert_eq!(second.status, 200, "{}", second.text());
    let q = queued.join().unwrap();
    assert_eq!(q.status, 200, "{}", q.text());
    assert_eq!(q.json()["choices"][0]["message"]["content"], "323");
    gw.wait_status("ready epoch 2", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    let new = containers(&d.group);
    assert_eq!(new.len(), 2, "no container of epoch 1 is left: {new:?}");
    assert!(new
        .iter()
        .all(|id| label(id, "sparkgate.epoch") == "2" && !old.contains(id)));
    // Rank 0's container dying restarts the group likewise (the worker, losing its head, exits
    // too; whichever exit is seen first names the restart).
    let head = container_of(&d.group, 0);
    docker_kill(&head);
    let third = gw.wait_status("ready epoch 3", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 3
    });
    assert!(
        third["supervisor"]["last_restart"]["reason"]
            .as_str()
            .unwrap()
            .contains("exited"),
        "{third}"
    );
    assert!(!containers(&d.group).contains(&head));
    let last = containers(&d.group);
    assert_eq!(last.len(), 2);
    assert!(last.iter().all(|id| label(id, "sparkgate.epoch") == "3"));
    assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323");
}

#[test]
fn a_restarted_gateway_adopts_the_running_group_and_stop_removes_it() {
    let d = Deployment::new("glm-5.3-flash", "adopt", &[]);
    let mut gw = d.start("glm-5.3-flash");
    gw.wait_ready();
    let before = containers(&d.group);
    gw.proc.terminate();
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
    assert_eq!(containers(&d.group), before, "the containers outlive the gateway");
    let gw = d.start("glm-5.3-flash");
    gw.proc.wait_for("adopted the running rank group (no reload)");
    gw.wait_ready();
    assert_eq!(
        containers(&d.group),
        before,
        "adopted: same container ids, nothing reloaded"
    );
    assert_eq!(gw.status()["supervisor"]["epoch"], 1);
    assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323");
    let port = gw.addr.port().to_string();
    let out = Command::new(sparkgate_bin(SIM))
        .arg("stop")
        .env("PORT", &port)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    gw.wait_status("stopped", |s| s["supervisor"]["state"] == "stopped");
    assert!(
        containers(&d.group).is_empty(),
        "sparkgate stop leaves no container of the group"
    );
}

#[test]
fn a_different_configuration_is_not_adopted() {
    let d = Deployment::new("deepseek-v4.1-flash", "rehash", &[]);
    let mut gw = d.start("deepseek-v4.1-flash");
    gw.wait_ready();
    let before = containers(&d.group);
    gw.proc.terminate();
    gw.proc.wait_exit(Duration::from_secs(30));
    let mut env = d.env();
    env.push(("MAX_MODEL_LEN", "500000"));
    let gw = TestGateway::builder(SIM)
        .logs(d._logs.path())
        .envs(&env)
        .start_unready();
    gw.proc.wait_for("not adopting");
    gw.wait_ready();
    let after = containers(&d.group);
    assert!(
        after.iter().all(|id| !before.contains(id)),
        "the old group was replaced"
    );
}

#[test]
fn a_crash_loop_ends_failed_with_no_containers_left() {
    let d = Deployment::new(
        "deepseek-v4.1-flash",
        "crash",
        &[
            ("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_FAULT_CRASH_AFTER_S=0.3"),
            ("RESTART_BUDGET", "2"),
            ("RESTART_BACKOFF_INITIAL", "0.1"),
        ],
    );
    let gw = d.start("deepseek-v4.1-flash");
    let s = gw.wait_status("failed", |s| s["supervisor"]["state"] == "failed");
    assert!(s["supervisor"]["reason"].as_str().unwrap().contains("gave up"), "{s}");
    assert!(containers(&d.group).is_empty(), "no rank of an old epoch outlives it");
    assert_eq!(request(gw.addr, "GET", "/ready", &[], b"").status, 503);
}

#[test]
fn a_stalled_container_start_writes_diagnostics() {
    let d = Deployment::new(
        "deepseek-v4.1-flash",
        "stall",
        &[
            ("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_FAULT_HANG_AT_START=1"),
            ("HANG_SECONDS", "1"),
            ("RESTART_BUDGET", "1"),
        ],
    );
    let gw = d.start("deepseek-v4.1-flash");
    let s = gw.wait_status("stall reported", |s| {
        s["supervisor"]["last_restart"]["reason"].is_string()
    });
    let reason = s["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("start stalled"), "{reason}");
    let dir = d._logs.path().join("epoch-1/diagnostics");
    assert_eq!(
        s["supervisor"]["last_restart"]["diagnostics"],
        dir.display().to_string(),
        "status names the bundle: {s}"
    );
    assert!(std::fs::read_to_string(dir.join("summary.txt"))
        .unwrap()
        .contains("container"));
    assert!(std::fs::read_to_string(dir.join("rank0-tail.log"))
        .unwrap()
        .contains("Loading safetensors"));
}

#[test]
fn preflight_refuses_a_missing_image_naming_it() {
    let d = Deployment::new(
        "deepseek-v4.1-flash",
        "noimage",
        // SKIP_PULL: nothing may reach a registry from a test.
        &[("IMAGE", "sparkgate/does-not-exist:1"), ("SKIP_PULL", "1")],
    );
    let mut p = Proc::spawn(
        &sparkgate_bin(SIM),
        &["serve".to_owned()],
        &[d.env(), vec![("PORT", "0"), ("BIND_ADDR", "127.0.0.1")]].concat(),
    );
    let status = p.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    let log = p.log().join("\n");
    assert!(
        log.contains("preflight: head: image sparkgate/does-not-exist:1 is not available: the head's daemon does not have it, it cannot be pulled (SKIP_PULL=1)"),
        "{log}"
    );
}

fn ssh_env(sshd: &sparkgate_tests::hosts::Sshd, control: &std::path::Path) -> Vec<(String, String)> {
    sshd.worker_env(control)
}

#[test]
fn the_worker_rank_runs_through_its_daemon_forwarded_over_ssh() {
    let mut sshd = sparkgate_tests::hosts::Sshd::start();
    let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
    let mut d = Deployment::new("deepseek-v4.1-flash", "ssh", &[("RESTART_BUDGET", "50")]);
    d.env.extend(ssh_env(&sshd, control.path()));
    let gw = d.start("deepseek-v4.1-flash");
    gw.wait_ready();
    assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323");
    assert!(
        sshd.log().contains("Accepted publickey"),
        "the worker was reached through sshd:\n{}",
        sshd.log()
    );
    let worker = gw.status()["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rank"] == 1)
        .unwrap()
        .clone();
    assert!(worker["container"].is_string());
    // Cutting SSH while running: the worker's log and exit streams break, the group restarts,
    // and the restart waits (backing off) until the worker is reachable again.
    sshd.cut();
    gw.wait_status("the cut noticed", |s| s["supervisor"]["state"] != "ready");
    sshd.run();
    gw.wait_status("ready again after SSH returned", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"].as_u64().unwrap() >= 2
    });
    assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323");
    assert_eq!(
        containers(&d.group).len(),
        2,
        "one epoch: the old worker container was replaced"
    );
}

#[test]
fn an_unreachable_worker_fails_preflight_naming_it() {
    let sshd = sparkgate_tests::hosts::Sshd::start();
    let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
    let mut d = Deployment::new("deepseek-v4.1-flash", "nossh", &[]);
    d.env.extend(ssh_env(&sshd, control.path()));
    drop(sshd);
    let env = d.env();
    let mut p = Proc::spawn(
        &sparkgate_bin(SIM),
        &["serve".to_owned()],
        &[env, vec![("PORT", "0"), ("BIND_ADDR", "127.0.0.1")]].concat(),
    );
    assert!(!p.wait_exit(Duration::from_secs(60)).success());
    let log = p.log().join("\n");
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    assert!(
        log.contains(&format!("worker ({user}@127.0.0.2): cannot reach it over SSH")),
        "{log}"
    );
}

#[test]
fn status_reports_node_memory_and_stop_on_exit_stops_containers() {
    let d = Deployment::new("deepseek-v4.1-flash", "memory", &[("STOP_RANKS_ON_EXIT", "1")]);
    let mut gw = d.start("deepseek-v4.1-flash");
    gw.wait_ready();
    let s = gw.wait_status("memory sampled", |s| {
        s["supervisor"]["memory"].as_array().is_some_and(|m| !m.is_empty())
    });
    let head = &s["supervisor"]["memory"][0];
    assert_eq!(head["node"], "head");
    assert!(head["mem_available_gib"].as_f64().unwrap() > 0.0, "{s}");
    assert_eq!(containers(&d.group).len(), 2);
    gw.proc.terminate();
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
    assert!(
        containers(&d.group).is_empty(),
        "STOP_RANKS_ON_EXIT=1 stops the ranks with the gateway"
    );
}

#[test]
fn auto_speculation_switches_the_container_group_and_back() {
    // Simulator containers paced at 4× the guides' speed; policy settings scaled to seconds.
    let mut env = vec![("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_SPEED=4")];
    env.extend(sparkgate_tests::load::FAST_AUTO_POLICY);
    let d = Deployment::new("deepseek-v4.1-flash", "spec", &env);
    let gw = d.start("deepseek-v4.1-flash");
    gw.wait_ready();
    sparkgate_tests::load::assert_auto_round_trip(
        &gw,
        &json!({"model": d.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 80, "ignore_eos": true}),
    );
    let modes: Vec<String> = containers(&d.group)
        .iter()
        .map(|id| label(id, "sparkgate.mode"))
        .collect();
    assert_eq!(modes, ["dspark", "dspark"], "epoch 3 runs dspark again");
}

#[test]
fn a_failing_self_check_stops_the_start_with_the_log_tail() {
    let d = Deployment::new(
        "deepseek-v4.1-flash",
        "selfcheck",
        &[
            ("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_SELFCHECK_FAIL=1"),
            ("RESTART_BUDGET", "1"),
        ],
    );
    let gw = d.start("deepseek-v4.1-flash");
    let s = gw.wait_status("the start failed", |s| {
        s["supervisor"]["last_restart"]["reason"].is_string()
    });
    let reason = s["supervisor"]["last_restart"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("self-check `vllm selfcheck` failed (exit status: 1")
            && reason.contains("AssertionError: EXL3 GEMM result differs"),
        "{reason}"
    );
    let log = std::fs::read_to_string(d._logs.path().join("overlay-verify.log")).expect("overlay-verify.log");
    assert!(log.contains("EXL3 overlay installed"), "{log}");
    assert!(containers(&d.group).is_empty(), "no rank container was started");
    assert_ne!(s["supervisor"]["state"], "ready");
}
