//! The simulator image: built from nothing on a registry-less Docker daemon by
//! `tests/sim-image/build.sh`, and a two-container group started with plain `docker run`
//! (host networking, the plan's argv) becomes healthy and answers the smoke request.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use sparkgate_tests::harness::{addr_in, post_json, request};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI is installed");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes the containers whatever happens to the test.
struct Containers(Vec<String>);

impl Drop for Containers {
    fn drop(&mut self) {
        for c in &self.0 {
            let _ = Command::new("docker").args(["rm", "-f", c]).output();
        }
    }
}

/// Polls `docker logs` for a line containing `needle`.
fn wait_log(container: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new("docker")
            .args(["logs", container])
            .output()
            .expect("docker logs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return l.to_owned();
        }
        assert!(Instant::now() < deadline, "{container}: no {needle:?} in log:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn image_builds_and_a_two_container_group_becomes_healthy() {
    let tag = format!("sparkgate/vllm-sim:test-{}", std::process::id());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sim-image/build.sh");
    let out = Command::new("bash")
        .args([script, SIM, &tag])
        .output()
        .expect("run build.sh");
    assert!(
        out.status.success(),
        "build.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inspect = docker(&["image", "inspect", "--format", "{{json .Config.Entrypoint}}", &tag]);
    assert_eq!(inspect.trim(), r#"["vllm"]"#);

    let suffix = std::process::id();
    let (head, worker) = (format!("sim-head-{suffix}"), format!("sim-worker-{suffix}"));
    let guard = Containers(vec![head.clone(), worker.clone()]);
    let common = [
        "--served-model-name",
        "M",
        "--reasoning-parser",
        "deepseek_v41",
        "--tensor-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--distributed-executor-backend",
        "mp",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ];
    let env = ["-e", "SIM_LOAD_SECONDS=0", "-e", "SIM_SPEED=instant"];
    let mut run0 = vec!["run", "-d", "--name", &head, "--network", "host", "--restart", "no"];
    run0.extend(env);
    run0.extend([
        tag.as_str(),
        "serve",
        "/model",
        "--node-rank",
        "0",
        "--master-port",
        "0",
    ]);
    run0.extend(common);
    docker(&run0);
    let master = addr_in(&wait_log(&head, "rendezvous listening on"));
    let port = master.port().to_string();
    let mut run1 = vec!["run", "-d", "--name", &worker, "--network", "host", "--restart", "no"];
    run1.extend(env);
    run1.extend([
        tag.as_str(),
        "serve",
        "/model",
        "--node-rank",
        "1",
        "--headless",
        "--master-port",
        &port,
    ]);
    run1.extend(common);
    docker(&run1);
    let http = addr_in(&wait_log(&head, "Starting vLLM server on http://"));
    wait_log(&head, "Application startup complete.");
    assert_eq!(request(http, "GET", "/health", &[], b"").status, 200);
    let b = post_json(http, "/v1/chat/completions", &json!({"model": "M", "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "chat_template_kwargs": {"enable_thinking": false}})).json();
    assert_eq!(b["choices"][0]["message"]["content"], "323");
    assert_eq!(
        docker(&["inspect", "--format", "{{.State.Running}}", &worker]).trim(),
        "true"
    );
    drop(guard);
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
}
