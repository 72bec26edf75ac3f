//! The supervisor actor: one task owns the rank group. It starts workers first and rank 0 last,
//! waits for readiness (failing fast when a rank exits, on READY_TIMEOUT, or when rank 0's log
//! stalls for HANG_SECONDS), watches the running group (exits, `/health`, token progress), and
//! restarts the whole group with a new epoch, backoff and a give-up budget.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sparkgate_config::{labels, Config, LaunchPlan, SpecMethod};
use tokio::sync::{mpsc, oneshot, watch};

use crate::backoff::Backoff;
use crate::container::RankContainer;
use crate::diagnostics;
use crate::probe::Probe;
use crate::rank::{Backend, Rank};
use crate::sampler::Sampler;
use crate::status::{GroupState, LastRestart, NodeMemory, Status};

/// What the ranks report.
#[derive(Debug)]
pub(crate) enum Event {
    RankExited { epoch: u64, rank: u32, status: String },
}

/// Watches a rank's exit, whatever runs it: when `status` resolves, the returned flag turns true
/// (what the rank's `running` reads) and the exit is reported to the actor.
pub(crate) fn watch_exit(
    epoch: u64,
    rank: u32,
    events: mpsc::UnboundedSender<Event>,
    status: impl std::future::Future<Output = String> + Send + 'static,
) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let exited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = exited.clone();
    tokio::spawn(async move {
        let status = status.await;
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = events.send(Event::RankExited { epoch, rank, status });
    });
    exited
}

/// What operators ask for.
#[derive(Debug)]
pub(crate) enum Command {
    /// Restart the group; with `mode`, into that speculation mode (its plan and MAX_NUM_SEQS).
    Restart {
        reason: String,
        mode: Option<SpecMethod>,
    },
    Stop,
    Start,
    Shutdown(oneshot::Sender<()>),
}

/// How a started or running group ended.
#[derive(Debug)]
enum Ended {
    Failure(String),
    Asked(Command),
}

/// How long one warm-up request may take (the guides' GLM53_WARMUP_REQ_TIMEOUT).
const WARMUP_REQUEST_LIMIT: Duration = Duration::from_secs(240);

