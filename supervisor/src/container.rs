//! `RUNTIME=docker`: a rank is a container created from the plan's spec (plus its epoch label) on
//! a `sparkgate-docker` node; its output is followed into the epoch's log file and its exit
//! reported, like a rank process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use sparkgate_config::{labels, NodeRole, RankPlan};
use sparkgate_docker::Node;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::actor::{watch_exit, Event};
use crate::error::SupervisorError;
use crate::logsink::LogSink;
use crate::status::RankStatus;

#[derive(Debug)]
pub(crate) struct RankContainer {
    pub(crate) rank: u32,
    node: NodeRole,
    docker: Node,
    pub(crate) id: String,
    log: PathBuf,
    sink: LogSink,
    exited: Arc<AtomicBool>,
}

impl RankContainer {
    /// Runs the rank's container, or attaches to `adopt` (a running container of this epoch).
    pub(crate) async fn start(
        docker: &Node,
        plan: &RankPlan,
        epoch: u64,
        log: &Path,
        events: mpsc::UnboundedSender<Event>,
        adopt: Option<String>,
    ) -> Result<RankContainer, SupervisorError> {
        crate::logsink::create_parent(log)?;
        let adopted = adopt.is_some();
        let id = match adopt {
            Some(id) => id,
            None => {
                docker
                    .run(&plan.container, &[(labels::EPOCH.to_owned(), epoch.to_string())])
                    .await?
            }
        };
        let sink = LogSink::new();
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .await
            .map_err(|source| SupervisorError::LogDir {
                path: log.to_path_buf(),
                source,
            })?;
        // Adopted: follow from now (the earlier output is in the previous gateway's log file).
        let mut output = Box::pin(docker.logs(&id, adopted.then_some(0)));
        let lines = sink.clone();
        tokio::spawn(async move {
            let mut pending = Vec::new();
            while let Some(chunk) = output.next().await {
                let _ = file.write_all(&chunk).await;
                let _ = file.flush().await;
                pending.extend_from_slice(&chunk);
                while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=pos).collect();
                    lines.line(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
                }
            }
        });
        let (waiter, wait_id) = (docker.clone(), id.clone());
        let exited = watch_exit(
            epoch,
            plan.rank,
            events,
            async move { waiter.wait_exit(&wait_id).await },
        );
        Ok(RankContainer {
            rank: plan.rank,
            node: plan.node,
            docker: docker.clone(),
            id,
            log: log.to_path_buf(),
            sink,
            exited,
        })
    }

    pub(crate) fn quiet_for(&self) -> f64 {
        self.sink.quiet_for()
    }

    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        self.sink.tail(n)
    }

    pub(crate) fn running(&self) -> bool {
        !self.exited.load(Ordering::SeqCst)
    }

    /// A Python stack dump of the rank's main process (`py-spy` inside the image).
    pub(crate) async fn py_spy(&self) -> String {
        self.docker.exec(&self.id, &["py-spy", "dump", "--pid", "1"]).await
    }

    /// Kills and removes the container.
    pub(crate) async fn stop(&self) {
        if let Err(e) = self.docker.kill_and_remove(&self.id).await {
            tracing::error!(rank = self.rank, container = %self.id, error = %e, "cannot remove rank container");
        }
    }

    pub(crate) fn status(&self) -> RankStatus {
        RankStatus {
            rank: self.rank,
            node: self.node,
            pid: None,
            container: Some(self.id.clone()),
            running: self.running(),
            uptime_s: self.sink.uptime_s(),
            log: self.log.clone(),
        }
    }
}

/// The image's self-check: `argv` in a throwaway container made from rank 0's spec (same image,
/// environment, mounts and devices, plus EXL3_SELFCHECK_GPU=1), its output written to `log`.
/// `Err` carries the exit status and the log's last lines.
pub(crate) async fn self_check(docker: &Node, rank0: &RankPlan, argv: &[String], log: &Path) -> Result<(), String> {
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
        .map_err(|e| format!("the self-check container did not start: {e}"))?;
    let status = docker.wait_exit(&id).await;
    let output: Vec<bytes::Bytes> = docker.logs(&id, None).collect().await;
    docker.kill_and_remove(&id).await.ok();
    let text: String = output.iter().map(|b| String::from_utf8_lossy(b)).collect();
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(log, &text);
    if status == "exit status: 0" {
        tracing::info!(log = %log.display(), "self-check passed");
        return Ok(());
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join(" | ");
    Err(format!(
        "the image's self-check `{}` failed ({status}; SKIP_OVERLAY_VERIFY=1 skips it); last lines of {}: {tail}",
        argv.join(" "),
        log.display()
    ))
}
