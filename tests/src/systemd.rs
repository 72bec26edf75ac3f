//! A host with systemd as PID 1: a container of `IMAGE` (a Debian bookworm root with systemd,
//! built from Debian's packages by `bash .ci/run`: debootstrap, then `docker import`), the test's
//! binaries bind-mounted read-only at `BIN` (not at their own path, which may be under /tmp: a
//! unit's PrivateTmp= hides that), on the host's network (the test picks loopback
//! ports that are free). `--privileged` is refused on this machine (CAP_SYS_RESOURCE is not in
//! its bounding set), so the container gets every other capability and no seccomp filter —
//! what systemd needs to set up a unit's sandbox (ProtectSystem=, PrivateTmp=, …).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The image `bash .ci/run` builds.
pub const IMAGE: &str = "sparkgate-systemd:bookworm";

/// Where the test's binaries are in the container.
pub const BIN: &str = "/opt/sparkgate/bin";

/// A running systemd host, removed on drop.
#[derive(Debug)]
pub struct SystemdHost {
    name: String,
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().expect("docker runs")
}

impl SystemdHost {
    /// Boots systemd in a fresh container with `binaries` (a directory) mounted read-only at
    /// `BIN`; returns once systemd says the system is running.
    pub fn boot(binaries: &Path) -> SystemdHost {
        let image = docker(&["image", "inspect", IMAGE]);
        assert!(
            image.status.success(),
            "no image {IMAGE}: `bash .ci/run` builds it from Debian's packages (debootstrap, docker import)"
        );
        let name = format!(
            "sparkgate-systemd-{}-{}",
            std::process::id(),
            crate::harness::free_port()
        );
        let mount = format!("{}:{BIN}:ro", binaries.display());
        let run = docker(&[
            "run",
            "-d",
            "--name",
            &name,
            "--cap-add",
            "ALL",
            "--cap-drop",
            "SYS_RESOURCE",
            "--security-opt",
            "seccomp=unconfined",
            "--network",
            "host",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "-v",
            &mount,
            "--tmpfs",
            "/run",
            "--tmpfs",
            "/run/lock",
            "-e",
            "container=docker",
            IMAGE,
            "/lib/systemd/systemd",
        ]);
        assert!(
            run.status.success(),
            "docker run: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let host = SystemdHost { name };
        host.wait("systemd to boot", Duration::from_secs(60), |h| {
            let state = h.sh("systemctl is-system-running || true");
            matches!(state.trim(), "running" | "degraded").then_some(())
        });
        host
    }

    /// `sh -c script` in the container: its stdout (stderr appended), whatever its exit.
    pub fn sh(&self, script: &str) -> String {
        let out = docker(&["exec", &self.name, "sh", "-c", script]);
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// `sh -c script`, which must succeed; its output.
    pub fn ok(&self, script: &str) -> String {
        let out = docker(&["exec", &self.name, "sh", "-c", script]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{script}: {text}\njournal:\n{}", self.journal());
        text
    }

    /// Writes `text` to `path` in the container.
    pub fn write(&self, path: &str, text: &str) {
        use std::io::Write as _;
        let mut child = Command::new("docker")
            .args(["exec", "-i", &self.name, "sh", "-c", &format!("cat > {path}")])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("docker runs");
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
    }

    /// A property of a unit (`systemctl show -p NAME --value`).
    pub fn property(&self, unit: &str, name: &str) -> String {
        self.sh(&format!("systemctl show -p {name} --value {unit}"))
            .trim()
            .to_owned()
    }

    /// The unit's journal, as text.
    pub fn journal(&self) -> String {
        self.sh("journalctl -u sparkgate --no-pager -o cat")
    }

    /// Polls `probe` every 100 ms until it gives a value, at most `within`.
    pub fn wait<T>(&self, what: &str, within: Duration, probe: impl Fn(&Self) -> Option<T>) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = probe(self) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what} within {within:?}; journal:\n{}",
                self.journal()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SystemdHost {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.name]);
    }
}
