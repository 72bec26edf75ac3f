//! A worker's Docker daemon reached over SSH: one long-lived openssh session (key-based,
//! BatchMode), the worker's Docker socket forwarded to a local unix socket, and bollard on top —
//! the same `Node` code path as the head's local socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openssh::{ForwardType, KnownHosts, Session, SessionBuilder};

use crate::{DockerError, Node};

/// How to reach a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct SshTarget {
    /// `user@host`.
    pub destination: String,
    pub port: u16,
    pub keyfile: Option<PathBuf>,
    /// `accept-new` (default), `strict` or `accept`.
    pub known_hosts: String,
    pub known_hosts_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// The worker's Docker socket.
    pub remote_socket: String,
    /// A short directory for the control socket (unix socket paths are limited to 108 bytes).
    pub control_dir: PathBuf,
}

/// Keeps the SSH session (and so the forward) alive as long as the node.
#[derive(Debug)]
pub(crate) struct Tunnel {
    session: Session,
}

impl Tunnel {
    pub(crate) async fn alive(&self) -> bool {
        self.session.check().await.is_ok()
    }

    /// Runs `program args…` on the worker; its stdout on success.
    pub(crate) async fn run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = self
            .session
            .command(program)
            .args(args)
            .output()
            .await
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

impl Node {
    /// Connects to the worker over SSH, forwards its Docker socket and checks the daemon answers.
    pub async fn over_ssh(name: &str, target: &SshTarget) -> Result<Node, DockerError> {
        let ssh_err = |detail: String| DockerError::Ssh {
            node: name.to_owned(),
            destination: target.destination.clone(),
            detail,
        };
        std::fs::create_dir_all(&target.control_dir)
            .map_err(|e| ssh_err(format!("control directory {}: {e}", target.control_dir.display())))?;
        let mut b = SessionBuilder::default();
        b.port(target.port)
            .connect_timeout(target.connect_timeout)
            .server_alive_interval(Duration::from_secs(5))
            .control_directory(&target.control_dir)
            .known_hosts_check(match target.known_hosts.as_str() {
                "strict" => KnownHosts::Strict,
                "accept" => KnownHosts::Accept,
                _ => KnownHosts::Add,
            });
        if let Some(k) = &target.keyfile {
            b.keyfile(k);
        }
        if let Some(f) = &target.known_hosts_file {
            b.user_known_hosts_file(f);
        }
        let session = tokio::time::timeout(
            target.connect_timeout + Duration::from_secs(5),
            b.connect_mux(&target.destination),
        )
        .await
        .map_err(|_| ssh_err(format!("no answer within {}s", target.connect_timeout.as_secs())))?
        .map_err(|e| ssh_err(e.to_string()))?;
        let local = session
            .control_socket()
            .parent()
            .map(|d| d.join("docker.sock"))
            .unwrap_or_else(|| target.control_dir.join("docker.sock"));
        let _ = std::fs::remove_file(&local);
        session
            .request_port_forward(ForwardType::Local, local.clone(), PathBuf::from(&target.remote_socket))
            .await
            .map_err(|e| ssh_err(format!("cannot forward {}: {e}", target.remote_socket)))?;
        let path = local.to_string_lossy().into_owned();
        let mut node = Node::local(name, &path).await.map_err(|e| match e {
            DockerError::Unreachable { source, .. } => ssh_err(format!(
                "the Docker daemon at {} does not answer through SSH: {source}",
                target.remote_socket
            )),
            other => other,
        })?;
        node.tunnel = Some(Arc::new(Tunnel { session }));
        Ok(node)
    }

    /// MemAvailable of the node in GiB: the head's from `meminfo` (a path on this machine), a
    /// worker's read over its SSH session.
    pub async fn mem_available_gib(&self, meminfo: &std::path::Path) -> Option<f64> {
        let text = match &self.tunnel {
            Some(t) => t.run("cat", &["/proc/meminfo"]).await.ok()?,
            None => std::fs::read_to_string(meminfo).ok()?,
        };
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / (1024.0 * 1024.0))
    }

    /// For an SSH node: whether the session still works (false after a cut).
    pub async fn connected(&self) -> bool {
        match &self.tunnel {
            Some(t) => t.alive().await,
            None => true,
        }
    }
}
