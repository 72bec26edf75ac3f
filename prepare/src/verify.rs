//! Checks before a start, each usable alone: the image's self-check in a throwaway container
//! (SELF_CHECK_CMD), and how to reach the nodes (the head's daemon, the worker's over SSH).

use std::path::Path;

use futures_util::StreamExt;
use sparkgate_config::{Config, RankPlan, Worker};
use sparkgate_docker::{Node, SshTarget};

use crate::PrepareError;

/// How SSH reaches `worker` (its Docker socket forwarded for RUNTIME=docker).
pub fn ssh_target(config: &Config, worker: &Worker) -> SshTarget {
    let ssh = &config.nodes.ssh;
    SshTarget {
        destination: worker.ssh.clone(),
        port: worker.ssh_port,
        keyfile: ssh.keyfile.clone(),
        known_hosts: ssh.known_hosts,
        known_hosts_file: ssh.known_hosts_file.clone(),
        connect_timeout: ssh.connect_timeout,
        remote_socket: ssh.worker_docker_socket.clone(),
        control_dir: ssh.control_dir.clone(),
    }
}

/// A worker on another machine and its Docker daemon, reached over SSH.
#[derive(Clone)]
pub struct Remote {
    pub worker: Worker,
    pub node: Node,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

/// The head's Docker daemon and the daemon of every worker on another machine (its address
/// differs from the head's), in rank order.
pub async fn connect(config: &Config) -> Result<(Node, Vec<Remote>), PrepareError> {
    let head = Node::local("head", &config.supervision.docker_socket).await?;
    let mut remotes = Vec::new();
    for w in config.nodes.remote_workers() {
        let node = Node::over_ssh(&w.label, &ssh_target(config, w)).await?;
        remotes.push(Remote {
            worker: w.clone(),
            node,
        });
    }
    Ok((head, remotes))
}

/// The image's self-check: `argv` in a throwaway container made from rank 0's spec (same image,
/// environment, mounts and devices, plus EXL3_SELFCHECK_GPU=1), its output written to `log`.
/// `Err` carries the exit status and the log's last lines.
pub async fn self_check(docker: &Node, rank0: &RankPlan, argv: &[String], log: &Path) -> Result<(), PrepareError> {
    let mut spec = rank0.container.clone();
    spec.name = format!("{}-selfcheck", spec.name);
    spec.labels.clear();
    spec.entrypoint = argv[..1].to_vec();
    spec.cmd = argv[1..].to_vec();
    spec.env.push((
        "EXL3_SELFCHECK_GPU".into(),
        sparkgate_config::RankEnvValue::Plain("1".into()),
    ));
    let id = docker
        .run(&spec, &[])
        .await
        .map_err(|e| PrepareError::SelfCheck(format!("the self-check container did not start: {e}")))?;
    let exit = docker.wait_exit(&id).await;
    let output: Vec<bytes::Bytes> = docker.logs(&id, None).collect().await;
    docker.kill_and_remove(&id).await.ok();
    let text: String = output.iter().map(|b| String::from_utf8_lossy(b)).collect();
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(log, &text);
    if exit.kind == Some(sparkgate_docker::ExitKind::Code(0)) {
        return Ok(());
    }
    let status = exit.status;
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join(" | ");
    Err(PrepareError::SelfCheck(format!(
        "the image's self-check `{}` failed ({status}; SKIP_OVERLAY_VERIFY=1 skips it); last lines of {}: {tail}",
        argv.join(" "),
        log.display()
    )))
}
