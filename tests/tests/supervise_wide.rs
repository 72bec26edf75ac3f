//! Groups over more than two nodes (WORKERS): 3- and 4-rank groups of vllm-sim ranks start
//! workers first, serve the smoke request only once every rank joined, restart as a unit when
//! any rank dies, and leave nothing behind on stop — as local processes, as processes on
//! workers over SSH (one real sshd per worker address), and as containers, local and on
//! workers whose Docker socket is forwarded over SSH.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::harness::{free_port, Gateway};
use sparkgate_tests::hosts::{group_containers, kill_pid, workers_env};
use sparkgate_tests::hosts::{processes_with, Sshd};
use sparkgate_tests::http::post_json;
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn rank_field(status: &Value, rank: u64, field: &str) -> Value {
    status["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rank"] == rank)
        .unwrap_or_else(|| panic!("no rank {rank}: {status}"))[field]
        .clone()
}

/// `n` ranks reported, every one running, in epoch `epoch`, ready.
fn assert_group(status: &Value, n: usize, epoch: u64) {
    let ranks = status["supervisor"]["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), n, "{status}");
    assert!(ranks.iter().all(|r| r["running"] == true), "{status}");
    assert_eq!(status["supervisor"]["epoch"], epoch, "{status}");
}

/// Every one of the `n` ranks runs as another process or container (`field`) in `second`.
fn assert_all_replaced(first: &Value, second: &Value, n: usize, field: &str) {
    for rank in 0..n as u64 {
        assert_ne!(
            rank_field(first, rank, field),
            rank_field(second, rank, field),
            "rank {rank}'s {field} was replaced with the group"
        );
    }
}

fn kill_term(pid: u32) {
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// Starts a process group with `env`, checks it serves with `n` ranks (each worker's log says
/// it joined headless), kills rank `victim`, checks the whole group restarts in epoch 2 and
/// serves again, then stops the gateway and checks no rank of either epoch is left.
fn process_group_lifecycle(n: usize, victim: u64, env: &[(&str, &str)]) {
    let logs = tempfile::tempdir().unwrap();
    let master_port = free_port().to_string();
    let mut full = vec![("MASTER_PORT", master_port.as_str())];
    full.extend_from_slice(env);
    let mut gw = TestGateway::builder(SIM)
        .profile("glm-5.3-flash")
        .logs(logs.path())
        .envs(&full)
        .start();
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    let first = gw.status();
    assert_group(&first, n, 1);
    for rank in 1..n {
        let log = std::fs::read_to_string(logs.path().join(format!("epoch-1/rank{rank}.log"))).unwrap();
        assert!(log.contains("headless"), "rank {rank}: {log}");
    }
    // `logs rank N` reaches the last worker's log too.
    let last = (n - 1).to_string();
    let url = format!("http://{}", gw.addr);
    let out = Command::new(sparkgate_bin(SIM))
        .args(["logs", "rank", &last, "--url", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("headless"), "{text}");
    // Every rank of the group carries the rendezvous port on its command line.
    assert_eq!(processes_with(&format!("--master-port {master_port}")).len(), n);
    kill_pid(rank_field(&first, victim, "pid").as_u64().unwrap());
    let second = gw.wait_status("ready in epoch 2", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    let reason = second["supervisor"]["last_restart"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.starts_with(&format!("rank {victim} exited")), "{reason}");
    assert_group(&second, n, 2);
    assert_all_replaced(&first, &second, n, "pid");
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    kill_term(gw.proc.pid());
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
    assert_eq!(
        processes_with(&format!("--master-port {master_port}")),
        Vec::<u32>::new(),
        "no rank of the group outlived the gateway"
    );
}

#[test]
fn a_three_rank_process_group_serves_restarts_as_a_unit_and_stops_clean() {
    process_group_lifecycle(3, 1, &[("WORKERS", "127.0.0.1,127.0.0.1")]);
}

#[test]
fn a_four_rank_group_with_workers_over_ssh_serves_restarts_as_a_unit_and_stops_clean() {
    let a = Sshd::start_on("127.0.0.2");
    let b = Sshd::start_on("127.0.0.3");
    let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
    // Ranks 1 and 2 over SSH on two hosts, rank 3 on the head's address.
    let env = workers_env(&[&a, &b], 1, control.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    process_group_lifecycle(4, 2, &env);
    for sshd in [&a, &b] {
        assert!(
            sshd.log().contains("Accepted publickey"),
            "{}'s rank was started through its sshd:\n{}",
            sshd.addr,
            sshd.log()
        );
    }
}

/// A docker deployment of the simulator image under a unique name, removed whatever happens.
struct Containers {
    group: String,
    model: String,
    env: Vec<(String, String)>,
    logs: tempfile::TempDir,
}

impl Containers {
    fn new(name: &str, extra: Vec<(String, String)>) -> Containers {
        let model = format!("{name}-{}", std::process::id());
        let logs = tempfile::tempdir().unwrap();
        let mut env = sparkgate_tests::hosts::docker_env(SIM, &model, logs.path());
        for (k, v) in [
            ("VLLM_PORT", free_port().to_string()),
            ("MASTER_PORT", free_port().to_string()),
            ("HEAD_IP", "127.0.0.1".into()),
            ("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_SPEED=instant".into()),
            ("RESTART_BACKOFF_INITIAL", "0.2".into()),
            ("STOP_RANKS_ON_EXIT", "1".into()),
        ] {
            env.push((k.to_owned(), v));
        }
        env.extend(extra);
        Containers {
            group: format!("glm-5.3-flash.{model}"),
            model,
            env,
            logs,
        }
    }

    fn start(&self) -> Gateway {
        TestGateway::builder(SIM)
            .profile("glm-5.3-flash")
            .logs(self.logs.path())
            .envs(&self.env)
            .start()
    }

    fn smoke(&self, gw: &Gateway) -> Value {
        let body = json!({"model": self.model, "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 32, "chat_template_kwargs": {"enable_thinking": false}});
        post_json(gw.addr, "/v1/chat/completions", &body).json()
    }

    /// Container names of the group, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = group_containers(&self.group)
            .iter()
            .map(|id| {
                let out = Command::new("docker")
                    .args(["inspect", "--format", "{{.Name}}", id])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .trim_start_matches('/')
                    .to_owned()
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for id in group_containers(&self.group) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
    }
}

/// Serves with `n` containers, restarts them all when rank `victim`'s container is killed, and
/// removes them all when the gateway stops.
fn container_group_lifecycle(d: &Containers, n: usize, victim: u64) {
    let mut gw = d.start();
    assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323");
    let first = gw.status();
    assert_group(&first, n, 1);
    let mut expected = vec![format!("{}-head", d.model), format!("{}-worker", d.model)];
    expected.extend((2..n).map(|r| format!("{}-worker-{r}", d.model)));
    expected.sort();
    assert_eq!(d.names(), expected, "one container per rank");
    let victim_id = rank_field(&first, victim, "container").as_str().unwrap().to_owned();
    assert!(Command::new("docker")
        .args(["kill", &victim_id])
        .status()
        .unwrap()
        .success());
    let second = gw.wait_status("ready in epoch 2", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    assert_group(&second, n, 2);
    assert_all_replaced(&first, &second, n, "container");
    assert_eq!(d.names(), expected, "the old epoch's containers are gone");
    assert_eq!(d.smoke(&gw)["choices"][0]["message"]["content"], "323");
    kill_term(gw.proc.pid());
    assert!(gw.proc.wait_exit(Duration::from_secs(60)).success());
    assert_eq!(
        d.names(),
        Vec::<String>::new(),
        "STOP_RANKS_ON_EXIT=1 leaves no container"
    );
}

#[test]
fn a_four_rank_container_group_serves_restarts_as_a_unit_and_stops_clean() {
    let d = Containers::new(
        "wide4",
        vec![("WORKERS".into(), "127.0.0.1,127.0.0.1,127.0.0.1".into())],
    );
    container_group_lifecycle(&d, 4, 3);
}

#[test]
fn a_three_rank_container_group_over_two_forwarded_daemons_restarts_as_a_unit() {
    let a = Sshd::start_on("127.0.0.2");
    let b = Sshd::start_on("127.0.0.3");
    let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
    let d = Containers::new("wide3", workers_env(&[&a, &b], 0, control.path()));
    container_group_lifecycle(&d, 3, 2);
    for sshd in [&a, &b] {
        assert!(
            sshd.log().contains("Accepted publickey"),
            "{}:\n{}",
            sshd.addr,
            sshd.log()
        );
    }
}