#[derive(Debug)]
pub(crate) struct Actor {
    backend: Backend,
    group: String,
    plan: LaunchPlan,
    /// Every mode of the profile with its plan, MAX_NUM_SEQS and draft length, for mode switches.
    plans: Vec<(SpecMethod, LaunchPlan, u32, u32)>,
    max_num_seqs: u32,
    log_dir: PathBuf,
    ready_timeout: Duration,
    hang: Duration,
    /// Memguard: (threshold GiB, meminfo path) when MEM_GUARD=1.
    mem_guard: Option<(f64, PathBuf)>,
    /// READY_GENERATE_PROBE: readiness includes a one-token completion.
    generate_probe: bool,
    /// SELF_CHECK_CMD (empty: none), run once before the first start with RUNTIME=docker.
    self_check: Vec<String>,
    /// Node preparation (weights, image, shipping, weight sync) and the self-check have run.
    prepared: bool,
    /// The configuration node preparation works from.
    config: std::sync::Arc<Config>,
    /// BOOT_SHAPE_WARMUP, and the active mode's draft length it warms up.
    warmup: bool,
    draft_tokens: u32,
    progress_timeout: Duration,
    mode: String,
    probe: Probe,
    events_tx: mpsc::UnboundedSender<Event>,
    events_rx: mpsc::UnboundedReceiver<Event>,
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    status_tx: watch::Sender<Status>,
    epoch: u64,
    ranks: Vec<Rank>,
    backoff: Backoff,
    restarts: u32,
    last_restart: Option<LastRestart>,
    state: GroupState,
    memory: Vec<NodeMemory>,
    meminfo: PathBuf,
    stop_on_exit: bool,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Actor {
    pub(crate) fn new(
        config: &Config,
        backend: Backend,
        packed: &[(u32, String)],
        cmd_rx: mpsc::UnboundedReceiver<Command>,
        status_tx: watch::Sender<Status>,
    ) -> Self {
        let s = &config.supervision;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let probe = Probe::new(
            format!("http://127.0.0.1:{}", config.ports.vllm),
            config.serving.served_model_name.clone(),
            config.secrets.vllm_api_key.as_ref().map(|k| k.expose().to_owned()),
        );
        Self {
            backend,
            group: config.group_name(),
            plan: config.plan().with_packed_engram(packed),
            plans: config
                .speculation
                .modes
                .iter()
                .map(|m| {
                    (
                        m.method,
                        config.plan_for(m.method).with_packed_engram(packed),
                        m.max_num_seqs,
                        m.num_speculative_tokens,
                    )
                })
                .collect(),
            max_num_seqs: config.speculation.active_mode().max_num_seqs,
            log_dir: s.log_dir.clone(),
            ready_timeout: s.ready_timeout,
            hang: s.hang,
            mem_guard: s.mem_guard.then(|| (s.mem_guard_gib, s.meminfo_path.clone())),
            generate_probe: s.ready_generate_probe,
            self_check: s.self_check.clone(),
            prepared: false,
            config: std::sync::Arc::new(config.clone()),
            warmup: s.boot_shape_warmup,
            draft_tokens: config.speculation.active_mode().num_speculative_tokens,
            progress_timeout: s.progress_timeout,
            mode: config.speculation.active.to_string(),
            probe,
            events_tx,
            events_rx,
            cmd_rx,
            status_tx,
            epoch: 0,
            ranks: Vec::new(),
            backoff: Backoff::new(s.backoff_initial, s.backoff_max, s.healthy_reset, s.restart_budget),
            restarts: 0,
            last_restart: None,
            state: GroupState::Stopped,
            memory: Vec::new(),
            meminfo: s.meminfo_path.clone(),
            stop_on_exit: s.stop_ranks_on_exit,
        }
    }

    pub(crate) fn status(&self) -> Status {
        Status {
            state: self.state.clone(),
            epoch: self.epoch,
            mode: self.mode.clone(),
            max_num_seqs: self.max_num_seqs,
            runtime: self.backend.name(),
            ranks: self.ranks.iter().map(Rank::status).collect(),
            restarts: self.restarts,
            last_restart: self.last_restart.clone(),
            memory: self.memory.clone(),
            preparing: None,
        }
    }

    fn set(&mut self, state: GroupState) {
        if state != self.state {
            tracing::info!(state = ?state, epoch = self.epoch, "rank group");
        }
        self.state = state;
        let _ = self.status_tx.send(self.status());
    }

    pub(crate) async fn run(mut self) {
        let mut want_running = true;
        let mut adopted = self.adopt().await;
        loop {
            if !want_running {
                if !matches!(self.state, GroupState::Failed { .. }) {
                    self.set(GroupState::Stopped);
                }
                match self.cmd_rx.recv().await {
                    Some(Command::Start) => {
                        want_running = true;
                        self.backoff.healthy_for(Duration::MAX);
                    }
                    Some(Command::Restart { mode, .. }) => {
                        if let Some(m) = mode {
                            self.switch_plan(m);
                        }
                        want_running = true;
                        self.backoff.healthy_for(Duration::MAX);
                    }
                    Some(Command::Stop) => continue,
                    Some(Command::Shutdown(reply)) => return self.finish(Some(reply)).await,
                    None => return self.finish(None).await,
                }
            }
            let was_adopted = std::mem::take(&mut adopted);
            let started = if was_adopted {
                Ok(())
            } else {
                self.epoch += 1;
                self.set(GroupState::Starting { epoch: self.epoch });
                self.start_group().await
            };
            let ended = match started {
                Ok(()) => {
                    // An adopted group has served already; a fresh one is warmed before admission.
                    if self.warmup && !was_adopted {
                        self.warm_up().await;
                    }
                    if self.config.preparation.drop_page_cache && !was_adopted {
                        crate::container::drop_page_cache(&self.backend).await;
                    }
                    let ready_at = Instant::now();
                    self.set(GroupState::Ready { epoch: self.epoch });
                    let ended = self.watch().await;
                    self.backoff.healthy_for(ready_at.elapsed());
                    ended
                }
                Err(ended) => ended,
            };
            // Leaving: `finish` decides whether the ranks go with the gateway.
            let ended = match ended {
                Ended::Asked(Command::Shutdown(reply)) => return self.finish(Some(reply)).await,
                other => other,
            };
            let noticed = Instant::now();
            // Publish first: the gateway holds new and queued requests before the ranks go down.
            match &ended {
                Ended::Failure(reason) | Ended::Asked(Command::Restart { reason, .. }) => {
                    self.set(GroupState::Restarting {
                        reason: reason.clone(),
                        retry_in_s: 0.0,
                    })
                }
                _ => {}
            }
            self.stop_group().await;
            let detected_in_s = Some(noticed.elapsed().as_secs_f64());
            match ended {
                Ended::Failure(reason) => {
                    tracing::warn!(epoch = self.epoch, %reason, "rank group failed");
                    self.restarts += 1;
                    self.last_restart = Some(LastRestart {
                        reason: reason.clone(),
                        at_unix: now_unix(),
                        detected_in_s,
                    });
                    match self.backoff.failed() {
                        None => {
                            let reason = format!(
                                "gave up after {} failures in a row; last: {reason}",
                                self.backoff.failures() - 1
                            );
                            self.set(GroupState::Failed { reason });
                            want_running = false;
                        }
                        Some(delay) => {
                            self.set(GroupState::Restarting {
                                reason,
                                retry_in_s: delay.as_secs_f64(),
                            });
                            tokio::select! {
                                _ = tokio::time::sleep(delay) => {}
                                cmd = self.cmd_rx.recv() => match cmd {
                                    Some(Command::Stop) => want_running = false,
                                    Some(Command::Shutdown(reply)) => return self.finish(Some(reply)).await,
                                    None => return self.finish(None).await,
                                    Some(_) => {}
                                },
                            }
                        }
                    }
                }
                Ended::Asked(Command::Restart { reason, mode }) => {
                    if let Some(m) = mode {
                        self.switch_plan(m);
                    }
                    self.restarts += 1;
                    self.last_restart = Some(LastRestart {
                        reason: reason.clone(),
                        at_unix: now_unix(),
                        detected_in_s: None,
                    });
                    self.set(GroupState::Restarting {
                        reason,
                        retry_in_s: 0.0,
                    });
                }
                Ended::Asked(Command::Start) => {}
                Ended::Asked(Command::Stop) => want_running = false,
                Ended::Asked(Command::Shutdown(reply)) => return self.finish(Some(reply)).await,
            }
        }
    }

    /// The next start runs `mode`'s plan (the handle checked the profile has it).
    fn switch_plan(&mut self, mode: SpecMethod) {
        if let Some((m, plan, seqs, draft)) = self.plans.iter().find(|(m, ..)| *m == mode) {
            tracing::info!(mode = %m, max_num_seqs = seqs, "switching speculation mode");
            self.plan = plan.clone();
            self.mode = m.to_string();
            self.max_num_seqs = *seqs;
            self.draft_tokens = *draft;
        }
    }

    async fn finish(mut self, reply: Option<oneshot::Sender<()>>) {
        match self.backend {
            // Containers outlive the gateway: the next gateway adopts them, the model stays loaded.
            Backend::Docker { .. } if !self.ranks.is_empty() && !self.stop_on_exit => {
                tracing::info!(
                    epoch = self.epoch,
                    "leaving the rank containers running for the next gateway to adopt"
                );
            }
            _ => {
                self.stop_group().await;
                self.set(GroupState::Stopped);
            }
        }
        if let Some(r) = reply {
            let _ = r.send(());
        }
    }

    /// The boot-shape warm-up before the group is published ready (failures only warn: an
    /// unwarmed shape compiles on first use instead).
    async fn warm_up(&mut self) {
        let started = Instant::now();
        let (sent, failures) = self
            .probe
            .warm_up(self.max_num_seqs, self.draft_tokens, WARMUP_REQUEST_LIMIT)
            .await;
        if failures.is_empty() {
            tracing::info!(
                requests = sent,
                max_num_seqs = self.max_num_seqs,
                seconds = started.elapsed().as_secs_f64(),
                "boot-shape warm-up done"
            );
        } else {
            tracing::warn!(requests = sent, failed = failures.len(), first = %failures[0], "boot-shape warm-up had failures; uncovered shapes may compile mid-serve");
        }
    }

    async fn start_group(&mut self) -> Result<(), Ended> {
        if !self.prepared {
            // Preparation can take long (a download, a ship): operator commands still end it.
            let rank0 = self.plan.ranks.iter().find(|r| r.rank == 0);
            let report = crate::container::StatusReport::new(&self.status_tx);
            let (config, backend, check, logs) = (&self.config, &self.backend, &self.self_check, &self.log_dir);
            let prep = crate::container::prepare_nodes(config, backend, check, rank0, logs, &report);
            tokio::select! {
                r = prep => r.map_err(Ended::Failure)?,
                cmd = self.cmd_rx.recv() => return Err(Ended::Asked(cmd.unwrap_or(Command::Stop))),
            }
            self.prepared = true;
            let _ = self.status_tx.send(self.status());
        }
        let dir = self.log_dir.join(format!("epoch-{}", self.epoch));
        let mut order: Vec<_> = self.plan.ranks.clone();
        order.sort_by_key(|r| std::cmp::Reverse(r.rank));
        for plan in &order {
            let log = dir.join(format!("rank{}.log", plan.rank));
            match self.backend.start(plan, self.epoch, &log, self.events_tx.clone()).await {
                Ok(r) => {
                    tracing::info!(rank = plan.rank, runtime = self.backend.name(), log = %log.display(), "rank started");
                    self.ranks.push(r);
                    let _ = self.status_tx.send(self.status());
                }
                Err(e) => return Err(Ended::Failure(e.to_string())),
            }
        }
        let deadline = Instant::now() + self.ready_timeout;
        let mut wait = Duration::from_millis(100);
        let mut generation_failed = None;
        loop {
            tokio::select! {
                ev = self.events_rx.recv() => {
                    if let Some(Event::RankExited { epoch, rank, status }) = ev {
                        if epoch == self.epoch {
                            let tail = self.ranks.iter().find(|r| r.rank() == rank).map(|r| r.tail(5).join(" | ")).unwrap_or_default();
                            return Err(Ended::Failure(format!("rank {rank} exited during start ({status}); last lines: {tail}")));
                        }
                    }
                }
                cmd = self.cmd_rx.recv() => return Err(Ended::Asked(cmd.unwrap_or(Command::Stop))),
                _ = tokio::time::sleep(wait) => {}
            }
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
                return Err(Ended::Failure(format!(
                    "rank 0 was not ready within READY_TIMEOUT={}s{why}",
                    self.ready_timeout.as_secs()
                )));
            }
            let quiet = self.ranks.iter().find(|r| r.rank() == 0).map_or(0.0, Rank::quiet_for);
            if quiet >= self.hang.as_secs_f64() {
                let dir = diagnostics::collect(
                    &dir,
                    &self.ranks,
                    &format!(
                        "no rank-0 log line for {quiet:.0}s (HANG_SECONDS={})",
                        self.hang.as_secs()
                    ),
                )
                .await;
                return Err(Ended::Failure(format!(
                    "start stalled: no rank-0 log line for {quiet:.0}s (HANG_SECONDS={}); diagnostics in {}",
                    self.hang.as_secs(),
                    dir.display()
                )));
            }
        }
    }

