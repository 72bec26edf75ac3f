//! Starting one epoch, as a task the actor can cancel: spawn the ranks of the mode's plan
//! (workers first, rank 0 last), wait until rank 0 is ready (READY_TIMEOUT; HANG_SECONDS of
//! rank-0 silence is a stall; READY_GENERATE_PROBE adds a one-token completion), then warm the
//! boot shapes and drop the page cache. Rank exits are not watched here: they reach the actor
//! directly, and it cancels the start.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sparkgate_config::{LaunchPlan, SpecMethod};
use tokio::sync::{mpsc, watch};

use crate::exits::RankExit;
use crate::probe::Probe;
use crate::rank::{Backend, Rank, Reporting};

/// How long one warm-up request may take (the guides' GLM53_WARMUP_REQ_TIMEOUT).
const WARMUP_REQUEST_LIMIT: Duration = Duration::from_secs(240);

/// The ranks of the current epoch, shared by the actor and the start that spawns them (so a
/// stop finds every rank the start has made, and the status lists them while they load).
pub(crate) type Ranks = Arc<Mutex<Vec<Rank>>>;

/// One mode of the profile: its plan and limits.
#[derive(Debug, Clone)]
pub(crate) struct ModePlan {
    pub(crate) mode: SpecMethod,
    pub(crate) plan: LaunchPlan,
    pub(crate) max_num_seqs: u32,
    pub(crate) draft_tokens: u32,
}

/// Everything a start needs, fixed for the supervisor's life.
#[derive(Debug)]
pub(crate) struct Starter {
    pub(crate) backend: Arc<Backend>,
    pub(crate) modes: Vec<ModePlan>,
    pub(crate) probe: Probe,
    pub(crate) log_dir: PathBuf,
    /// LOG_KEEP_EPOCHS and LOG_KEEP_BYTES, applied before each start.
    pub(crate) retention: crate::retention::Retention,
    /// Old epochs removed so far: directories and bytes (`sparkgate status`, metrics).
    pub(crate) pruned: Arc<std::sync::Mutex<(u64, u64)>>,
    pub(crate) ready_timeout: Duration,
    pub(crate) hang: Duration,
    pub(crate) generate_probe: bool,
    pub(crate) warmup: bool,
    pub(crate) drop_page_cache: bool,
}

/// Why a start did not reach ready.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StartError {
    Failed(String),
    /// Rank 0 went quiet: the actor writes diagnostics before stopping the group.
    Stalled(String),
    Cancelled,
}

/// A fresh epoch's directory left by an earlier gateway (one killed before it could clean up,
/// whose epochs counted from 1 too) is renamed `epoch-N.before-UNIXTIME`, so the new ranks'
/// logs start their own files and the old ones stay for a post-mortem. An adopted rank's epoch
/// never comes here: its file continues.
fn set_aside(dir: &std::path::Path) {
    if !dir.exists() {
        return;
    }
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = dir.as_os_str().to_owned();
    aside.push(format!(".before-{at}"));
    match std::fs::rename(dir, &aside) {
        Ok(()) => {
            tracing::info!(from = %dir.display(), to = %std::path::Path::new(&aside).display(), "an earlier gateway's logs of this epoch were set aside")
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not set an earlier gateway's epoch logs aside; the new ranks append to them")
        }
    }
}

impl Starter {
    pub(crate) fn mode(&self, mode: SpecMethod) -> &ModePlan {
        self.modes.iter().find(|m| m.mode == mode).unwrap_or(&self.modes[0])
    }

    pub(crate) fn epoch_dir(&self, epoch: u64) -> PathBuf {
        self.log_dir.join(format!("epoch-{epoch}"))
    }

