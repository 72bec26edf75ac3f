//! The swap between models (MODELS) as one pure state machine: a `Phase`, one `Event` enum —
//! a tick with what the gateway sees (requests running and waiting per model, each model's
//! group state), an operator's ask, a reading of the nodes' memory — and one `step` that says
//! what to do as `Action`s, carried out by the runner (`swap/mod.rs`). No clock and no I/O of
//! its own (the caller passes `now`), so every transition is unit-tested in virtual time.
//!
//! A swap: the loaded model drains (its admitted requests finish, up to SWAP_DRAIN_S), its ranks
//! stop, the nodes' memory is confirmed back within SWAP_MEMORY_MARGIN_GIB of what it was before
//! that model loaded, the other model's ranks start, and its waiters are granted in queue order.
//! It begins when another model has waiters and the loaded one has held SWAP_MIN_DWELL_S while it
//! has work (at once when it has none), and never within SWAP_MIN_DWELL_S of the last swap's start.

use std::time::Duration;

use tokio::time::Instant;

use sparkgate_config::SwapPolicy;
use sparkgate_supervisor::NodeMemory;

use crate::api::models::ModelId;
use crate::control::admission::ModelWaiting;

/// What starts a swap (`sparkgate_model_swaps_total{trigger}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The gateway's start loads the default model.
    Start,
    /// Requests wait for a model that is not loaded.
    Demand,
    /// `sparkgate model NAME` / `POST /admin/model`.
    Operator,
    /// IDLE_UNLOAD_S without work.
    Idle,
    /// A swap failed: the model it left is loaded again.
    Revert,
}

impl Trigger {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Demand => "demand",
            Trigger::Operator => "operator",
            Trigger::Idle => "idle",
            Trigger::Revert => "revert",
        }
    }
}

/// One swap under way: from the loaded model (none when nothing was) to another (none: an idle
/// unload).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Swap {
    pub(crate) from: Option<ModelId>,
    pub(crate) to: Option<ModelId>,
    pub(crate) trigger: Trigger,
    pub(crate) began: Instant,
}

/// Where the models are.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    /// `swap.to`'s ranks were asked to start; waiting for them to serve.
    Loading {
        swap: Swap,
    },
    Serving {
        model: ModelId,
        since: Instant,
    },
    /// `swap.from` takes no new requests; its admitted ones finish until `until`.
    Draining {
        swap: Swap,
        until: Instant,
    },
    /// `swap.from`'s ranks were asked to stop.
    Unloading {
        swap: Swap,
    },
    /// Waiting for the nodes' memory to come back before `swap.to` starts.
    Releasing {
        swap: Swap,
        until: Instant,
    },
    /// Nothing loaded (an idle unload): the next request loads its model.
    Idle {
        since: Instant,
    },
    /// An operator stopped the loaded model, or its supervisor gave up: nothing is swapped in
    /// until it serves again (an operator's start) or an operator names a model.
    Halted {
        model: ModelId,
    },
}

/// A model's group as its supervisor publishes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GroupIs {
    Ready,
    Stopped,
    /// Starting, restarting or stopping.
    Busy,
    /// A failed start or a lost group, backing off before its next try.
    Backoff(String),
    /// Its supervisor gave up.
    Failed(String),
}

/// What one tick sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    pub(crate) now: Instant,
    /// Requests waiting, per model.
    pub(crate) waiting: &'a [ModelWaiting],
    /// Admitted requests not finished (they are the loaded model's).
    pub(crate) running: u32,
    pub(crate) groups: &'a [GroupIs],
}

#[derive(Debug)]
pub(crate) enum Event<'a> {
    Tick(Seen<'a>),
    /// An operator asks for a model.
    Asked(ModelId, Instant),
    /// The nodes' memory, read as a `ReadMemory` asked.
    Memory(Vec<NodeMemory>, Instant),
}

/// An operator's answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// It is loaded already.
    Loaded,
    /// The swap to it began (or is under way).
    Accepted,
    /// Another swap is under way.
    Busy(ModelId),
    /// It would not fit; nothing changed.
    Refused(String),
}

