//! `sparkgate doctor` on the two-node rig (this machine as the head, an sshd on 127.0.0.2 as the
//! worker; issue #35): each node's /proc and /sys read under its own NODE_ROOT (a CX7 port, a
//! RoCE GID entry, a kernel, MemAvailable laid out as a Spark has them), its weights, the peer
//! over real ping, the clocks over SSH. A sound pair passes; each injected mismatch — MTU, clock
//! skew, a missing weight file, a port taken, an unreachable worker daemon, another image on the
//! worker — fails its row, names the fix, and exits 1.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use sparkgate_tests::harness::free_port;
use sparkgate_tests::hosts::{sim_image, stand_in, Sshd, WorkerDaemon};
use sparkgate_tests::test_gateway::sparkgate_bin;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// A node's /proc and /sys as the doctor reads them.
fn lay_out(root: &Path, ifname: &str, hca: &str) {
    let put = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put("proc/sys/kernel/osrelease", "6.11.0-1016-nvidia\n");
    put(
        "proc/meminfo",
        "MemTotal:       127535488 kB\nMemAvailable:   120000000 kB\n",
    );
    put(&format!("sys/class/net/{ifname}/operstate"), "up\n");
    put(&format!("sys/class/net/{ifname}/mtu"), "9000\n");
    put(&format!("sys/class/net/{ifname}/speed"), "200000\n");
    put(
        &format!("sys/class/infiniband/{hca}/ports/1/gids/3"),
        "0000:0000:0000:0000:0000:ffff:c0a8:6401\n",
    );
}

/// The NVIDIA driver's version file as the open kernel module writes it.
fn driver(root: &Path, version: &str) {
    let p = root.join("proc/driver/nvidia/version");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let line = format!("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {version}  Release Build\n");
    std::fs::write(p, line).unwrap();
}

fn weights(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    std::fs::write(dir.join("model-00001-of-00002.safetensors"), vec![7u8; 4096]).unwrap();
    std::fs::write(dir.join("model-00002-of-00002.safetensors"), vec![7u8; 2048]).unwrap();
}

