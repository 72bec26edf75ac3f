//! Node preparation on the two-node test topology: the head is the machine's Docker daemon, the
//! worker is a second Docker daemon reached through a real sshd on 127.0.0.2. The simulator
//! image is shipped by stream and by a staged transfer that is cut and resumed; `serve` prepares
//! both nodes (weights downloaded with a stand-in `hf`, synced by rsync, image shipped) and a
//! second start ships nothing; the Engram pack runs one container per node and is mounted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use sparkgate_tests::harness::{free_port, Gateway, Proc};
use sparkgate_tests::hosts::{sim_image, Sshd, WorkerDaemon};
use sparkgate_tests::http::post_json;
use sparkgate_tests::test_gateway::sparkgate_bin;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// A head (this machine's daemon) and a worker (its own daemon behind sshd), with the
/// directories a DeepSeek deployment names.
struct Topology {
    sshd: Sshd,
    worker: WorkerDaemon,
    _control: tempfile::TempDir,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Topology {
    fn new(name: &str) -> Topology {
        Topology::with_worker(name, WorkerDaemon::start())
    }

    fn with_worker(name: &str, worker: WorkerDaemon) -> Topology {
        let sshd = Sshd::start();
        let control = tempfile::Builder::new().prefix("sgc").tempdir_in("/tmp").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = |rel: &str| dir.path().join(rel).display().to_string();
        let fake_hf = dir.path().join("bin");
        std::fs::create_dir_all(&fake_hf).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-hf"),
            fake_hf.join("hf"),
        )
        .unwrap();
        for d in ["engram", "worker-engram"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let model = format!("{name}-{}", std::process::id());
        let mut env: Vec<(String, String)> = [
            ("IMAGE", sim_image(SIM).to_owned()),
            ("WORKER_DOCKER_SOCKET", worker.socket()),
            ("DEPLOY_DIR", p("")),
            ("LOG_DIR", p("logs")),
            ("CACHE_ROOT", p("cache")),
            ("WORKER_VLLM_CACHE", p("worker-cache")),
            ("IMAGE_SHIP_DIR", p("head-ship")),
            ("WORKER_IMAGE_SHIP_DIR", p("worker-ship")),
            ("MODEL_HOST", p("model")),
            ("ENGRAM_DIR", p("engram")),
            ("ENGRAM_SRC", p("engram")),
            ("WORKER_MODEL_DIR", p("worker-model")),
            ("WORKER_ENGRAM_DIR", p("worker-engram")),
            ("HEAD_PACKED_DIR", p("head-packed")),
            ("WORKER_PACKED_DIR", p("worker-packed")),
            ("PACK_CMD", "vllm pack-engram".to_owned()),
            ("WEIGHT_SYNC", "rsync".to_owned()),
            ("SELF_CHECK_CMD", "vllm selfcheck".to_owned()),
            ("RANK_GPUS", "none".to_owned()),
            ("RANK_MEMLOCK_UNLIMITED", "0".to_owned()),
            ("RANK_DEVICES", String::new()),
            ("CHAT_TEMPLATE_HOST", String::new()),
            ("SERVED_MODEL_NAME", model.clone()),
            ("CONTAINER_HEAD", format!("{model}-head")),
            ("CONTAINER_WORKER", format!("{model}-worker")),
            ("RUNTIME", "docker".to_owned()),
            ("HF_LOG", p("hf.log")),
            (
                "PATH",
                format!("{}:{}", fake_hf.display(), std::env::var("PATH").unwrap_or_default()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        env.extend(sshd.worker_env(control.path()));
        Topology {
            sshd,
            worker,
            _control: control,
            dir,
            env,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn env_with<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        env.extend_from_slice(extra);
        env
    }

    /// `sparkgate --profile deepseek-v4.1-flash ARGS` to completion: (success, output).
    fn run(&self, args: &[&str], extra: &[(&str, &str)]) -> (bool, String) {
        let out = Command::new(sparkgate_bin(SIM))
            .args(["--profile", "deepseek-v4.1-flash"])
            .args(args)
            .envs(self.env_with(extra))
            .output()
            .expect("run sparkgate");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn spawn(&self, args: &[&str], extra: &[(&str, &str)]) -> Proc {
        let mut argv = vec!["--profile".to_owned(), "deepseek-v4.1-flash".to_owned()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        Proc::spawn(&sparkgate_bin(SIM), &argv, &self.env_with(extra))
    }

    fn head_layers(&self) -> String {
        let out = Command::new("docker")
            .args([
                "image",
                "inspect",
                "--format",
                "{{json .RootFS.Layers}}",
                sim_image(SIM),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The image runs on the worker's daemon (its self-check entry point exits 0).
    fn runs_on_worker(&self) -> bool {
        let (ok, out) = self
            .worker
            .docker(&["run", "--rm", "--network", "host", sim_image(SIM), "selfcheck"]);
        ok && out.contains("matches the reference")
    }

    /// Size of the staged tar on the worker so far (0 before it appears).
    fn worker_tar_bytes(&self) -> u64 {
        std::fs::read_dir(self.path("worker-ship"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tar"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}

/// The image's RootFS layer digests on the head (the machine's daemon).
fn head_layers(image: &str) -> String {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{json .RootFS.Layers}}", image])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `sparkgate ship` with the head as the only node (GLM profile, worker = head): (success, output).
fn ship_on_the_head(env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(sparkgate_bin(SIM))
        .args(["--profile", "glm-5.3-flash", "ship"])
        .envs([("HEAD_IP", "127.0.0.1"), ("WORKER_IP", "127.0.0.1")])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `Staged { sent: S, resumed_from: R, size: T }` → (S, R, T).
fn staged_numbers(out: &str) -> (u64, u64, u64) {
    let field = |name: &str| -> u64 {
        let at = out
            .find(&format!("{name}: "))
            .unwrap_or_else(|| panic!("{name} in {out}"))
            + name.len()
            + 2;
        out[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    (field("sent"), field("resumed_from"), field("size"))
}

#[test]
fn the_image_ships_by_stream_is_not_reshipped_and_a_cut_staged_transfer_resumes() {
    let mut t = Topology::new("ship");
    assert!(
        t.worker.layers(sim_image(SIM)).is_empty(),
        "a fresh worker daemon has no images"
    );

    let (ok, out) = t.run(&["ship", "--mode", "stream"], &[]);
    assert!(ok, "{out}");
    assert!(out.contains("Streamed"), "{out}");
    assert_eq!(
        t.worker.layers(sim_image(SIM)),
        t.head_layers(),
        "same RootFS layers on both nodes"
    );
    assert!(t.runs_on_worker());

    let (ok, out) = t.run(&["ship"], &[]);
    assert!(
        ok && out.contains("AlreadyThere") && out.contains("not shipping"),
        "{out}"
    );

    // Staged, rate-limited, cut by killing every SSH connection once part of the tar arrived.
    assert!(t.worker.docker(&["rmi", "-f", sim_image(SIM)]).0);
    let mut cut = t.spawn(&["ship", "--mode", "staged"], &[("IMAGE_SHIP_BWLIMIT", "4000")]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while t.worker_tar_bytes() < 3 << 20 {
        assert!(
            Instant::now() < deadline,
            "no transfer progress:\n{}",
            cut.log().join("\n")
        );
        assert!(
            cut.try_status().is_none(),
            "finished before the cut:\n{}",
            cut.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t.sshd.cut();
    assert!(!cut.wait_exit(Duration::from_secs(60)).success());
    let log = cut.log().join("\n");
    assert!(log.contains("run it again to resume"), "{log}");
    let partial = t.worker_tar_bytes();
    assert!(
        t.worker.layers(sim_image(SIM)).is_empty(),
        "nothing loaded from a cut transfer"
    );

    t.sshd.run();
    let (ok, out) = t.run(&["ship", "--mode", "staged"], &[]);
    assert!(ok, "{out}");
    assert!(out.contains("resuming the transfer at"), "{out}");
    let (sent, resumed_from, size) = staged_numbers(&out);
    assert!(resumed_from >= partial && resumed_from > 0, "{out}");
    assert!(
        sent < size - resumed_from / 2,
        "only the rest crossed the network: sent {sent} of {size}, {resumed_from} were there:\n{out}"
    );
    assert_eq!(t.worker.layers(sim_image(SIM)), t.head_layers());
    assert!(t.runs_on_worker());
    assert_eq!(t.worker_tar_bytes(), 0, "the staged tar is removed after loading");
}

/// A small tmpfs mounted for the test's life (a worker disk without room for a staged tar).
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(path: PathBuf) -> SmallDisk {
        sparkgate_tests::hosts::mount_tmpfs(&path, 16);
        SmallDisk(path)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn auto_streams_when_the_worker_lacks_room_for_a_staged_copy() {
    let t = Topology::new("room");
    let _disk = SmallDisk::mount(t.path("worker-ship"));
    let (ok, out) = t.run(&["ship", "--mode", "staged"], &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("staged shipping (tar ×2 + 5 GiB) needs") && out.contains("IMAGE_SHIP=stream"),
        "staged refuses before copying, saying what to do: {out}"
    );
    assert!(t.worker.layers(sim_image(SIM)).is_empty());
    let (ok, out) = t.run(&["ship", "--mode", "auto"], &[]);
    assert!(ok, "{out}");
    assert!(out.contains("streaming instead") && out.contains("Streamed"), "{out}");
    assert_eq!(t.worker.layers(sim_image(SIM)), t.head_layers());
}

#[test]
fn a_worker_daemon_without_room_for_the_layers_is_refused_before_sending() {
    let t = Topology::with_worker("full", WorkerDaemon::start_with_small_disk(8));
    let (ok, out) = t.run(&["ship", "--mode", "stream"], &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("worker has") && out.contains("but loading the image needs") && out.contains("docker image prune"),
        "{out}"
    );
    assert!(!out.contains("streaming head"), "nothing was sent: {out}");
}

fn serve(t: &Topology, extra: &[(&str, &str)]) -> Gateway {
    let proc = t.spawn(&["serve"], extra);
    Gateway::listening(proc)
}

#[test]
fn serve_prepares_both_nodes_ships_once_and_mounts_the_engram_pack() {
    let t = Topology::new("prep");
    let (vllm_port, master_port) = (free_port().to_string(), free_port().to_string());
    let extra = [
        ("PORT", "0"),
        ("BIND_ADDR", "127.0.0.1"),
        ("VLLM_PORT", vllm_port.as_str()),
        ("MASTER_PORT", master_port.as_str()),
        ("RANK_ENV", "SIM_LOAD_SECONDS=0,SIM_SPEED=instant"),
        ("STOP_RANKS_ON_EXIT", "1"),
        ("RESTART_BUDGET", "1"),
        // The simulator needs no memory for weights.
        ("BOOT_MARGIN_GIB", ""),
    ];
    let model = t.env.iter().find(|(k, _)| k == "SERVED_MODEL_NAME").unwrap().1.clone();
    let smoke = |gw: &Gateway| {
        post_json(
            gw.addr,
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 32, "chat_template_kwargs": {"enable_thinking": false}}),
        )
        .json()["choices"][0]["message"]["content"]
            .clone()
    };

    // First start: the weights are missing (downloaded with the stand-in hf), the worker lacks the
    // image (shipped) and the weights (rsync).
    let mut gw = serve(&t, &extra);
    gw.wait_ready();
    assert_eq!(smoke(&gw), "323");
    let log = gw.proc.log().join("\n");
    assert!(log.contains("weights incomplete, downloading"), "{log}");
    let hf = std::fs::read_to_string(t.path("hf.log")).unwrap_or_default();
    assert!(hf.contains("download"), "the stand-in hf ran: {hf}");
    assert!(log.contains("shipped to the worker"), "{log}");
    assert_eq!(t.worker.layers(sim_image(SIM)), t.head_layers());
    assert!(log.contains("weights model: Copied"), "{log}");
    assert!(
        t.path("worker-model/config.json").is_file(),
        "the weights reached the worker"
    );
    assert!(log.contains("self-check passed"), "{log}");
    assert!(
        log.contains("page cache"),
        "the page-cache drop reported on each node: {log}"
    );
    gw.proc.terminate();
    assert!(gw.proc.wait_exit(Duration::from_secs(60)).success());

    // Pack, on each node, with that node's rank; a second pack skips both. A pack cut after its
    // first layer (only l1 there) is not taken for a finished one.
    std::fs::create_dir_all(t.path("head-packed")).unwrap();
    std::fs::write(t.path("head-packed/engram-l1-r0of2.bin"), "cut short").unwrap();
    let (ok, out) = t.run(&["pack"], &[]);
    assert!(ok, "{out}");
    assert!(
        out.contains("pack rank 0 (head): running") && !out.contains("skipped"),
        "{out}"
    );
    let head_file = std::fs::read_to_string(t.path("head-packed/engram-l1-r0of2.bin")).unwrap();
    let worker_file = std::fs::read_to_string(t.path("worker-packed/engram-l1-r1of2.bin")).unwrap();
    assert_eq!(
        (head_file.trim(), worker_file.trim()),
        ("layer 1 rank 0 of 2", "layer 1 rank 1 of 2")
    );
    assert!(
        out.contains("[head] pack-engram") && out.contains("[worker] pack-engram"),
        "{out}"
    );
    let (ok, again) = t.run(&["pack"], &[]);
    assert!(
        ok && again.matches("skipped").count() == 2 && !again.contains("running"),
        "{again}"
    );

    // `verify` sees both nodes prepared.
    let (ok, verified) = t.run(&["verify"], &[]);
    assert!(ok && !verified.contains("FAIL"), "{verified}");
    assert!(
        verified.contains("has the head's layers") && verified.contains("self-check"),
        "{verified}"
    );

    // Second start: nothing shipped or copied again; the ranks mount the packed files.
    let gw = serve(&t, &extra);
    gw.wait_ready();
    assert_eq!(smoke(&gw), "323");
    let log = gw.proc.log().join("\n");
    assert!(
        log.contains("not shipping") && !log.contains("shipped to the worker"),
        "{log}"
    );
    assert!(log.contains("weights model: Unchanged"), "{log}");
    let head = format!("{model}-head");
    let out = Command::new("docker")
        .args(["inspect", "--format", "{{json .Mounts}} {{json .Config.Env}}", &head])
        .output()
        .unwrap();
    let inspect = String::from_utf8_lossy(&out.stdout);
    assert!(
        inspect.contains("/engram-packed") && inspect.contains("DSV41_PACKED_DIR=/engram-packed"),
        "{inspect}"
    );
    let (_, worker_inspect) = t
        .worker
        .docker(&["inspect", "--format", "{{json .Mounts}}", &format!("{model}-worker")]);
    assert!(worker_inspect.contains("worker-packed"), "{worker_inspect}");
}

#[test]
fn build_stamps_the_recipe_and_rebuilds_only_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY overlay /opt/overlay\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("overlay")).unwrap();
    std::fs::write(dir.path().join("overlay/patch.py"), "print(1)\n").unwrap();
    let image = format!("sparkgate/built-test:{}", std::process::id());
    let context = dir.path().display().to_string();
    let logs = dir.path().join("logs").display().to_string();
    let run = || {
        let env = [
            ("IMAGE", image.as_str()),
            ("BUILD", "1"),
            ("BUILD_CONTEXT", &context),
            ("LOG_DIR", &logs),
        ];
        let (ok, text) = ship_on_the_head(&env);
        assert!(ok, "{text}");
        text
    };
    let stamp = || {
        let out = Command::new("docker")
            .args([
                "image",
                "inspect",
                "--format",
                "{{index .Config.Labels \"sparkgate.recipe.stamp\"}}",
                &image,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let cleanup = RemoveImage(image.clone());
    let first = run();
    assert!(first.contains("building from"), "{first}");
    let built = stamp();
    assert_eq!(built.len(), 16, "stamp label: {built:?}");
    let second = run();
    assert!(
        second.contains("not rebuilding") && !second.contains("building from"),
        "{second}"
    );
    std::fs::write(dir.path().join("overlay/patch.py"), "print(2)\n").unwrap();
    let third = run();
    assert!(third.contains("building from"), "{third}");
    assert_ne!(stamp(), built, "the new recipe's stamp");
    drop(cleanup);
}

#[test]
fn pull_fetches_the_image_from_its_registry_with_the_ghcr_credentials() {
    // A registry on loopback serving the simulator image, requiring Basic credentials.
    let registry = sparkgate_tests::registry::Registry::serve(sim_image(SIM), Some(("sg-user", "sg-token")));
    let registry_host = format!("127.0.0.1:{}", registry.addr.port());
    let image = format!("{registry_host}/sparkgate/pulled:{}", std::process::id());
    let _cleanup = RemoveImage(image.clone());
    let dir = tempfile::tempdir().unwrap();
    let (deploy, logs) = (
        dir.path().display().to_string(),
        dir.path().join("logs").display().to_string(),
    );
    let ship = |token: &str| {
        ship_on_the_head(&[
            ("IMAGE", image.as_str()),
            ("PULL", "1"),
            ("GHCR_USER", "sg-user"),
            ("GHCR_TOKEN", token),
            ("GHCR_REGISTRY", &registry_host),
            ("DEPLOY_DIR", &deploy),
            ("LOG_DIR", &logs),
        ])
    };
    let (ok, out) = ship("wrong-token");
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("pull {image}")) && out.contains("unauthorized") && out.contains("GHCR_TOKEN"),
        "the pull failure names the image and the registry's refusal: {out}"
    );

    let (ok, out) = ship("sg-token");
    assert!(ok, "{out}");
    assert!(out.contains("pulling on the head"), "{out}");
    assert_eq!(
        head_layers(&image),
        head_layers(sim_image(SIM)),
        "the pulled image has the served layers"
    );
}

/// Removes the built test image whatever happens.
struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}
