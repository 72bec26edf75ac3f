//! Swapping models (MODELS): the runner of the swap machine (`machine.rs`). One task ticks every
//! 100 ms with what admission and the groups' supervisors show, steps the machine, and carries
//! out its actions — admission's loaded models, a group's drain, a supervisor's stop and start,
//! a reading of the nodes' memory, refusals, events and metrics. Operators ask through
//! `Swapper::ask` (`POST /admin/model`); `/admin/status` reads `Swapper::status_json`.

mod machine;

pub(crate) use machine::{Answer, Trigger};

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_config::{GroupConfig, SwapPolicy};
use sparkgate_events::Event as Logged;
use sparkgate_supervisor::{Answer as SupAnswer, GroupState, NodeMemory, SupervisorHandle};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use machine::{Action, Event, GroupIs, Machine, Phase, Seen, Settings, Swap};

use super::Groups;
use crate::api::models::ModelId;
use crate::control::state::GatewayControl;
use crate::observe;

/// How often the runner looks.
const TICK: Duration = Duration::from_millis(100);
/// No model (`Swapper::loaded`).
const NONE: u8 = u8::MAX;

/// The swap runner's handle: operators' asks, and what the request path reads.
#[derive(Debug)]
pub(crate) struct Swapper {
    asks: mpsc::Sender<(ModelId, oneshot::Sender<Answer>)>,
    /// The model loaded now (`NONE`: none, or a swap runs).
    loaded: AtomicU8,
    /// The model a swap under way loads (`NONE`: none).
    target: AtomicU8,
    pub(crate) policy: SwapPolicy,
    /// The machine's phase for `/admin/status`.
    shown: Mutex<Value>,
}

fn read(a: &AtomicU8) -> Option<ModelId> {
    Some(a.load(Ordering::Relaxed)).filter(|v| *v != NONE).map(ModelId)
}

impl Swapper {
    /// The model loaded now.
    pub(crate) fn loaded(&self) -> Option<ModelId> {
        read(&self.loaded)
    }

    /// The model a swap under way loads.
    pub(crate) fn target(&self) -> Option<ModelId> {
        read(&self.target)
    }

    /// An operator asks for `model`.
    pub(crate) async fn ask(&self, model: ModelId) -> Option<Answer> {
        let (tx, rx) = oneshot::channel();
        self.asks.send((model, tx)).await.ok()?;
        rx.await.ok()
    }

    pub(crate) fn status_json(&self) -> Value {
        self.shown.lock().expect("swap status").clone()
    }
}

/// Starts the runner over `groups` (one per model, in MODELS order, the default first).
pub(crate) fn start(control: GatewayControl, groups: Arc<Groups>, models: &[GroupConfig]) -> Arc<Swapper> {
    let swap = &models[0].config.gateway.swap;
    let settings = Settings {
        policy: swap.policy,
        drain: swap.drain,
        dwell: swap.min_dwell,
        idle_unload: swap.idle_unload,
        margin_gib: swap.memory_margin_gib,
        release_timeout: swap.release_timeout,
        needs: models
            .iter()
            .map(|m| {
                let s = &m.config.supervision;
                Some(s.weights_gib_per_rank? + s.boot_margin_gib?)
            })
            .collect(),
        names: models
            .iter()
            .map(|m| m.config.serving.served_model_name.clone())
            .collect(),
    };
    let (asks, rx) = mpsc::channel(8);
    let swapper = Arc::new(Swapper {
        asks,
        loaded: AtomicU8::new(NONE),
        target: AtomicU8::new(0),
        policy: swap.policy,
        shown: Mutex::new(json!({"phase": "starting"})),
    });
    let runner = Runner {
        control,
        groups,
        swapper: swapper.clone(),
        names: settings.names.clone(),
        memory: mpsc::channel(4),
    };
    sparkgate_task::spawn("model-swap", runner.run(settings, rx));
    swapper
}