    /// Watches a ready group until a rank exits, rank 0 fails its health checks, it stops making
    /// progress while requests run, or an operator asks for something.
    async fn watch(&mut self) -> Ended {
        let worker = match self.backend.worker() {
            Some(link) => link.node().await.ok(),
            None => None,
        };
        let mut sampler = Sampler::start(self.probe.clone(), self.meminfo.clone(), worker);
        let mut unhealthy = 0;
        let mut last_generated = None;
        let mut progress_at = Instant::now();
        let mut low_memory = 0;
        loop {
            tokio::select! {
                ev = self.events_rx.recv() => {
                    if let Some(Event::RankExited { epoch, rank, status }) = ev {
                        if epoch == self.epoch {
                            return Ended::Failure(format!("rank {rank} exited ({status})"));
                        }
                    }
                }
                cmd = self.cmd_rx.recv() => return Ended::Asked(cmd.unwrap_or(Command::Stop)),
                Some(sample) = sampler.samples.recv() => {
                    self.memory = sample.memory;
                    let _ = self.status_tx.send(self.status());
                    // Memguard: two samples in a row under the threshold on a node stop the group
                    // before the kernel's OOM killer picks something worse.
                    if let Some((threshold, _)) = &self.mem_guard {
                        let low = self.memory.iter().find(|m| m.mem_available_gib.is_some_and(|a| a < *threshold));
                        match low {
                            Some(m) => {
                                low_memory += 1;
                                if low_memory >= 2 {
                                    return Ended::Failure(format!(
                                        "memguard: MemAvailable {:.2} GiB < MEM_GUARD_GIB {threshold} on {} in two consecutive samples",
                                        m.mem_available_gib.unwrap_or(0.0),
                                        m.node
                                    ));
                                }
                            }
                            None => low_memory = 0,
                        }
                    }
                    if sample.healthy {
                        unhealthy = 0;
                    } else {
                        unhealthy += 1;
                        if unhealthy >= 3 {
                            return Ended::Failure("rank 0 failed 3 health checks in a row".into());
                        }
                    }
                    if let Some(p) = sample.progress {
                        if p.running == 0.0 || last_generated != Some(p.generated) {
                            last_generated = Some(p.generated);
                            progress_at = Instant::now();
                        } else if progress_at.elapsed() >= self.progress_timeout {
                            return Ended::Failure(format!(
                                "no token generated for {:.0}s while {} requests ran (PROGRESS_TIMEOUT)",
                                progress_at.elapsed().as_secs_f64(),
                                p.running
                            ));
                        }
                    }
                }
            }
        }
    }