struct Rig {
    sshd: Sshd,
    _control: tempfile::TempDir,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Rig {
    fn new() -> Rig {
        let sshd = Sshd::start();
        let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        lay_out(&d.join("roots/head"), "enp1s0f1np1", "rocep1s0f1");
        lay_out(&d.join("roots/worker"), "enp1s0f0np0", "rocep1s0f0");
        weights(&d.join("head-model"));
        weights(&d.join("worker-model"));
        let mut env = sshd.worker_env(control.path());
        for (k, v) in [
            ("RUNTIME", "process".to_owned()),
            ("NODE_ROOT", d.join("roots/{node}").display().to_string()),
            ("MODEL_HOST", d.join("head-model").display().to_string()),
            ("WORKER_MODEL_DIR", d.join("worker-model").display().to_string()),
            ("LOG_DIR", d.join("logs").display().to_string()),
            ("PORT", free_port().to_string()),
            ("VLLM_PORT", free_port().to_string()),
            ("MASTER_PORT", free_port().to_string()),
        ] {
            env.push((k.to_owned(), v));
        }
        Rig {
            sshd,
            _control: control,
            dir,
            env,
        }
    }

    fn root(&self, node: &str) -> std::path::PathBuf {
        self.dir.path().join("roots").join(node)
    }

    /// `sparkgate doctor --json` with `extra` settings: (exit success, rows).
    fn doctor(&self, extra: &[(&str, &str)]) -> (bool, Vec<Value>) {
        let out = Command::new(sparkgate_bin(SIM))
            .args(["doctor", "--json"])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let report: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
        (out.status.success(), report["rows"].as_array().unwrap().clone())
    }
}

fn failed(rows: &[Value]) -> Vec<(String, String)> {
    rows.iter()
        .filter(|r| r["verdict"] == "fail")
        .map(|r| {
            (
                r["check"].as_str().unwrap().to_owned(),
                r["node"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The failed row of `check` on `node`, its fix holding `words`.
fn fails(rows: &[Value], ok: bool, check: &str, node: &str, words: &str) {
    assert!(!ok, "a failed check exits 1: {rows:#?}");
    assert_eq!(failed(rows), [(check.to_owned(), node.to_owned())], "{rows:#?}");
    let row = rows.iter().find(|r| r["verdict"] == "fail").unwrap();
    assert!(row["fix"].as_str().unwrap().contains(words), "{row}");
}

#[test]
fn a_sound_pair_passes_and_each_mismatch_fails_its_row_with_the_fix() {
    let rig = Rig::new();
    let (ok, rows) = rig.doctor(&[]);
    assert!(ok && failed(&rows).is_empty(), "{rows:#?}");
    for (check, node) in [
        ("ssh", "worker"),
        ("kernel", "worker"),
        ("interface", "head"),
        ("interface", "worker"),
        ("peer", "worker"),
        ("roce_gid", "worker"),
        ("clock", "worker"),
        ("memory", "worker"),
        ("disk", "head"),
        ("weights", "worker"),
        ("ports", "head"),
    ] {
        assert!(
            rows.iter()
                .any(|r| r["check"] == check && r["node"] == node && r["verdict"] == "pass"),
            "{check} on {node} passes: {rows:#?}"
        );
    }

    let mtu = rig.root("worker").join("sys/class/net/enp1s0f0np0/mtu");
    std::fs::write(&mtu, "1500\n").unwrap();
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "interface", "worker", "MTU");
    std::fs::write(&mtu, "9000\n").unwrap();

    // The worker's clock five seconds ahead.
    let bin = rig.root("worker").join("bin");
    stand_in(
        &rig.root("worker"),
        "date",
        "echo \"$(( $(/bin/date +%s) + 5 )).000000000\"",
    );
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "clock", "worker", "sync the clocks");
    std::fs::remove_file(bin.join("date")).unwrap();

    let shard = rig.dir.path().join("worker-model/model-00002-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "weights", "worker", "sparkgate sync");
    std::fs::write(&shard, vec![7u8; 2048]).unwrap();

    let release = rig.root("worker").join("proc/sys/kernel/osrelease");
    std::fs::write(&release, "6.8.0-1015-nvidia\n").unwrap();
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "kernel", "worker", "same kernel");
    std::fs::write(&release, "6.11.0-1016-nvidia\n").unwrap();

    // The driver: the same on both, then another on the worker.
    for node in ["head", "worker"] {
        driver(&rig.root(node), "580.95.05");
    }
    let (ok, rows) = rig.doctor(&[]);
    assert!(
        ok && rows.iter().any(|r| r["check"] == "driver" && r["found"] == "580.95.05"),
        "{rows:#?}"
    );
    driver(&rig.root("worker"), "580.82.09");
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "driver", "worker", "same NVIDIA driver");
    for node in ["head", "worker"] {
        std::fs::remove_file(rig.root(node).join("proc/driver/nvidia/version")).unwrap();
    }

    let gid = rig
        .root("worker")
        .join("sys/class/infiniband/rocep1s0f0/ports/1/gids/3");
    std::fs::write(&gid, "0000:0000:0000:0000:0000:0000:0000:0000\n").unwrap();
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "roce_gid", "worker", "GID index");
    std::fs::write(&gid, "0000:0000:0000:0000:0000:ffff:c0a8:6402\n").unwrap();

    // The head silent to the worker: its ping finds no answer.
    stand_in(&rig.root("worker"), "ping", "exit 1");
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "peer", "worker", "firewall");
    std::fs::remove_file(bin.join("ping")).unwrap();

    let meminfo = rig.root("worker").join("proc/meminfo");
    std::fs::write(&meminfo, "MemTotal:       127535488 kB\nMemAvailable:    20000000 kB\n").unwrap();
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "memory", "worker", "stop other workloads");
    std::fs::write(&meminfo, "MemTotal:       127535488 kB\nMemAvailable:   120000000 kB\n").unwrap();

    let (ok, rows) = rig.doctor(&[("MIN_FREE_DISK_GIB", "1000000")]);
    assert!(!ok);
    let both = [
        ("disk".to_owned(), "head".to_owned()),
        ("disk".to_owned(), "worker".to_owned()),
    ];
    assert_eq!(failed(&rows), both, "{rows:#?}");

    let (ok, rows) = rig.doctor(&[("WORKER_SSH_KEY", "/nonexistent/id_ed25519")]);
    fails(&rows, ok, "ssh", "worker", "WORKER_SSH_KEY");