struct Runner {
    control: GatewayControl,
    groups: Arc<Groups>,
    swapper: Arc<Swapper>,
    names: Vec<String>,
    memory: (mpsc::Sender<Vec<NodeMemory>>, mpsc::Receiver<Vec<NodeMemory>>),
}

impl Runner {
    fn supervisor(&self, m: ModelId) -> &SupervisorHandle {
        self.groups.all()[m.index()]
            .supervisor
            .as_ref()
            .expect("a model's group is supervised")
    }

    fn group_is(&self, m: ModelId) -> GroupIs {
        match self.supervisor(m).status().state {
            GroupState::Ready { .. } => GroupIs::Ready,
            GroupState::Stopped => GroupIs::Stopped,
            GroupState::Backoff { reason, .. } => GroupIs::Backoff(reason),
            GroupState::Failed { reason } => GroupIs::Failed(reason),
            _ => GroupIs::Busy,
        }
    }

    async fn run(mut self, settings: Settings, mut asks: mpsc::Receiver<(ModelId, oneshot::Sender<Answer>)>) {
        // Every supervisor has looked for what an earlier gateway left (removed, or adopted).
        for g in self.groups.all() {
            if let Some(s) = &g.supervisor {
                s.begun().await;
            }
        }
        let ready = self.group_is(ModelId(0)) == GroupIs::Ready;
        let (mut machine, actions) = Machine::new(settings, ModelId(0), ready, Instant::now());
        self.carry_out(actions).await;
        self.publish(&machine);
        let mut tick = tokio::time::interval(TICK);
        loop {
            let (actions, reply) = tokio::select! {
                _ = tick.tick() => {
                    let waiting = self.control.admission().waiting();
                    let groups: Vec<GroupIs> = ModelId::all(self.names.len()).map(|m| self.group_is(m)).collect();
                    let seen = Seen { now: Instant::now(), waiting: &waiting, running: self.control.snapshot().in_use, groups: &groups };
                    (machine.step(Event::Tick(seen)).1, None)
                }
                Some((model, reply)) = asks.recv() => {
                    let (answer, actions) = machine.step(Event::Asked(model, Instant::now()));
                    (actions, Some((reply, answer.expect("an ask is answered"))))
                }
                Some(nodes) = self.memory.1.recv() => (machine.step(Event::Memory(nodes, Instant::now())).1, None),
            };
            if !actions.is_empty() {
                self.carry_out(actions).await;
                self.publish(&machine);
            }
            // Answered once the swap it began shows: whoever waits on it reads its phase.
            if let Some((reply, answer)) = reply {
                let _ = reply.send(answer);
            }
        }
    }

