//! `RUNTIME=process`: each rank is the plan's `vllm serve …` argv run as a child process, its
//! output captured to the epoch's log file with the time of the last meaningful line (for the
//! stall watchdog), and its exit reported to the supervisor.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sparkgate_config::{NodeRole, RankEnvValue, RankPlan};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::actor::{watch_exit, Event};
use crate::error::SupervisorError;
use crate::logsink::LogSink;
use crate::status::RankStatus;

/// A running rank process.
#[derive(Debug)]
pub(crate) struct RankProc {
    pub(crate) rank: u32,
    pub(crate) node: NodeRole,
    pub(crate) pid: u32,
    pub(crate) log: PathBuf,
    sink: LogSink,
    kill: Option<oneshot::Sender<()>>,
    exited: Arc<AtomicBool>,
}

impl RankProc {
    pub(crate) async fn spawn(
        bin: &str,
        plan: &RankPlan,
        epoch: u64,
        log: &Path,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<RankProc, SupervisorError> {
        crate::logsink::create_parent(log)?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(plan.vllm_argv())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in &plan.container.env {
            match v {
                RankEnvValue::Plain(p) => cmd.env(k, p),
                RankEnvValue::Secret(s) => cmd.env(k, s.expose()),
            };
        }
        let mut child = cmd.spawn().map_err(|source| SupervisorError::Spawn {
            bin: bin.to_owned(),
            rank: plan.rank,
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let sink = LogSink::new();
        let file = tokio::fs::File::create(log)
            .await
            .map_err(|source| SupervisorError::LogDir {
                path: log.to_path_buf(),
                source,
            })?;
        let file = Arc::new(tokio::sync::Mutex::new(file));
        let mut readers = Vec::new();
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
        for stream in [stdout, stderr].into_iter().flatten() {
            let (file, sink) = (file.clone(), sink.clone());
            readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut f = file.lock().await;
                    let _ = f.write_all(line.as_bytes()).await;
                    let _ = f.write_all(b"\n").await;
                    let _ = f.flush().await;
                    drop(f);
                    sink.line(line);
                }
            }));
        }
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let rank = plan.rank;
        let exited = watch_exit(epoch, rank, events, async move {
            let status = tokio::select! {
                s = child.wait() => s,
                _ = kill_rx => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            for r in readers {
                let _ = r.await;
            }
            match status {
                Ok(s) => s.to_string(),
                Err(e) => format!("wait failed: {e}"),
            }
        });
        Ok(RankProc {
            rank,
            node: plan.node,
            pid,
            log: log.to_path_buf(),
            sink,
            kill: Some(kill_tx),
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

    /// SIGKILL; the group is replaced as a unit, nothing of the old rank is reused.
    pub(crate) fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
    }

    /// Waits until the process is gone (after `kill`).
    pub(crate) async fn reaped(&self) {
        while self.running() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    pub(crate) fn status(&self) -> RankStatus {
        RankStatus {
            rank: self.rank,
            node: self.node,
            pid: Some(self.pid),
            container: None,
            running: self.running(),
            uptime_s: self.sink.uptime_s(),
            log: self.log.clone(),
        }
    }
}
