//! The supervisor actor: the one task that owns the rank group. Everything that happens —
//! operator commands, rank exits, the start's and preparation's outcomes, watchdog verdicts,
//! timers — becomes one `machine::Event`; the state machine decides, and the actor only
//! carries out the `Action`s it returns (spawn, stop, watch, wait, publish).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparkgate_config::Config;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::diagnostics::NodeAt;
use crate::exits::RankExit;
use crate::machine::{Action, Answer, Command, Event, Failure, Machine, Origin};
use crate::rank::{Backend, Rank, Reporting};
use crate::start::{Ranks, StartError, Starter};
use crate::status::{unix_now, GroupState, LogsPruned, NodeMemory, RestartCount, RestartReason, Status};
use crate::watchdog::Limits;
use crate::watching::{watch_next, Observed, Watching};

/// A command and where its answer goes.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) command: Command,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// What the actor's own tasks report.
#[derive(Debug)]
enum Report {
    /// A rank was spawned: publish it.
    Spawned,
    /// Rank 0's `/version`, read once it is ready (before the start's outcome, so the group is
    /// published ready with it).
    Version(sparkgate_config::UpstreamVersion),
    Event(Event),
}

/// What the actor needs besides the machine and the starter.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) config: Arc<Config>,
    /// The group's name, as events and the gateway name it.
    pub(crate) group: String,
    /// The gateway's report of its requests in flight (for diagnostics), once it is set.
    pub(crate) in_flight: crate::diagnostics::InFlightSlot,
    pub(crate) self_check: Vec<String>,
    pub(crate) meminfo: PathBuf,
    pub(crate) begin: crate::Begin,
    /// Set once the group has begun (adopted, cleared or started).
    pub(crate) begun: watch::Sender<bool>,
    pub(crate) limits: Limits,
    /// Liveness pings (systemd's watchdog): each is answered from the actor's own loop.
    pub(crate) pings: mpsc::Receiver<oneshot::Sender<()>>,
}

#[derive(Debug)]
pub(crate) struct Actor {
    machine: Machine,
    starter: Arc<Starter>,
    setup: Setup,
    ranks: Ranks,
    requests: mpsc::Receiver<Request>,
    reports_tx: mpsc::UnboundedSender<Report>,
    reports: mpsc::UnboundedReceiver<Report>,
    exits_tx: mpsc::UnboundedSender<RankExit>,
    exits: mpsc::UnboundedReceiver<RankExit>,
    status_tx: watch::Sender<Status>,
    /// What the watch last saw (memory, stall, GPUs, kernel lines).
    observed: Observed,
    vllm: Option<sparkgate_config::UpstreamVersion>,
    watching: Option<Watching>,
    starting: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    preparing: Option<JoinHandle<()>>,
    /// Shutdown callers, answered when the supervisor ends.
    waiters: Vec<oneshot::Sender<Answer>>,
    /// When the published state last changed (seconds since the epoch).
    state_since: std::cell::Cell<f64>,
    /// The last diagnostics bundle written: its epoch and directory.
    bundle: Option<(u64, PathBuf)>,
}

impl Actor {
    pub(crate) fn new(
        machine: Machine,
        starter: Starter,
        setup: Setup,
        requests: mpsc::Receiver<Request>,
        status_tx: watch::Sender<Status>,
    ) -> Self {
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let (exits_tx, exits) = mpsc::unbounded_channel();
        Self {
            machine,
            starter: Arc::new(starter),
            setup,
            ranks: Ranks::default(),
            requests,
            reports_tx,
            reports,
            exits_tx,
            exits,
            status_tx,
            observed: Observed::default(),
            vllm: None,
            watching: None,
            starting: None,
            preparing: None,
            waiters: Vec::new(),
            state_since: std::cell::Cell::new(unix_now()),
            bundle: None,
        }
    }

