//! Test hosts and processes: a real sshd on 127.0.0.2 standing in for the worker host, a second
//! Docker daemon standing in for the worker's, stand-in commands under a node's NODE_ROOT, and
//! helpers that find or kill processes by command line.

use std::process::Command;

use crate::harness::Proc;

/// A stand-in for the command `name` in a node's NODE_ROOT (`root/bin`, where sparkgate looks
/// first): a shell script running `body`.
pub fn stand_in(root: &std::path::Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).expect("the node's bin/");
    let path = bin.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("the stand-in");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod +x");
}

/// Pids of live processes whose command line contains `needle` (e.g. a test's unique port).
pub fn processes_with(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// SIGKILL to a pid.
pub fn kill_pid(pid: u64) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// A real sshd on a loopback address (a "worker host": 127.0.0.2 unless told otherwise) with a
/// throwaway host key and a client key allowed to log in as the current user.
#[derive(Debug)]
pub struct Sshd {
    pub proc: Option<Proc>,
    pub port: u16,
    /// The loopback address it listens on.
    pub addr: &'static str,
    pub dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Sshd {
    pub fn start() -> Sshd {
        Self::start_on("127.0.0.2")
    }

    /// An sshd listening on `addr` (one of 127.0.0.0/8): another worker host.
    pub fn start_on(addr: &'static str) -> Sshd {
        let dir = tempfile::Builder::new()
            .prefix("sgs")
            .tempdir_in("/tmp")
            .expect("tempdir");
        for key in ["host_key", "id_ed25519"] {
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.path().join(key))
                .output()
                .expect("ssh-keygen");
            assert!(
                out.status.success(),
                "ssh-keygen: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::copy(dir.path().join("id_ed25519.pub"), dir.path().join("authorized_keys")).expect("authorized_keys");
        let port = std::net::TcpListener::bind((addr, 0))
            .expect("bind a loopback address")
            .local_addr()
            .expect("addr")
            .port();
        let config = dir.path().join("sshd_config");
        let d = dir.path().display();
        // SetEnv: a login shell whose rc file runs `pyenv rehash` (root's on these machines) would
        // wait 60 s on the lock file that a session killed mid-rehash (the SSH-cut test) leaves.
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress {addr}\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 StrictModes no\nAllowStreamLocalForwarding yes\nMaxSessions 64\nPidFile {d}/sshd.pid\n\
                 SetEnv PYENV_REHASH_TIMEOUT=0\n"
            ),
        )
        .expect("sshd_config");
        let _ = std::fs::create_dir_all("/run/sshd");
        let mut s = Sshd {
            proc: None,
            port,
            addr,
            dir,
            config,
        };
        s.run();
        s
    }

    /// (Re)starts the daemon on the same port.
    pub fn run(&mut self) {
        let args: Vec<String> = vec!["-D".into(), "-e".into(), "-f".into(), self.config.display().to_string()];
        let proc = Proc::spawn("/usr/sbin/sshd", &args, &[]);
        proc.wait_for(&format!("Server listening on {} port {}", self.addr, self.port));
        self.proc = Some(proc);
    }

    pub fn key(&self) -> std::path::PathBuf {
        self.dir.path().join("id_ed25519")
    }

    /// Cuts every connection: each session's sshd (the listener's descendants), then the listener.
    pub fn cut(&mut self) {
        if let Some(mut p) = self.proc.take() {
            for pid in descendants(p.pid()) {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            p.kill();
        }
    }

    pub fn log(&self) -> String {
        self.proc.as_ref().map(|p| p.log().join("\n")).unwrap_or_default()
    }

    /// sparkgate's settings for a worker on 127.0.0.2 reached through this sshd.
    pub fn worker_env(&self, control: &std::path::Path) -> Vec<(String, String)> {
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        [
            ("HEAD_IP", "127.0.0.1".to_owned()),
            ("WORKER_IP", "127.0.0.2".to_owned()),
            ("WORKER_USER", user),
            ("WORKER_SSH_PORT", self.port.to_string()),
            ("WORKER_SSH_KEY", self.key().display().to_string()),
            (
                "SSH_KNOWN_HOSTS_FILE",
                self.dir.path().join("known_hosts").display().to_string(),
            ),
            ("SSH_CONTROL_DIR", control.display().to_string()),
            ("SSH_CONNECT_TIMEOUT", "5".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// sparkgate's settings for one worker per sshd (WORKERS, in the given order) and, after them,
/// `local` more workers on the head's own address. Every sshd accepts the first one's client
/// key, which is the one WORKER_SSH_KEY names.
pub fn workers_env(sshds: &[&Sshd], local: usize, control: &std::path::Path) -> Vec<(String, String)> {
    let first = sshds[0];
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let public = std::fs::read(first.dir.path().join("id_ed25519.pub")).expect("the first sshd's client key");
    let mut workers = Vec::new();
    for sshd in sshds {
        let mut keys = std::fs::OpenOptions::new()
            .append(true)
            .open(sshd.dir.path().join("authorized_keys"))
            .expect("authorized_keys");
        std::io::Write::write_all(&mut keys, &public).expect("trust the first key");
        workers.push(format!("{user}@{}:{}", sshd.addr, sshd.port));
    }
    workers.extend(std::iter::repeat_n("127.0.0.1".to_owned(), local));
    let mut env = first.worker_env(control);
    env.retain(|(k, _)| k != "WORKER_IP" && k != "WORKER_SSH_PORT");
    env.push(("WORKERS".into(), workers.join(",")));
    env
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Every process below `pid`, read from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if let Some(ppid) = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok())
        {
            parent_of.push((p, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, _) in parent_of.iter().filter(|(_, pp)| *pp == parent) {
            out.push(*child);
            frontier.push(*child);
        }
    }
    out
}

/// A second Docker daemon on this machine standing in for the worker's: its own data root, exec
/// root and socket (reached by the worker's SSH forward), no bridge or iptables changes.
#[derive(Debug)]
pub struct WorkerDaemon {
    proc: Option<Proc>,
    pub dir: tempfile::TempDir,
}

impl WorkerDaemon {
    pub fn start() -> WorkerDaemon {
        Self::start_with_data_root_mib(None)
    }

    /// A daemon whose data root is a tmpfs of `mib` MiB (a worker disk that is nearly full).
    pub fn start_with_small_disk(mib: u32) -> WorkerDaemon {
        Self::start_with_data_root_mib(Some(mib))
    }

    fn start_with_data_root_mib(mib: Option<u32>) -> WorkerDaemon {
        // Short paths: the socket path must fit a unix socket address (108 bytes).
        let dir = tempfile::Builder::new()
            .prefix("sgd")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let d = dir.path().display().to_string();
        if let Some(mib) = mib {
            mount_tmpfs(&dir.path().join("data"), mib);
        }
        std::fs::write(dir.path().join("daemon.json"), "{}").expect("daemon.json");
        let args: Vec<String> = [
            "--config-file",
            &format!("{d}/daemon.json"),
            "--data-root",
            &format!("{d}/data"),
            "--exec-root",
            &format!("{d}/exec"),
            "--pidfile",
            &format!("{d}/dockerd.pid"),
            "--host",
            &format!("unix://{d}/docker.sock"),
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let proc = Proc::spawn("dockerd", &args, &[]);
        proc.wait_for("API listen on");
        WorkerDaemon { proc: Some(proc), dir }
    }

    pub fn socket(&self) -> String {
        self.dir.path().join("docker.sock").display().to_string()
    }

    /// `docker -H <this daemon> ARGS`: (success, stdout + stderr).
    pub fn docker(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket()))
            .args(args)
            .output()
            .expect("docker CLI");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// The image's RootFS layer digests on this daemon (empty when it lacks the image).
    pub fn layers(&self, image: &str) -> String {
        let (ok, out) = self.docker(&["image", "inspect", "--format", "{{json .RootFS.Layers}}", image]);
        if ok {
            out.trim().to_owned()
        } else {
            String::new()
        }
    }
}

impl Drop for WorkerDaemon {
    fn drop(&mut self) {
        let (_, ids) = self.docker(&["ps", "-aq"]);
        for id in ids.split_whitespace() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        if let Some(mut p) = self.proc.take() {
            let _ = Command::new("kill").args(["-TERM", &p.pid().to_string()]).status();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while p.try_status().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            p.kill();
        }
        // Whatever is still mounted below the daemon's directories (its default network
        // namespace, a tmpfs data root), deepest first, so the directory can go.
        let root = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&root))
            .map(str::to_owned)
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", &m]).output();
        }
        let _ = Command::new("rm").arg("-rf").arg(self.dir.path()).status();
    }
}

/// The simulator image of the vllm-sim binary at `sim` on the machine's daemon, built once from
/// nothing (`tests/sim-image/build.sh`): its tag names the binary's size and mtime, so the test
/// processes of one run share one image and a rebuilt binary gets a new one.
pub fn sim_image(sim: &str) -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let meta = std::fs::metadata(sim).expect("vllm-sim binary");
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let tag = format!("sparkgate/vllm-sim:test-{}-{mtime}", meta.len());
        let present = Command::new("docker")
            .args(["image", "inspect", &tag])
            .output()
            .is_ok_and(|o| o.status.success());
        if !present {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sim-image/build.sh");
            let out = Command::new("bash")
                .args([script, sim, &tag])
                .output()
                .expect("build.sh");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        tag
    })
}

/// The settings that make a RUNTIME=docker plan run here — no GPUs, no CAP_SYS_RESOURCE, no
/// weights or weight sync, the page cache left alone — for the simulator image of `sim`, served
/// as `model` (containers `<model>-head` / `<model>-worker`) with its host paths under `dir`.
pub fn docker_env(sim: &str, model: &str, dir: &std::path::Path) -> Vec<(String, String)> {
    [
        ("RUNTIME", "docker".to_owned()),
        ("IMAGE", sim_image(sim).to_owned()),
        ("SERVED_MODEL_NAME", model.to_owned()),
        ("CONTAINER_HEAD", format!("{model}-head")),
        ("CONTAINER_WORKER", format!("{model}-worker")),
        ("RANK_GPUS", "none".into()),
        ("RANK_MEMLOCK_UNLIMITED", "0".into()),
        ("RANK_DEVICES", String::new()),
        ("CHAT_TEMPLATE_HOST", String::new()),
        ("MODEL_HOST", dir.join("model").display().to_string()),
        ("HF_HOME", dir.join("hf").display().to_string()),
        // The simulator image's stand-in for the guides' GPU/overlay check scripts.
        ("SELF_CHECK_CMD", "vllm selfcheck".into()),
        ("SKIP_DOWNLOAD", "1".into()),
        ("SKIP_SYNC", "1".into()),
        ("DSV41_DROP_PAGE_CACHE", "0".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Ids (full, sorted) of the containers labelled `sparkgate.group=<group>`.
pub fn group_containers(group: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            &format!("label=sparkgate.group={group}"),
        ])
        .output();
    let mut ids: Vec<String> = out
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

/// Mounts a tmpfs of `mib` MiB at `path` (created if missing): a small disk for a test. The
/// caller unmounts it.
pub fn mount_tmpfs(path: &std::path::Path, mib: u32) {
    std::fs::create_dir_all(path).expect("mount point");
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
        .arg(path)
        .output()
        .expect("mount");
    assert!(
        out.status.success(),
        "mount tmpfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