    async fn carry_out(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Load(mask) => self.load(mask),
                Action::Drain(m, on) => {
                    self.groups.all()[m.index()].set_drained(on);
                    super::apply(&self.control, &self.groups);
                }
                Action::Stop(m) => {
                    let sup = self.supervisor(m);
                    if sup.stop().await == SupAnswer::Accepted {
                        settle(sup, |s| !matches!(s, GroupState::Ready { .. })).await;
                    }
                }
                Action::Start(m) => {
                    let sup = self.supervisor(m);
                    if sup.start().await == SupAnswer::Accepted {
                        settle(sup, |s| *s != GroupState::Stopped).await;
                    }
                }
                Action::ReadMemory => {
                    let (sup, tx) = (self.supervisor(ModelId(0)).clone(), self.memory.0.clone());
                    sparkgate_task::spawn("swap-memory", async move {
                        let _ = tx.send(sup.node_memory().await).await;
                    });
                }
                Action::Refuse(m, why) => {
                    let n = self.control.admission().refuse(m, &self.names[m.index()], &why);
                    tracing::info!(model = %self.names[m.index()], refused = n, "waiting requests answered 503: {why}");
                }
                Action::Note(note) => {
                    *self.groups.note.write().expect("swap note") = note;
                    super::apply(&self.control, &self.groups);
                }
                other => self.tell(other),
            }
        }
    }

    fn load(&self, mask: u8) {
        self.control.admission().load(mask);
        let loaded = (0..self.names.len() as u8)
            .find(|i| mask & (1 << i) != 0)
            .unwrap_or(NONE);
        self.swapper.loaded.store(loaded, Ordering::Relaxed);
        for (i, name) in self.names.iter().enumerate() {
            metrics::gauge!(observe::MODEL_LOADED, "model" => name.clone()).set(f64::from(u8::from(loaded == i as u8)));
        }
    }

    fn name(&self, m: Option<ModelId>) -> String {
        m.map_or_else(|| "none".to_owned(), |m| self.names[m.index()].clone())
    }

    /// Events and metrics.
    fn tell(&self, action: Action) {
        match action {
            Action::Began(s) => Logged::SwapStarted {
                from: self.name(s.from),
                to: self.name(s.to),
                trigger: s.trigger.label().to_owned(),
            }
            .emit(),
            Action::Done(s, took) => {
                self.count(&s);
                metrics::histogram!(observe::MODEL_SWAP_SECONDS).record(took.as_secs_f64());
                Logged::Swapped {
                    from: self.name(s.from),
                    to: self.name(s.to),
                    trigger: s.trigger.label().to_owned(),
                    seconds: took.as_secs_f64(),
                }
                .emit();
            }
            Action::Failed(s, reason) => {
                metrics::counter!(observe::MODEL_SWAP_FAILURES, "to" => self.name(s.to)).increment(1);
                Logged::SwapFailed {
                    from: self.name(s.from),
                    to: self.name(s.to),
                    reason,
                }
                .emit();
            }
            Action::Unloaded(m, idle) => {
                self.count(&Swap {
                    from: Some(m),
                    to: None,
                    trigger: Trigger::Idle,
                    began: Instant::now(),
                });
                Logged::ModelUnloaded {
                    model: self.name(Some(m)),
                    idle_s: idle.as_secs(),
                }
                .emit();
            }
            _ => unreachable!("carried out, not told"),
        }
    }

    fn count(&self, s: &Swap) {
        metrics::counter!(observe::MODEL_SWAPS, "from" => self.name(s.from), "to" => self.name(s.to), "trigger" => s.trigger.label())
            .increment(1);
    }

    /// What the request path and `/admin/status` read of the machine.
    fn publish(&self, m: &Machine) {
        let target = m.target().map_or(NONE, |t| t.0);
        self.swapper.target.store(target, Ordering::Relaxed);
        let (phase, since) = match &m.phase {
            Phase::Loading { swap } => ("loading", Some(swap)),
            Phase::Serving { .. } => ("serving", None),
            Phase::Draining { swap, .. } => ("draining", Some(swap)),
            Phase::Unloading { swap } => ("unloading", Some(swap)),
            Phase::Releasing { swap, .. } => ("releasing", Some(swap)),
            Phase::Idle { .. } => ("idle", None),
            Phase::Halted { .. } => ("halted", None),
        };
        let swap = since.map(|s| {
            json!({"from": self.name(s.from), "to": self.name(s.to), "trigger": s.trigger.label(),
                   "elapsed_s": (s.began.elapsed().as_secs_f64() * 10.0).round() / 10.0})
        });
        *self.swapper.shown.lock().expect("swap status") = json!({
            "phase": phase,
            "loaded": m.loaded().map(|l| self.names[l.index()].clone()),
            "swap": swap,
            "policy": self.swapper.policy,
        });
    }
}

/// Waits (up to 5 s) until `sup`'s published state passes `done`: its answer comes before the
/// state it leads to is published, and the next tick must not read the old one.
async fn settle(sup: &SupervisorHandle, done: impl Fn(&GroupState) -> bool) {
    let mut rx = sup.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| done(&s.state))).await;
}