    pub(crate) fn status(&self) -> Status {
        let mode = self.starter.mode(self.machine.mode);
        let preparing = matches!(self.machine.phase, crate::machine::Phase::Preparing { .. })
            .then(|| self.status_tx.borrow().preparing.clone())
            .flatten();
        Status {
            state: self.machine.group_state(),
            epoch: self.machine.epoch,
            mode: mode.mode,
            max_num_seqs: mode.max_num_seqs,
            runtime: self.starter.backend.runtime(),
            ranks: self
                .ranks
                .lock()
                .expect("ranks lock")
                .iter()
                .map(Rank::status)
                .collect(),
            restarts: self.machine.restarts,
            last_restart: self.machine.last_restart.clone().map(|mut l| {
                l.diagnostics = self
                    .bundle
                    .as_ref()
                    .filter(|(epoch, _)| l.cause.is_some() && *epoch == l.epoch)
                    .map(|(_, dir)| dir.display().to_string());
                l
            }),
            memory: self.observed.memory.clone(),
            headroom_gib: self.watching.as_ref().and(NodeMemory::headroom_gib(
                &self.observed.memory,
                self.setup.config.supervision.mem_guard_gib,
            )),
            gpus: self.observed.gpus.clone(),
            kernel_events: self.observed.kernel.iter().cloned().collect(),
            preparing,
            stalled_s: self.watching.as_ref().and(self.observed.stalled_s),
            vllm: self.vllm.clone(),
            logs_pruned: {
                let (epochs, bytes) = *self.starter.pruned.lock().expect("pruned");
                LogsPruned { epochs, bytes }
            },
            restart_counts: self
                .machine
                .restart_counts
                .iter()
                .map(|(reason, count)| RestartCount {
                    reason: *reason,
                    planned: reason.planned(),
                    count: *count,
                })
                .collect(),
            state_since_unix: self.state_since.get(),
        }
    }

    fn publish(&self) {
        let mut status = self.status();
        if self.status_tx.borrow().state != status.state {
            self.state_event(&status).emit();
            self.state_since.set(unix_now());
            status.state_since_unix = self.state_since.get();
        }
        let _ = self.status_tx.send(status);
    }

    /// The event a change of the published state is: the group failed (ERROR), or a state
    /// change (INFO; a loss is logged at its diagnosis).
    fn state_event(&self, status: &Status) -> sparkgate_events::Event {
        let group = self.setup.group.clone();
        let state = match &status.state {
            GroupState::Failed { reason } => {
                return sparkgate_events::Event::GroupFailed {
                    group,
                    reason: reason.clone(),
                }
            }
            GroupState::Restarting { reason, .. } => format!("restarting: {reason}"),
            GroupState::Backoff { reason, retry_in_s } => format!("backing off {retry_in_s:.1} s after: {reason}"),
            other => other.name().to_owned(),
        };
        sparkgate_events::Event::StateChanged {
            group,
            state,
            epoch: status.epoch,
            mode: status.mode.to_string(),
        }
    }

    /// Writes `epoch`'s diagnostics bundle while its ranks are still there, then logs the loss
    /// naming it: the one WARN line of an unplanned restart.
    async fn diagnose(&mut self, epoch: u64, failure: &Failure) {
        let reason = RestartReason::of_cause(failure.cause).label();
        let mut nodes = vec![NodeAt::Head {
            meminfo: self.setup.meminfo.clone(),
        }];
        nodes.extend(self.starter.backend.workers().iter().cloned().map(NodeAt::Worker));
        let inputs = crate::diagnostics::Inputs {
            reason: &failure.reason,
            cause: reason,
            epoch,
            ranks: &self.ranks,
            trail: self.watching.as_ref().filter(|w| w.epoch == epoch).map(|w| &w.trail),
            in_flight: self.setup.in_flight.get(),
            nodes,
        };
        let dir = crate::diagnostics::collect(&self.starter.epoch_dir(epoch), inputs).await;
        sparkgate_events::Event::GroupLost {
            group: self.setup.group.clone(),
            epoch,
            reason: reason.to_owned(),
            detail: failure.reason.clone(),
            diagnostics: Some(dir.display().to_string()),
        }
        .emit();
        self.bundle = Some((epoch, dir));
    }