    let vllm_port: u16 = rig
        .env
        .iter()
        .find(|(k, _)| k == "VLLM_PORT")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let held = std::net::TcpListener::bind(("127.0.0.1", vllm_port)).unwrap();
    let (ok, rows) = rig.doctor(&[]);
    fails(&rows, ok, "ports", "head", "ss -ltnp");
    drop(held);
    drop(rig.sshd);
}

/// RUNTIME=docker with the simulator image (its `doctor-versions` line), `socket` as the
/// worker's daemon.
fn docker(rig: &Rig, socket: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = sparkgate_tests::hosts::docker_env(SIM, "doctor", rig.dir.path())
        .into_iter()
        .filter(|(k, _)| k != "MODEL_HOST")
        .collect();
    env.push(("DOCTOR_VERSIONS_CMD".into(), "vllm doctor-versions".into()));
    env.push(("WORKER_DOCKER_SOCKET".into(), socket.into()));
    env
}

fn doctor_with(rig: &Rig, env: &[(String, String)]) -> (bool, Vec<Value>) {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    rig.doctor(&pairs)
}

#[test]
fn an_unreachable_worker_daemon_another_image_and_another_nccl_fail_their_rows() {
    let rig = Rig::new();
    let image = sim_image(SIM);
    let missing = rig.dir.path().join("no-daemon.sock").display().to_string();
    let (ok, rows) = doctor_with(&rig, &docker(&rig, &missing));
    fails(&rows, ok, "docker_daemon", "worker", "start Docker");

    let daemon = WorkerDaemon::start();
    let socket = daemon.socket();
    let load = Command::new("sh")
        .arg("-c")
        .arg(format!("docker save {image} | docker -H unix://{socket} load"))
        .output()
        .unwrap();
    assert!(load.status.success(), "{load:?}");
    let (ok, rows) = doctor_with(&rig, &docker(&rig, &socket));
    assert!(
        ok && failed(&rows).is_empty(),
        "the same image on both daemons: {rows:#?}"
    );
    let line = |node: &str| {
        rows.iter()
            .find(|r| r["check"] == "image_versions" && r["node"] == node)
            .map(|r| r["found"].as_str().unwrap().to_owned())
    };
    assert!(line("worker").is_some_and(|l| l.contains("nccl=2.28.9")), "{rows:#?}");

    // The worker's image built against another NCCL: same layers, another configuration.
    let rebuilt = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf 'FROM {image}\\nENV SIM_NCCL_VERSION=2.27.3\\n' | docker -H unix://{socket} build -q -t {image} -"
        ))
        .output()
        .unwrap();
    assert!(rebuilt.status.success(), "{rebuilt:?}");
    let (ok, rows) = doctor_with(&rig, &docker(&rig, &socket));
    assert!(!ok, "{rows:#?}");
    assert_eq!(
        failed(&rows),
        [
            ("image_digest".to_owned(), "worker".to_owned()),
            ("image_versions".to_owned(), "worker".to_owned())
        ],
        "{rows:#?}"
    );
    let row = rows
        .iter()
        .find(|r| r["check"] == "image_versions" && r["node"] == "worker")
        .unwrap();
    assert!(
        row["found"].as_str().unwrap().contains("nccl=2.27.3") && row["fix"].as_str().unwrap().contains("NCCL"),
        "{row}"
    );
}

#[test]
fn serve_with_a_failing_start_check_refuses_in_the_doctors_words() {
    let rig = Rig::new();
    std::fs::write(rig.root("worker").join("sys/class/net/enp1s0f0np0/mtu"), "1500\n").unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut proc = sparkgate_tests::test_gateway::TestGateway::builder(SIM)
        .logs(logs.path())
        .envs(&rig.env)
        .spawn();
    let status = proc.wait_exit(std::time::Duration::from_secs(60));
    assert!(!status.success(), "serve refused to start");
    let log = proc.log().join("\n");
    assert!(
        log.contains("sparkgate doctor: interface on worker: up, MTU 1500") && log.contains("set the same MTU"),
        "{log}"
    );
    assert!(!log.contains("rank started"), "no rank was started: {log}");
}
