//! The simulator image: built from nothing on a registry-less Docker daemon by
//! `tests/sim-image/build.sh`, and a two-container group started with plain `docker run`
//! (host networking, the plan's argv) becomes healthy and answers the smoke request.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use sparkgate_tests::harness::addr_in;
use sparkgate_tests::http::{post_json, request};
use sparkgate_tests::load::group_rank_args;

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
    let env = ["-e", "SIM_LOAD_SECONDS=0", "-e", "SIM_SPEED=instant"];
    let run = |name: &str, rank_args: Vec<String>| {
        let mut run = vec!["run", "-d", "--name", name, "--network", "host", "--restart", "no"];
        run.extend(env);
        run.push(tag.as_str());
        run.extend(rank_args.iter().map(String::as_str));
        docker(&run);
    };
    run(&head, group_rank_args(0, 2, 0));
    let master = addr_in(&wait_log(&head, "rendezvous listening on"));
    run(&worker, group_rank_args(1, 2, master.port()));
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
