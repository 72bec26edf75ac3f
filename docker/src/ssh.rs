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
    pub known_hosts: sparkgate_config::KnownHosts,
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
    session: Arc<Session>,
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
        Self::connect_ssh(name, target, true).await
    }

    /// Connects to the worker over SSH for running processes only (RUNTIME=process): no Docker
    /// daemon is needed there, and Docker operations on this node fail.
    pub async fn ssh_only(name: &str, target: &SshTarget) -> Result<Node, DockerError> {
        Self::connect_ssh(name, target, false).await
    }

    async fn connect_ssh(name: &str, target: &SshTarget, docker: bool) -> Result<Node, DockerError> {
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
            .known_hosts_check(match target.known_hosts {
                sparkgate_config::KnownHosts::Strict => KnownHosts::Strict,
                sparkgate_config::KnownHosts::Accept => KnownHosts::Accept,
                sparkgate_config::KnownHosts::AcceptNew => KnownHosts::Add,
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
        if !docker {
            // No daemon is reached on this node: the client points at a path that is not a socket,
            // so any Docker call made by mistake fails at once instead of touching another host.
            let client = bollard::Docker::connect_with_unix("/dev/null", 5, bollard::API_DEFAULT_VERSION)
                .map_err(|e| ssh_err(e.to_string()))?;
            let tunnel = Some(Arc::new(Tunnel {
                session: Arc::new(session),
            }));
            return Ok(Node {
                name: name.to_owned(),
                docker: client,
                tunnel,
            });
        }
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
        node.tunnel = Some(Arc::new(Tunnel {
            session: Arc::new(session),
        }));
        Ok(node)
    }

    /// MemAvailable of the node in GiB: the head's from `meminfo` (a path on this machine), a
    /// worker's read over its SSH session.
    pub async fn mem_available_gib(&self, meminfo: &std::path::Path) -> Option<f64> {
        let text = match &self.tunnel {
            Some(t) => t.run("cat", &["/proc/meminfo"]).await.ok()?,
            None => std::fs::read_to_string(meminfo).ok()?,
        };
        mem_available_gib(&text)
    }

    /// For an SSH node: whether the session still works (false after a cut).
    pub async fn connected(&self) -> bool {
        match &self.tunnel {
            Some(t) => t.alive().await,
            None => true,
        }
    }
}

/// Sends each line of `reader` (decoded lossily: bytes that are not UTF-8 must not end the
/// capture) until it ends.
async fn forward_lines(
    mut reader: impl tokio::io::AsyncBufRead + Unpin,
    lines: tokio::sync::mpsc::UnboundedSender<String>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = line.strip_suffix(b"\n").unwrap_or(&line);
                let _ = lines.send(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
}

/// How long a remote command may take to report its pid.
const REMOTE_START_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// A process started on a node over SSH (RUNTIME=process with a remote worker).
#[derive(Debug)]
pub struct RemoteProcess {
    /// The remote pid (the program `exec`s in place of the shell that reported it).
    pub pid: u32,
    /// Its stdout and stderr, line by line.
    pub lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// Resolves with its exit status (or why the session ended).
    pub exit: tokio::sync::oneshot::Receiver<crate::Exit>,
}

impl Node {
    /// Runs `program args…` with `env` on this SSH node.
    pub async fn spawn_remote(
        &self,
        program: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<RemoteProcess, DockerError> {
        use tokio::io::AsyncBufReadExt;
        let Some(t) = &self.tunnel else {
            return Err(DockerError::Ssh {
                node: self.name.clone(),
                destination: "local".into(),
                detail: "not an SSH node".into(),
            });
        };
        let mut cmd = Session::arc_command(t.session.clone(), "sh");
        cmd.arg("-c").arg("echo $$; exec env \"$@\"").arg("sh");
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(program)
            .args(args)
            .stdout(openssh::Stdio::piped())
            .stderr(openssh::Stdio::piped());
        let ssh_err = |detail: String| DockerError::Ssh {
            node: self.name.clone(),
            destination: "worker".into(),
            detail,
        };
        let mut child = cmd
            .spawn()
            .await
            .map_err(|e| ssh_err(format!("cannot start {program}: {e}")))?;
        let stdout = child.stdout().take().ok_or_else(|| ssh_err("no stdout".into()))?;
        let stderr = child.stderr().take().ok_or_else(|| ssh_err("no stderr".into()))?;
        let mut out = tokio::io::BufReader::new(stdout).lines();
        // The pid line comes after the user's shell startup files ran; a blocking rc file must
        // fail the start clearly rather than hang it.
        let first = tokio::time::timeout(REMOTE_START_LIMIT, out.next_line())
            .await
            .map_err(|_| {
                ssh_err(format!(
                    "{program} did not start within {} s (the worker's shell startup files may be blocking)",
                    REMOTE_START_LIMIT.as_secs()
                ))
            })?
            .map_err(|e| ssh_err(e.to_string()))?
            .unwrap_or_default();
        let pid: u32 = first
            .trim()
            .parse()
            .map_err(|_| ssh_err(format!("unexpected first line from the worker: {first:?}")))?;
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let tx2 = tx.clone();
        sparkgate_task::spawn("ssh-stdout", forward_lines(out.into_inner(), tx));
        sparkgate_task::spawn("ssh-stderr", forward_lines(tokio::io::BufReader::new(stderr), tx2));
        let (exit_tx, exit) = tokio::sync::oneshot::channel();
        sparkgate_task::spawn("ssh-exit", async move {
            let status = match child.wait().await {
                Ok(s) => crate::Exit {
                    status: s.to_string(),
                    kind: s.code().map(|c| crate::ExitKind::Code(i64::from(c))),
                },
                // sshd reports a signal death as exit-signal, which the mux passes on as this.
                Err(openssh::Error::RemoteProcessTerminated) => crate::Exit {
                    status: "killed by a signal".to_owned(),
                    kind: Some(crate::ExitKind::Signal),
                },
                Err(e) => crate::Exit::unknown(format!("the SSH session ended: {e}")),
            };
            let _ = exit_tx.send(status);
        });
        Ok(RemoteProcess { pid, lines, exit })
    }

    /// SIGKILL to a process started by [`Node::spawn_remote`] and everything it started: sshd
    /// runs each command in a new session, so the pid leads a process group (vLLM's engine
    /// processes included); the pid alone is the fallback. A process already gone (it died with
    /// its SSH session) is stopped: only one that is there and will not take the signal fails.
    pub async fn kill_remote(&self, pid: u32) -> Result<(), DockerError> {
        let Some(t) = &self.tunnel else { return Ok(()) };
        let script = format!("kill -KILL -- -{pid} 2>/dev/null || ! kill -0 {pid} 2>/dev/null || kill -KILL {pid}");
        t.run("sh", &["-c", &script])
            .await
            .map(|_| ())
            .map_err(|detail| DockerError::Ssh {
                node: self.name.clone(),
                destination: "worker".into(),
                detail: format!("kill {pid}: {detail}"),
            })
    }
}

/// MemAvailable in GiB from a meminfo file's text; `None` when it has no such line.
pub fn mem_available_gib(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}