    /// The loop: one event at a time through the machine, then its actions.
    pub(crate) async fn run(mut self) {
        let origin = match self.setup.begin {
            crate::Begin::Start => self.adopt().await,
            crate::Begin::Adopt => match self.adopt().await {
                Origin::Fresh { prepared } => Origin::Standby { prepared },
                adopted => adopted,
            },
            crate::Begin::Standby => self.standby().await,
        };
        let mut actions: VecDeque<Action> = self.machine.begin(origin, Instant::now()).into();
        // Published first: whoever waits for the beginning reads its state.
        let exit = self.execute(&mut actions).await;
        let _ = self.setup.begun.send(true);
        if exit {
            return;
        }
        let mut requests_open = true;
        loop {
            if self.execute(&mut actions).await {
                return;
            }
            let (event, reply) = tokio::select! {
                req = self.requests.recv(), if requests_open => match req {
                    Some(r) => (Event::Asked(r.command), Some(r.reply)),
                    // Every handle is gone: nobody can ask for anything again.
                    None => {
                        requests_open = false;
                        (Event::Asked(Command::Shutdown), None)
                    }
                },
                Some(pong) = self.setup.pings.recv() => {
                    frozen_for_a_test().await;
                    let _ = pong.send(());
                    continue;
                }
                Some(report) = self.reports.recv() => match report {
                    Report::Spawned => {
                        self.record();
                        self.publish();
                        continue;
                    }
                    Report::Version(v) => {
                        if let Some(w) = v.warning() {
                            tracing::warn!("{w}");
                        }
                        tracing::info!(vllm = %v.reported, rules = %v.rules, "rank 0's vLLM release");
                        self.vllm = Some(v);
                        continue;
                    }
                    Report::Event(e) => (e, None),
                },
                Some(exit) = self.exits.recv() => {
                    let exit = self.deciding(exit).await;
                    (self.exit_event(exit), None)
                }
                Some(event) = watch_next(&mut self.watching, &mut self.observed, &self.setup.group) => {
                    self.publish();
                    match event {
                        Some(e) => (e, None),
                        None => continue,
                    }
                }
            };
            let shutdown = matches!(event, Event::Asked(Command::Shutdown));
            let (answer, next) = self.machine.step(event, Instant::now());
            match (reply, answer) {
                (Some(reply), Some(Answer::Accepted)) if shutdown => self.waiters.push(reply),
                (Some(reply), Some(answer)) => {
                    let _ = reply.send(answer);
                }
                _ => {}
            }
            actions.extend(next);
        }
    }
}

/// A test hook: while the file SPARKGATE_TEST_FREEZE_FILE names exists, a ping stops the actor
/// for good, as a wedged actor would stop (the watchdog tests; unset, this is one env lookup).
async fn frozen_for_a_test() {
    if let Some(file) = std::env::var_os("SPARKGATE_TEST_FREEZE_FILE") {
        if std::path::Path::new(&file).exists() {
            tracing::warn!("SPARKGATE_TEST_FREEZE_FILE exists: the supervisor's actor stops here (a test hook)");
            std::future::pending::<()>().await;
        }
    }
}

impl Actor {
    /// The exit that tells why the group was lost (`exits::telling`): an exit that looks like a
    /// crash, from a serving group, waits up to `exits::DECIDING` for the rest of its epoch's ranks. Another epoch's
    /// exit met meanwhile goes back to the queue.
    async fn deciding(&mut self, first: RankExit) -> RankExit {
        // Only a serving group's loss is judged against the requests it held.
        let serving = matches!(self.machine.phase, crate::machine::Phase::Ready { .. });
        if !serving || first.kind.cause() != crate::status::LossCause::Crashed {
            return first;
        }
        let ranks = self.ranks.lock().expect("ranks lock").len();
        let deadline = tokio::time::Instant::now() + crate::exits::DECIDING;
        let mut seen = vec![first];
        while seen.len() < ranks {
            match tokio::time::timeout_at(deadline, self.exits.recv()).await {
                Ok(Some(exit)) if exit.epoch == seen[0].epoch => seen.push(exit),
                Ok(Some(other)) => {
                    let _ = self.exits_tx.send(other);
                }
                _ => break,
            }
        }
        let at = crate::exits::telling(&seen);
        seen.swap_remove(at)
    }

