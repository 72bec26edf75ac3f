//! Test hosts and processes: a real sshd on 127.0.0.2 standing in for the worker host, and
//! helpers that find or kill processes by command line.

use std::process::Command;

use crate::harness::Proc;

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

/// A real sshd on 127.0.0.2 (a "worker host" on loopback) with a throwaway host key and a client
/// key allowed to log in as the current user.
#[derive(Debug)]
pub struct Sshd {
    pub proc: Option<Proc>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Sshd {
    pub fn start() -> Sshd {
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
        let port = std::net::TcpListener::bind("127.0.0.2:0")
            .expect("bind 127.0.0.2")
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
                "Port {port}\nListenAddress 127.0.0.2\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
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
        proc.wait_for(&format!("Server listening on 127.0.0.2 port {}", self.port));
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