/// What the runner does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Admission grants the waiters of these models (`ModelId::bit`s; 0: none).
    Load(u8),
    /// The model's group takes no new requests (true) or does again.
    Drain(ModelId, bool),
    Stop(ModelId),
    Start(ModelId),
    /// Read every node's MemAvailable (answered with `Event::Memory`).
    ReadMemory,
    /// Answer the model's waiters 503 with the reason.
    Refuse(ModelId, String),
    /// The gateway's state in words while no model serves (`None`: its groups' own).
    Note(Option<String>),
    Began(Swap),
    Done(Swap, Duration),
    Failed(Swap, String),
    Unloaded(ModelId, Duration),
}

/// The swap settings and each model's memory need.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) policy: SwapPolicy,
    pub(crate) drain: Duration,
    pub(crate) dwell: Duration,
    pub(crate) idle_unload: Option<Duration>,
    pub(crate) margin_gib: f64,
    pub(crate) release_timeout: Duration,
    /// GiB each node needs free to load each model (WEIGHTS_GIB_PER_RANK + BOOT_MARGIN_GIB);
    /// `None`: not known, not checked.
    pub(crate) needs: Vec<Option<f64>>,
    /// Each model's name in messages (its served name).
    pub(crate) names: Vec<String>,
}

/// How often a releasing swap reads the nodes.
const READ_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) phase: Phase,
    settings: Settings,
    /// When the last swap began (no two within a dwell).
    last_swap: Option<Instant>,
    /// When something last ran or waited.
    last_work: Instant,
    /// Each node's memory before the loaded model loaded (`None`: not read, e.g. adopted).
    baseline: Option<Vec<NodeMemory>>,
    /// When the last reading was asked.
    asked_memory: Option<Instant>,
}

impl Machine {
    /// The gateway's start: `default` is adopted serving (`ready`) or loading.
    pub(crate) fn new(settings: Settings, default: ModelId, ready: bool, now: Instant) -> (Machine, Vec<Action>) {
        let (phase, actions) = if ready {
            (
                Phase::Serving {
                    model: default,
                    since: now,
                },
                vec![Action::Load(default.bit())],
            )
        } else {
            let swap = Swap {
                from: None,
                to: Some(default),
                trigger: Trigger::Start,
                began: now,
            };
            (
                Phase::Releasing {
                    swap,
                    until: now + settings.release_timeout,
                },
                vec![Action::Load(0), Action::ReadMemory],
            )
        };
        let machine = Machine {
            phase,
            settings,
            last_swap: None,
            last_work: now,
            baseline: None,
            asked_memory: Some(now),
        };
        (machine, actions)
    }

    /// The model loaded (serving, or draining out of it), if any.
    pub(crate) fn loaded(&self) -> Option<ModelId> {
        match &self.phase {
            Phase::Serving { model, .. } | Phase::Halted { model } => Some(*model),
            Phase::Draining { swap, .. } => swap.from,
            _ => None,
        }
    }

    /// The model a swap under way loads.
    pub(crate) fn target(&self) -> Option<ModelId> {
        match &self.phase {
            Phase::Loading { swap }
            | Phase::Draining { swap, .. }
            | Phase::Unloading { swap }
            | Phase::Releasing { swap, .. } => swap.to,
            _ => None,
        }
    }

    fn name(&self, m: ModelId) -> &str {
        &self.settings.names[m.index()]
    }

    pub(crate) fn step(&mut self, event: Event<'_>) -> (Option<Answer>, Vec<Action>) {
        match event {
            Event::Tick(seen) => (None, self.tick(seen)),
            Event::Asked(model, now) => {
                let (answer, actions) = self.asked(model, now);
                (Some(answer), actions)
            }
            Event::Memory(nodes, now) => (None, self.memory(nodes, now)),
        }
    }
}

#[path = "machine_step.rs"]
mod step;

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
