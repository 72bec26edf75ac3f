//! `RUNTIME=process` with a remote worker: the worker rank's `vllm serve …` argv runs as a
//! process on the worker over SSH (through `sparkgate-docker`'s SSH node), its output captured
//! into the epoch's log file and its exit reported like a local rank's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sparkgate_config::{NodeRole, RankEnvValue, RankPlan};
use sparkgate_docker::Node;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::actor::{watch_exit, Event};
use crate::error::SupervisorError;
use crate::logsink::LogSink;
use crate::status::RankStatus;

#[derive(Debug)]
pub(crate) struct RankRemote {
    pub(crate) rank: u32,
    node: NodeRole,
    ssh: Node,
    pub(crate) pid: u32,
    log: PathBuf,
    sink: LogSink,
    exited: Arc<AtomicBool>,
}

impl RankRemote {
    pub(crate) async fn spawn(
        ssh: &Node,
        bin: &str,
        plan: &RankPlan,
        epoch: u64,
        log: &Path,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<RankRemote, SupervisorError> {
        crate::logsink::create_parent(log)?;
        let env: Vec<(String, String)> = plan
            .container
            .env
            .iter()
            .map(|(k, v)| match v {
                RankEnvValue::Plain(p) => (k.clone(), p.clone()),
                RankEnvValue::Secret(s) => (k.clone(), s.expose().to_owned()),
            })
            .collect();
        let mut process = ssh.spawn_remote(bin, plan.vllm_argv(), &env).await?;
        let mut file = tokio::fs::File::create(log)
            .await
            .map_err(|source| SupervisorError::LogDir {
                path: log.to_path_buf(),
                source,
            })?;
        let sink = LogSink::new();
        let lines = sink.clone();
        tokio::spawn(async move {
            while let Some(line) = process.lines.recv().await {
                let _ = file.write_all(line.as_bytes()).await;
                let _ = file.write_all(b"\n").await;
                let _ = file.flush().await;
                lines.line(line);
            }
        });
        let exit = process.exit;
        let exited = watch_exit(epoch, plan.rank, events, async move {
            exit.await.unwrap_or_else(|_| "the SSH session ended".into())
        });
        Ok(RankRemote {
            rank: plan.rank,
            node: plan.node,
            ssh: ssh.clone(),
            pid: process.pid,
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

    /// SIGKILL over SSH; waits (bounded) for the exit to be reported.
    pub(crate) async fn stop(&self) {
        if let Err(e) = self.ssh.kill_remote(self.pid).await {
            tracing::error!(rank = self.rank, pid = self.pid, error = %e, "cannot kill the remote rank");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.exited.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) fn status(&self) -> RankStatus {
        RankStatus {
            rank: self.rank,
            node: self.node,
            pid: Some(self.pid),
            container: None,
            running: !self.exited.load(Ordering::SeqCst),
            uptime_s: self.sink.uptime_s(),
            log: self.log.clone(),
        }
    }
}
