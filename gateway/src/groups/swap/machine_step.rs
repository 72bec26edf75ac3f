//! The swap machine's `step` by event: a tick, an operator's ask, a memory reading.

use tokio::time::Instant;

use sparkgate_config::SwapPolicy;
use sparkgate_supervisor::NodeMemory;

use super::{Action, Answer, GroupIs, Machine, Phase, Seen, Swap, Trigger, READ_EVERY};
use crate::api::models::ModelId;

impl Machine {
    pub(super) fn tick(&mut self, seen: Seen<'_>) -> Vec<Action> {
        let now = seen.now;
        if seen.running > 0 || seen.waiting.iter().any(|w| w.count > 0) {
            self.last_work = now;
        }
        match self.phase.clone() {
            Phase::Serving { model, since } => self.serving(model, since, seen),
            Phase::Draining { swap, until } if seen.running == 0 || now >= until => {
                let from = swap.from.expect("a drain has a model to leave");
                self.phase = Phase::Unloading { swap };
                vec![Action::Stop(from), Action::Drain(from, false)]
            }
            Phase::Unloading { swap } => {
                let from = swap.from.expect("an unload has a model to stop");
                if seen.groups[from.index()] != GroupIs::Stopped {
                    return Vec::new();
                }
                match swap.to {
                    None => {
                        self.phase = Phase::Idle { since: now };
                        vec![
                            Action::Unloaded(from, now.duration_since(self.last_work)),
                            Action::Note(Some(
                                "no model loaded (IDLE_UNLOAD_S): the next request loads its model".into(),
                            )),
                        ]
                    }
                    Some(_) => {
                        self.phase = Phase::Releasing {
                            swap,
                            until: now + self.settings.release_timeout,
                        };
                        self.read(now)
                    }
                }
            }
            Phase::Releasing { swap, until } if now >= until => {
                let reason = format!(
                    "the nodes' memory did not come back within {} s of stopping the model before it",
                    self.settings.release_timeout.as_secs()
                );
                self.fail(swap, reason, now)
            }
            Phase::Releasing { .. } if self.asked_memory.is_none_or(|t| now >= t + READ_EVERY) => self.read(now),
            Phase::Loading { swap } => self.loading(swap, seen),
            Phase::Idle { .. } => match self.wanted(seen, None) {
                Some(to) => self.begin(None, to, Trigger::Demand, now),
                None => Vec::new(),
            },
            Phase::Halted { model } if seen.groups[model.index()] == GroupIs::Ready => {
                self.phase = Phase::Serving { model, since: now };
                vec![Action::Load(model.bit()), Action::Note(None)]
            }
            _ => Vec::new(),
        }
    }