    /// Starts `epoch` in `mode`; each spawned rank goes into `ranks` (and `spawned` is told).
    pub(crate) async fn run(
        &self,
        epoch: u64,
        mode: SpecMethod,
        ranks: Ranks,
        exits: mpsc::UnboundedSender<RankExit>,
        spawned: impl Fn(),
        mut cancel: watch::Receiver<bool>,
    ) -> Result<(), StartError> {
        let dir = self.epoch_dir(epoch);
        set_aside(&dir);
        let pruned = crate::retention::prune(&self.log_dir, &dir, self.retention);
        if !pruned.dirs.is_empty() {
            let mut total = self.pruned.lock().expect("pruned");
            total.0 += pruned.dirs.len() as u64;
            total.1 += pruned.bytes;
        }
        let mut order = self.mode(mode).plan.ranks.clone();
        order.sort_by_key(|r| std::cmp::Reverse(r.rank));
        for plan in &order {
            if *cancel.borrow() {
                return Err(StartError::Cancelled);
            }
            let log = dir.join(format!("rank{}.log", plan.rank));
            let to = Reporting {
                epoch,
                log: &log,
                exits: exits.clone(),
            };
            let rank = self
                .backend
                .start(plan, to)
                .await
                .map_err(|e| StartError::Failed(e.to_string()))?;
            tracing::info!(rank = plan.rank, epoch, runtime = %self.backend.runtime(), log = %log.display(), "rank started");
            ranks.lock().expect("ranks lock").push(rank);
            spawned();
        }
        let rank0 = ranks
            .lock()
            .expect("ranks lock")
            .iter()
            .find(|r| r.rank() == 0)
            .map(Rank::sink);
        tokio::select! {
            r = self.ready(rank0) => r?,
            _ = cancel.wait_for(|c| *c) => return Err(StartError::Cancelled),
        }
        let m = self.mode(mode);
        if self.warmup {
            self.warm_up(m).await;
        }
        if self.drop_page_cache {
            crate::nodes::drop_page_cache(&self.backend).await;
        }
        Ok(())
    }

    /// Waits until rank 0 is ready, READY_TIMEOUT passes or rank 0 stays quiet for HANG_SECONDS.
    async fn ready(&self, rank0: Option<crate::logsink::LogSink>) -> Result<(), StartError> {
        let deadline = Instant::now() + self.ready_timeout;
        let mut generation_failed = None;
        let mut wait = Duration::from_millis(100);
        loop {
            tokio::time::sleep(wait).await;
            wait = Duration::from_secs(1);
            if self.probe.ready().await {
                if !self.generate_probe {
                    return Ok(());
                }
                let limit = deadline
                    .saturating_duration_since(Instant::now())
                    .clamp(Duration::from_secs(1), Duration::from_secs(30));
                match self.probe.generates(limit).await {
                    Ok(()) => return Ok(()),
                    Err(why) => {
                        tracing::warn!(%why, "rank 0 answers /health but the one-token completion failed");
                        generation_failed = Some(why);
                    }
                }
            }
            if Instant::now() >= deadline {
                let why = generation_failed.map_or(String::new(), |w| {
                    format!(
                        "; it answers /health and lists the model, but a one-token completion failed ({w}) — \
                         a rank that cannot take part in generation, see the rank logs"
                    )
                });
                return Err(StartError::Failed(format!(
                    "rank 0 was not ready within READY_TIMEOUT={}s{why}",
                    self.ready_timeout.as_secs()
                )));
            }
            let quiet = rank0.as_ref().map_or(0.0, crate::logsink::LogSink::quiet_for);
            if quiet >= self.hang.as_secs_f64() {
                return Err(StartError::Stalled(format!(
                    "no rank-0 log line for {quiet:.0}s (HANG_SECONDS={})",
                    self.hang.as_secs()
                )));
            }
        }
    }

    /// The boot-shape warm-up before the group is published ready (failures only warn: an
    /// unwarmed shape compiles on first use instead).
    async fn warm_up(&self, m: &ModePlan) {
        let started = Instant::now();
        let (sent, failures) = self
            .probe
            .warm_up(m.max_num_seqs, m.draft_tokens, WARMUP_REQUEST_LIMIT)
            .await;
        if failures.is_empty() {
            tracing::info!(
                requests = sent,
                max_num_seqs = m.max_num_seqs,
                seconds = started.elapsed().as_secs_f64(),
                "boot-shape warm-up done"
            );
        } else {
            tracing::warn!(requests = sent, failed = failures.len(), first = %failures[0], "boot-shape warm-up had failures; uncovered shapes may compile mid-serve");
        }
    }
}
