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

/// DSV41_DROP_PAGE_CACHE: after a load, the page cache the weights filled is dropped on each
/// node, so the GPU driver sees the memory as free (unified memory counts page cache as used).
/// Needs root on the node; otherwise it is skipped with a note.
pub(crate) async fn drop_page_cache(backend: &crate::rank::Backend) {
    let crate::rank::Backend::Docker { head, worker } = backend else {
        return;
    };
    let mut nodes = vec![head.clone()];
    if let Some(w) = worker {
        nodes.extend(w.node().await.ok());
    }
    const SCRIPT: &str = "if [ \"$(id -u)\" != 0 ]; then echo 'skipped: not root'; \
        elif [ ! -w /proc/sys/vm/drop_caches ]; then echo 'skipped: /proc/sys/vm/drop_caches is read-only here'; \
        else sync && echo 1 > /proc/sys/vm/drop_caches && echo dropped; fi";
    for node in &nodes {
        match node.shell(SCRIPT).await {
            Ok(out) if out.trim() == "dropped" => tracing::info!(node = node.name(), "page cache dropped"),
            Ok(out) => tracing::info!(node = node.name(), note = out.trim(), "page cache not dropped"),
            Err(e) => tracing::warn!(node = node.name(), error = %e, "page cache not dropped"),
        }
    }
}

/// RUNTIME=docker, before the first start: node preparation ([`sparkgate_prepare::for_start`],
/// progress into the log), then the image's self-check on the head when SELF_CHECK_CMD is set.
pub(crate) async fn prepare_nodes(
    config: &sparkgate_config::Config,
    backend: &crate::rank::Backend,
    self_check_cmd: &[String],
    rank0: Option<&RankPlan>,
    log_dir: &Path,
) -> Result<(), String> {
    let crate::rank::Backend::Docker { head, worker } = backend else {
        return Ok(());
    };
    let worker = match worker {
        Some(w) => Some(w.node().await.map_err(|e| e.to_string())?),
        None => None,
    };
    let report = sparkgate_prepare::progress::Log::new();
    sparkgate_prepare::for_start(config, head, worker.as_ref(), &report)
        .await
        .map_err(|e| format!("node preparation: {e}"))?;
    if let (false, Some(rank0)) = (self_check_cmd.is_empty(), rank0) {
        let log = log_dir.join("overlay-verify.log");
        sparkgate_prepare::verify::self_check(head, rank0, self_check_cmd, &log)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(log = %log.display(), "self-check passed");
    }
    Ok(())
}