    /// A rank's exit, with its last lines.
    fn exit_event(&self, exit: RankExit) -> Event {
        let tail = self
            .ranks
            .lock()
            .expect("ranks lock")
            .iter()
            .find(|r| r.rank() == exit.rank)
            .map(|r| r.tail(5).join(" | "))
            .unwrap_or_default();
        let during = if matches!(self.machine.phase, crate::machine::Phase::Starting { .. }) {
            " during start"
        } else {
            ""
        };
        Event::RankExited {
            epoch: exit.epoch,
            reason: format!(
                "rank {} exited{during} ({}); last lines: {tail}",
                exit.rank, exit.status
            ),
            cause: exit.kind.cause(),
        }
    }

    /// Carries out `actions` in order (a stop's `Down` is stepped at once and its actions
    /// follow); true when the supervisor ends.
    async fn execute(&mut self, actions: &mut VecDeque<Action>) -> bool {
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Publish => self.publish(),
                Action::Prepare => self.prepare(),
                Action::CancelPrepare => {
                    if let Some(t) = self.preparing.take() {
                        t.abort();
                    }
                }
                Action::Start { epoch, mode } => self.start(epoch, mode),
                Action::Watch { epoch } => self.watch(epoch).await,
                Action::Diagnose { epoch, failure } => self.diagnose(epoch, &failure).await,
                Action::Stop { epoch } => {
                    self.stop_group().await;
                    actions.extend(self.machine.step(Event::Down { epoch }, Instant::now()).1);
                }
                Action::Release { epoch } => {
                    sparkgate_events::Event::Released { epoch }.emit();
                    self.watching = None;
                }
                Action::Wait { epoch, delay } => {
                    let tx = self.reports_tx.clone();
                    sparkgate_task::spawn("backoff-wait", async move {
                        tokio::time::sleep(delay).await;
                        let _ = tx.send(Report::Event(Event::RetryDue { epoch }));
                    });
                }
                Action::Exit => {
                    for w in self.waiters.drain(..) {
                        let _ = w.send(Answer::Accepted);
                    }
                    return true;
                }
            }
        }
        false
    }

    /// Node preparation in its own task (it can take long: a download, a ship).
    fn prepare(&mut self) {
        let (config, backend) = (self.setup.config.clone(), self.starter.backend.clone());
        let check = self.setup.self_check.clone();
        let (logs, tx, status) = (
            self.starter.log_dir.clone(),
            self.reports_tx.clone(),
            self.status_tx.clone(),
        );
        let rank0 = self
            .starter
            .mode(self.machine.next_mode())
            .plan
            .ranks
            .iter()
            .find(|r| r.rank == 0)
            .cloned();
        self.preparing = Some(sparkgate_task::spawn("preparation", async move {
            let report = crate::nodes::StatusReport::new(&status);
            let done = crate::nodes::prepare_nodes(&config, &backend, &check, rank0.as_ref(), &logs, &report).await;
            let _ = tx.send(Report::Event(Event::Prepared(done)));
        }));
    }

    fn start(&mut self, epoch: u64, mode: sparkgate_config::SpecMethod) {
        let (cancel, cancelled) = watch::channel(false);
        let (starter, ranks, exits, tx) = (
            self.starter.clone(),
            self.ranks.clone(),
            self.exits_tx.clone(),
            self.reports_tx.clone(),
        );
        let task = sparkgate_task::spawn("start", async move {
            let spawned = || {
                let _ = tx.send(Report::Spawned);
            };
            let outcome = match starter.run(epoch, mode, ranks.clone(), exits, spawned, cancelled).await {
                Ok(()) => {
                    if let Some(v) = starter.probe.version().await {
                        let _ = tx.send(Report::Version(v));
                    }
                    Ok(())
                }
                Err(StartError::Cancelled) => return,
                Err(StartError::Failed(why)) => Err(why),
                // Its diagnostics are the failure's (`Action::Diagnose`), the ranks still there.
                Err(StartError::Stalled(why)) => Err(format!("start stalled: {why}")),
            };
            let _ = tx.send(Report::Event(Event::Up { epoch, outcome }));
        });
        self.starting = Some((cancel, task));
    }

    async fn watch(&mut self, epoch: u64) {
        let (supervision, limits) = (&self.setup.config.supervision, &self.setup.limits);
        let watching = Watching::start(epoch, supervision, limits, &self.starter, &mut self.observed).await;
        self.watching = Some(watching);
    }

    /// Cancels a start under way, then kills every rank it made, as whole process trees.
    async fn stop_group(&mut self) {
        self.watching = None;
        if let Some((cancel, task)) = self.starting.take() {
            let _ = cancel.send(true);
            let mut task = task;
            if tokio::time::timeout(Duration::from_secs(120), &mut task).await.is_err() {
                tracing::error!("the start did not end within 120 s of its cancel; aborting it");
                task.abort();
            }
        }
        let ranks = std::mem::take(&mut *self.ranks.lock().expect("ranks lock"));
        for mut r in ranks {
            r.stop().await;
        }
        self.record();
        self.publish();
    }

    /// RUNTIME=process: the local rank processes now running, for the next gateway to remove
    /// should this one die without taking them along (`leftovers.rs`).
    fn record(&self) {
        if !matches!(*self.starter.backend, Backend::Process { .. }) {
            return;
        }
        let ranks = self
            .ranks
            .lock()
            .expect("ranks lock")
            .iter()
            .filter_map(|r| {
                let pid = r.local_pid()?;
                let started = crate::leftovers::start_time(pid)?;
                Some(crate::leftovers::Recorded {
                    rank: r.rank(),
                    pid,
                    started,
                })
            })
            .collect();
        let state = crate::leftovers::State {
            epoch: self.machine.epoch,
            config_hash: self.starter.mode(self.machine.mode).plan.config_hash.clone(),
            vllm_port: self.setup.config.ports.vllm,
            ranks,
        };
        crate::leftovers::write(&self.starter.log_dir, &state);
    }

    /// A standby group stays stopped; containers an earlier gateway left of it are removed (the
    /// model loaded at start is another).
    async fn standby(&mut self) -> Origin {
        let docker = matches!(*self.starter.backend, Backend::Docker { .. });
        if docker {
            if let Some(epoch) = crate::adopt::clear(&self.starter, &self.setup.config.group_name()).await {
                self.machine.epoch = epoch;
            }
        }
        Origin::Standby { prepared: !docker }
    }

    /// Docker: containers of this group left by an earlier gateway are adopted when they are
    /// all there, running, of this configuration (config hash) and rank 0 is ready — the model
    /// stays loaded. Anything else is removed (saying why) and the group starts fresh.
    async fn adopt(&mut self) -> Origin {
        let fresh = Origin::Fresh {
            prepared: !matches!(*self.starter.backend, Backend::Docker { .. }),
        };
        if !matches!(*self.starter.backend, Backend::Docker { .. }) {
            return fresh;
        }
        match crate::adopt::find(&self.starter, &self.setup.config.group_name()).await {
            crate::adopt::Found::Nothing => fresh,
            crate::adopt::Found::Stale { epoch } => {
                self.machine.epoch = epoch;
                fresh
            }
            crate::adopt::Found::Running {
                epoch,
                mode,
                containers,
            } => {
                self.machine.mode = mode;
                let dir = self.starter.epoch_dir(epoch);
                for (plan, node, id) in containers {
                    let log = dir.join(format!("rank{}.log", plan.rank));
                    let to = Reporting {
                        epoch,
                        log: &log,
                        exits: self.exits_tx.clone(),
                    };
                    match Rank::start_container(&node, &plan, to, Some(id)).await {
                        Ok(r) => self.ranks.lock().expect("ranks lock").push(r),
                        Err(e) => {
                            sparkgate_events::Event::NotAdopted {
                                reason: format!("cannot attach to a running rank: {e}"),
                            }
                            .emit();
                            self.stop_group().await;
                            self.machine.epoch = epoch;
                            return fresh;
                        }
                    }
                }
                sparkgate_events::Event::Adopted { epoch }.emit();
                self.vllm = self.starter.probe.version().await;
                Origin::Adopted { epoch }
            }
        }
    }
}