    /// Kills every rank of the current epoch and waits until they are gone.
    async fn stop_group(&mut self) {
        for r in &mut self.ranks {
            r.stop().await;
        }
        self.ranks.clear();
    }

    /// Docker: containers of this group left by an earlier gateway are adopted when they are
    /// all there, running, of this configuration (config hash) and rank 0 is ready — the model
    /// stays loaded. Anything else is removed (saying why) and the group starts fresh.
    async fn adopt(&mut self) -> bool {
        if !matches!(self.backend, Backend::Docker { .. }) {
            return false;
        }
        // Each rank's container is looked for on the node that runs that rank.
        let mut found = Vec::new();
        for plan in &self.plan.ranks {
            let node = match self.backend.node_for(plan.rank).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reach a node to look for running ranks");
                    return false;
                }
            };
            match node
                .list(&[(labels::GROUP, &self.group), (labels::RANK, &plan.rank.to_string())])
                .await
            {
                Ok(list) => found.extend(list.into_iter().map(|c| (plan.rank, node.clone(), c))),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list existing rank containers");
                    return false;
                }
            }
        }
        if found.is_empty() {
            return false;
        }
        let epoch = found
            .iter()
            .filter_map(|(_, _, c)| c.labels.get(labels::EPOCH)?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        // A group an operator (or the policy) switched to another mode is that mode's plan.
        let running_hash = found
            .iter()
            .find(|(r, _, c)| *r == 0 && c.labels.get(labels::EPOCH) == Some(&epoch.to_string()))
            .and_then(|(_, _, c)| c.labels.get(labels::CONFIG_HASH).cloned());
        if let Some(mode) = self
            .plans
            .iter()
            .find(|(_, p, ..)| Some(&p.config_hash) == running_hash.as_ref())
            .map(|(m, ..)| *m)
        {
            self.switch_plan(mode);
        }
        let of_plan = |rank: u32| {
            found.iter().find(|(r, _, c)| {
                *r == rank
                    && c.labels.get(labels::EPOCH) == Some(&epoch.to_string())
                    && c.labels.get(labels::CONFIG_HASH) == Some(&self.plan.config_hash)
                    && c.running
            })
        };
        let complete = self.plan.ranks.iter().all(|r| of_plan(r.rank).is_some());
        let why_not = if !complete {
            Some(format!(
                "found {} container(s) of group {} that are not a running epoch of this configuration (config hash {})",
                found.len(),
                self.group,
                self.plan.config_hash
            ))
        } else if !self.probe.ready().await {
            Some("rank 0 of the running group is not ready".to_owned())
        } else {
            None
        };
        if let Some(reason) = why_not {
            tracing::warn!(%reason, "not adopting: removing the old containers and starting fresh");
            for (_, node, c) in &found {
                let _ = node.kill_and_remove(&c.id).await;
            }
            self.epoch = epoch;
            return false;
        }
        self.epoch = epoch;
        let dir = self.log_dir.join(format!("epoch-{epoch}"));
        for plan in &self.plan.ranks {
            let (_, node, c) = of_plan(plan.rank).expect("checked complete");
            let log = dir.join(format!("rank{}.log", plan.rank));
            match RankContainer::start(node, plan, epoch, &log, self.events_tx.clone(), Some(c.id.clone())).await {
                Ok(r) => self.ranks.push(Rank::Container(r)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot attach to a running rank; starting fresh");
                    self.stop_group().await;
                    return false;
                }
            }
        }
        tracing::info!(epoch, "adopted the running rank group (no reload)");
        true
    }
}