    fn serving(&mut self, model: ModelId, since: Instant, seen: Seen<'_>) -> Vec<Action> {
        let now = seen.now;
        match &seen.groups[model.index()] {
            GroupIs::Stopped | GroupIs::Failed(_) => return self.halt(model),
            _ => {}
        }
        let busy = seen.running > 0 || seen.waiting[model.index()].count > 0;
        if let Some(to) = self
            .wanted(seen, Some(model))
            .filter(|_| self.settings.policy == SwapPolicy::OnDemand)
        {
            let held = !busy || now >= since + self.settings.dwell;
            let spaced = self.last_swap.is_none_or(|t| now >= t + self.settings.dwell);
            return if held && spaced {
                self.begin(Some(model), to, Trigger::Demand, now)
            } else {
                Vec::new()
            };
        }
        match self.settings.idle_unload {
            Some(idle) if !busy && now >= self.last_work + idle => {
                let swap = Swap {
                    from: Some(model),
                    to: None,
                    trigger: Trigger::Idle,
                    began: now,
                };
                self.phase = Phase::Draining { swap, until: now };
                vec![
                    Action::Load(0),
                    Action::Drain(model, true),
                    Action::Note(Some(format!("unloading {} (IDLE_UNLOAD_S)", self.name(model)))),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// The loaded model was stopped by an operator (or its supervisor gave up): nothing is
    /// swapped in on demand, so the requests waiting for the other models are answered now.
    fn halt(&mut self, model: ModelId) -> Vec<Action> {
        self.phase = Phase::Halted { model };
        let why = format!(
            "{} was stopped (by an operator, or its supervisor gave up); no swap runs until it is started",
            self.name(model)
        );
        ModelId::all(self.settings.names.len())
            .filter(|m| *m != model)
            .map(|m| Action::Refuse(m, why.clone()))
            .collect()
    }

    /// The model other than `loaded` whose oldest request has waited longest.
    fn wanted(&self, seen: Seen<'_>, loaded: Option<ModelId>) -> Option<ModelId> {
        ModelId::all(self.settings.names.len())
            .filter(|m| Some(*m) != loaded)
            .filter_map(|m| Some((seen.waiting[m.index()].oldest?, m)))
            .min()
            .map(|(_, m)| m)
    }

    /// Why `to` would not fit on the nodes with nothing loaded (as last seen), if it would not.
    fn misfit(&self, to: ModelId, nodes: Option<&[NodeMemory]>) -> Option<String> {
        let need = self.settings.needs[to.index()]?;
        let short = nodes?.iter().find(|n| n.mem_available_gib.is_some_and(|a| a < need))?;
        Some(format!(
            "{} needs {need:.1} GiB on each node (WEIGHTS_GIB_PER_RANK + BOOT_MARGIN_GIB) and the {} has {:.1} GiB with no model loaded",
            self.name(to),
            short.node,
            short.mem_available_gib.unwrap_or(0.0)
        ))
    }

    /// Begins a swap from `from` (drained first) or from nothing (the memory read first).
    pub(super) fn begin(&mut self, from: Option<ModelId>, to: ModelId, trigger: Trigger, now: Instant) -> Vec<Action> {
        if let Some(why) = self.misfit(to, self.baseline.as_deref()) {
            let swap = Swap {
                from,
                to: Some(to),
                trigger,
                began: now,
            };
            return vec![Action::Refuse(to, why.clone()), Action::Failed(swap, why)];
        }
        let swap = Swap {
            from,
            to: Some(to),
            trigger,
            began: now,
        };
        self.last_swap = Some(now);
        let note = Action::Note(Some(match from {
            Some(f) => format!("swapping models: {} to {}", self.name(f), self.name(to)),
            None => format!("loading {}", self.name(to)),
        }));
        match from {
            Some(f) => {
                self.phase = Phase::Draining {
                    swap,
                    until: now + self.settings.drain,
                };
                vec![Action::Began(swap), Action::Load(0), Action::Drain(f, true), note]
            }
            None => {
                self.phase = Phase::Releasing {
                    swap,
                    until: now + self.settings.release_timeout,
                };
                let mut actions = vec![Action::Began(swap), Action::Load(0), note];
                actions.extend(self.read(now));
                actions
            }
        }
    }

    fn read(&mut self, now: Instant) -> Vec<Action> {
        self.asked_memory = Some(now);
        vec![Action::ReadMemory]
    }

    fn loading(&mut self, swap: Swap, seen: Seen<'_>) -> Vec<Action> {
        let to = swap.to.expect("a load has a model");
        let now = seen.now;
        match &seen.groups[to.index()] {
            GroupIs::Ready => {
                self.phase = Phase::Serving { model: to, since: now };
                let mut actions = vec![Action::Load(to.bit()), Action::Note(None)];
                if swap.trigger != Trigger::Start {
                    actions.push(Action::Done(swap, now.duration_since(swap.began)));
                }
                actions
            }
            // The gateway's own start and a revert retry as their supervisor backs off.
            GroupIs::Backoff(_) if matches!(swap.trigger, Trigger::Start | Trigger::Revert) => Vec::new(),
            GroupIs::Backoff(why) | GroupIs::Failed(why) if swap.from.is_some() && swap.trigger != Trigger::Revert => {
                let why = format!("its ranks failed to start: {why}");
                let mut actions = vec![Action::Stop(to)];
                actions.extend(self.fail(swap, why, now));
                actions
            }
            GroupIs::Failed(_) | GroupIs::Stopped => self.halt(to),
            _ => Vec::new(),
        }
    }

    /// A swap that did not finish: its waiters are answered, and the model it left (if any)
    /// is loaded again once the nodes are free of the failed one.
    fn fail(&mut self, swap: Swap, reason: String, now: Instant) -> Vec<Action> {
        let to = swap.to.expect("a failed swap had a model to load");
        let mut actions = vec![Action::Refuse(to, reason.clone()), Action::Failed(swap, reason)];
        let back = Swap {
            from: Some(to),
            to: swap.from,
            trigger: Trigger::Revert,
            began: now,
        };
        match (swap.from, &self.phase) {
            // The failed model's ranks are stopping: its memory goes before the old one starts.
            (Some(_), Phase::Loading { .. }) => self.phase = Phase::Unloading { swap: back },
            // Its ranks never started: the old model starts again at once.
            (Some(from), _) => {
                self.phase = Phase::Loading { swap: back };
                actions.push(Action::Start(from));
            }
            (None, _) => {
                self.phase = Phase::Idle { since: now };
                actions.push(Action::Note(Some(
                    "no model loaded: the last load failed; the next request tries again".into(),
                )));
            }
        }
        actions
    }

    pub(super) fn memory(&mut self, nodes: Vec<NodeMemory>, now: Instant) -> Vec<Action> {
        let Phase::Releasing { swap, .. } = self.phase.clone() else {
            return Vec::new();
        };
        let to = swap.to.expect("a release leads to a model");
        if !self.released(&nodes) {
            return Vec::new();
        }
        if let Some(why) = self.misfit(to, Some(&nodes)) {
            return self.fail(swap, why, now);
        }
        // Back to what it was before the unloaded model loaded (or first read): the figure the
        // next unload is held to.
        self.baseline = Some(nodes);
        self.phase = Phase::Loading { swap };
        vec![Action::Start(to)]
    }

    /// Every node read back within the margin of its figure before the last load.
    fn released(&self, nodes: &[NodeMemory]) -> bool {
        let Some(before) = &self.baseline else { return true };
        before.iter().all(|b| {
            let now = nodes
                .iter()
                .find(|n| n.node == b.node)
                .and_then(|n| n.mem_available_gib);
            match (b.mem_available_gib, now) {
                (Some(b), Some(n)) => n >= b - self.settings.margin_gib,
                // A node that cannot be read (or was not) does not hold the swap.
                _ => true,
            }
        })
    }

    pub(super) fn asked(&mut self, model: ModelId, now: Instant) -> (Answer, Vec<Action>) {
        match self.phase.clone() {
            Phase::Serving { model: m, .. } if m == model => (Answer::Loaded, Vec::new()),
            Phase::Serving { model: m, .. } => self.operator(Some(m), model, now),
            Phase::Idle { .. } => self.operator(None, model, now),
            Phase::Halted { model: m } if m == model => {
                let swap = Swap {
                    from: None,
                    to: Some(model),
                    trigger: Trigger::Operator,
                    began: now,
                };
                self.phase = Phase::Loading { swap };
                (Answer::Accepted, vec![Action::Start(model)])
            }
            // The halted model is stopped already: the memory is read, then the other starts.
            Phase::Halted { model: m } => {
                let (answer, mut actions) = self.operator(None, model, now);
                if let Phase::Releasing { swap, .. } = &mut self.phase {
                    swap.from = Some(m);
                }
                actions.retain(|a| *a != Action::Load(0));
                (answer, actions)
            }
            _ if self.target() == Some(model) => (Answer::Accepted, Vec::new()),
            _ => (Answer::Busy(self.target().unwrap_or(model)), Vec::new()),
        }
    }

    fn operator(&mut self, from: Option<ModelId>, to: ModelId, now: Instant) -> (Answer, Vec<Action>) {
        let actions = self.begin(from, to, Trigger::Operator, now);
        match actions.iter().find_map(|a| match a {
            Action::Failed(_, why) => Some(why.clone()),
            _ => None,
        }) {
            Some(why) => (Answer::Refused(why), actions),
            None => (Answer::Accepted, actions),
        }
    }
}
