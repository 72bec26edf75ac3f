//! The supervisor's state machine: one `Phase`, one `Event` enum and one pure `step` that says
//! what every event means in every phase, as a list of `Action`s for the actor to carry out.
//! No I/O and no clock of its own (the caller passes `now`; only a restart's wall-clock stamp
//! for the status is read), so every phase × event pair is unit-tested; the phase × command
//! table is in ARCHITECTURE.md, and a test holds the two equal.

use std::time::{Duration, Instant};

use sparkgate_config::SpecMethod;

use crate::backoff::Backoff;
use crate::status::{GroupState, LastRestart, LossCause, RestartReason};

/// Where the group is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    Stopped,
    /// Node preparation (weights, image, shipping, self-check) runs before the first start.
    Preparing {
        epoch: u64,
    },
    /// The ranks of `epoch` are being spawned and waited for.
    Starting {
        epoch: u64,
    },
    Ready {
        epoch: u64,
    },
    /// The ranks of `epoch` are being stopped; `then` says what follows.
    Stopping {
        epoch: u64,
        then: Then,
    },
    /// A failed group waits out its backoff before `epoch + 1` starts.
    Backoff {
        epoch: u64,
        reason: String,
        delay: Duration,
    },
    /// The restart budget is spent; only an operator's start or restart leaves this.
    Failed {
        reason: String,
    },
    /// The gateway is exiting; nothing starts again.
    ShuttingDown,
}

/// What follows a stop.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Then {
    /// Stay stopped (an operator's stop).
    Stay,
    /// Start a new epoch at once (an operator's restart or mode switch): not a failure.
    Start { reason: String },
    /// The group failed: count it, back off, start again (or give up).
    Retry(Failure),
    /// The gateway exits after the stop.
    Exit,
}

/// A failure and how long it took to notice (from the last sign of life).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    pub(crate) reason: String,
    pub(crate) detected_in: Option<Duration>,
    /// What ended the group, as the gateway's poison guard weighs it.
    pub(crate) cause: LossCause,
}

/// What operators (and the speculation policy) ask for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
    Start,
    Stop,
    /// Restart the group; with `mode`, into that speculation mode.
    Restart {
        reason: String,
        mode: Option<SpecMethod>,
    },
    Shutdown,
}

/// The machine's answer to a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Taken: the group will do it (or is doing it).
    Accepted,
    /// Taken and kept: it applies when the current start or stop has finished.
    Queued,
    /// Nothing to do: the group already runs (or starts).
    AlreadyRunning,
    /// Nothing to do: no rank runs.
    AlreadyStopped,
    /// The gateway is shutting down; nothing starts again.
    ShuttingDown,
    /// The command queue is full (the handle answers this, never the machine).
    Busy,
}

/// Everything that can happen to the group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    Asked(Command),
    /// Node preparation finished.
    Prepared(Result<(), String>),
    /// The start of `epoch` finished: every rank up and rank 0 ready, or why not.
    Up {
        epoch: u64,
        outcome: Result<(), String>,
    },
    /// A rank of `epoch` exited (its reason says which and how; its cause, what ended it).
    RankExited {
        epoch: u64,
        reason: String,
        cause: LossCause,
    },
    /// The watchdog's verdict on a running `epoch` (health, memory, stall).
    Unwell {
        epoch: u64,
        failure: Failure,
    },
    /// Every rank of `epoch` is gone.
    Down {
        epoch: u64,
    },
    /// The backoff after `epoch` failed is over.
    RetryDue {
        epoch: u64,
    },
}

/// What the actor carries out, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Run node preparation; reports `Prepared`.
    Prepare,
    /// Abandon a running preparation.
    CancelPrepare,
    /// Spawn `epoch`'s ranks in `mode` (workers first) and wait until ready; reports `Up`.
    Start { epoch: u64, mode: SpecMethod },
    /// Watch a ready `epoch` (samples → `Unwell`).
    Watch { epoch: u64 },
    /// Write `epoch`'s diagnostics bundle (its ranks still there) and log its loss.
    Diagnose { epoch: u64, failure: Failure },
    /// Stop `epoch`'s ranks as whole process trees (cancelling its start); reports `Down`.
    Stop { epoch: u64 },
    /// Leave `epoch`'s ranks running for the next gateway to adopt.
    Release { epoch: u64 },
    /// Report `RetryDue { epoch }` after `delay`.
    Wait { epoch: u64, delay: Duration },
    /// The status changed.
    Publish,
    /// The supervisor ends (answer the shutdown waiters).
    Exit,
}

/// The machine: the phase plus what outlives a phase (epoch, mode, restart accounting).
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) phase: Phase,
    /// The newest epoch started (or adopted).
    pub(crate) epoch: u64,
    /// The mode the current (or last) epoch runs.
    pub(crate) mode: SpecMethod,
    /// A mode asked for while it could not be applied yet: the next start uses it.
    wanted: Option<SpecMethod>,
    backoff: Backoff,
    pub(crate) restarts: u32,
    pub(crate) last_restart: Option<LastRestart>,
    /// Restarts of a running group, by reason.
    pub(crate) restart_counts: std::collections::BTreeMap<RestartReason, u64>,
    /// Node preparation ran (it runs once, before the first start).
    prepared: bool,
    ready_since: Option<Instant>,
    /// Docker: a ready group is left running at exit for the next gateway to adopt.
    keep_on_exit: bool,
}

/// How a machine begins: preparation still to do, or an adopted running group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Fresh {
        prepared: bool,
    },
    Adopted {
        epoch: u64,
    },
    /// Stopped until asked to start (a model of MODELS not loaded at start).
    Standby {
        prepared: bool,
    },
}

impl Machine {
    pub(crate) fn new(mode: SpecMethod, backoff: Backoff, keep_on_exit: bool) -> Self {
        Self {
            phase: Phase::Stopped,
            epoch: 0,
            mode,
            wanted: None,
            backoff,
            restarts: 0,
            last_restart: None,
            restart_counts: std::collections::BTreeMap::new(),
            prepared: false,
            ready_since: None,
            keep_on_exit,
        }
    }

    /// The first actions: start (preparing first when needed), or watch an adopted group.
    pub(crate) fn begin(&mut self, origin: Origin, now: Instant) -> Vec<Action> {
        match origin {
            Origin::Fresh { prepared } => {
                self.prepared = prepared;
                self.start()
            }
            Origin::Standby { prepared } => {
                self.prepared = prepared;
                vec![Action::Publish]
            }
            Origin::Adopted { epoch } => {
                self.prepared = true;
                self.epoch = epoch;
                self.phase = Phase::Ready { epoch };
                self.ready_since = Some(now);
                // The watch first: its first memory sample goes out with the ready state, so the
                // gateway's memory guard never admits into a group it has not read.
                vec![Action::Watch { epoch }, Action::Publish]
            }
        }
    }

    /// The mode the next start runs.
    pub(crate) fn next_mode(&self) -> SpecMethod {
        self.wanted.unwrap_or(self.mode)
    }

    /// The state as the status reports it.
    pub(crate) fn group_state(&self) -> GroupState {
        match &self.phase {
            Phase::Stopped => GroupState::Stopped,
            Phase::Preparing { epoch } | Phase::Starting { epoch } => GroupState::Starting { epoch: *epoch },
            Phase::Ready { epoch } => GroupState::Ready { epoch: *epoch },
            Phase::Stopping { then: Then::Stay, .. } => GroupState::Stopping,
            Phase::Stopping { then: Then::Exit, .. } | Phase::ShuttingDown => GroupState::ShuttingDown,
            Phase::Stopping {
                then: Then::Start { reason },
                ..
            } => GroupState::Restarting {
                reason: reason.clone(),
                cause: None,
            },
            Phase::Stopping {
                then: Then::Retry(Failure { reason, cause, .. }),
                ..
            } => GroupState::Restarting {
                reason: reason.clone(),
                cause: Some(*cause),
            },
            Phase::Backoff { reason, delay, .. } => GroupState::Backoff {
                reason: reason.clone(),
                retry_in_s: delay.as_secs_f64(),
            },
            Phase::Failed { reason } => GroupState::Failed { reason: reason.clone() },
        }
    }

    /// The one decision: what `event` means now. Commands also get an answer.
    pub(crate) fn step(&mut self, event: Event, now: Instant) -> (Option<Answer>, Vec<Action>) {
        match event {
            Event::Asked(command) => {
                let (answer, actions) = self.command(command, now);
                (Some(answer), actions)
            }
            other => (None, self.happened(other, now)),
        }
    }

    fn command(&mut self, command: Command, now: Instant) -> (Answer, Vec<Action>) {
        use Phase as P;
        if self.phase == P::ShuttingDown || matches!(self.phase, P::Stopping { then: Then::Exit, .. }) {
            return (Answer::ShuttingDown, vec![]);
        }
        match command {
            Command::Start => match &mut self.phase {
                P::Stopped | P::Failed { .. } | P::Backoff { .. } => {
                    // An operator's start is a clean slate for the restart budget.
                    self.backoff.reset();
                    (Answer::Accepted, self.start())
                }
                P::Stopping { then, .. } => match then {
                    Then::Stay | Then::Retry(_) => {
                        *then = Then::Start {
                            reason: "operator start".into(),
                        };
                        (Answer::Queued, vec![Action::Publish])
                    }
                    Then::Start { .. } | Then::Exit => (Answer::AlreadyRunning, vec![]),
                },
                P::Preparing { .. } | P::Starting { .. } | P::Ready { .. } | P::ShuttingDown => {
                    (Answer::AlreadyRunning, vec![])
                }
            },
            Command::Stop => match &mut self.phase {
                P::Stopped => (Answer::AlreadyStopped, vec![]),
                P::Failed { .. } | P::Backoff { .. } => {
                    self.phase = P::Stopped;
                    (Answer::Accepted, vec![Action::Publish])
                }
                P::Preparing { .. } => {
                    self.phase = P::Stopped;
                    (Answer::Accepted, vec![Action::CancelPrepare, Action::Publish])
                }
                P::Starting { epoch } | P::Ready { epoch } => {
                    let epoch = *epoch;
                    (Answer::Accepted, self.stop(epoch, Then::Stay, now))
                }
                P::Stopping { then, .. } => {
                    *then = Then::Stay;
                    (Answer::Accepted, vec![Action::Publish])
                }
                P::ShuttingDown => (Answer::ShuttingDown, vec![]),
            },
            Command::Restart { reason, mode } => {
                if mode.is_some() {
                    self.wanted = mode;
                }
                let why = if mode.is_some() {
                    RestartReason::SpecSwitch
                } else {
                    RestartReason::Operator
                };
                self.restart(reason, why, now)
            }
            Command::Shutdown => (Answer::Accepted, self.shutdown(now)),
        }
    }

    fn restart(&mut self, reason: String, why: RestartReason, now: Instant) -> (Answer, Vec<Action>) {
        use Phase as P;
        match &mut self.phase {
            P::Stopped | P::Failed { .. } | P::Backoff { .. } => {
                self.backoff.reset();
                (Answer::Accepted, self.start())
            }
            P::Preparing { .. } => (Answer::Queued, vec![]),
            P::Starting { epoch } | P::Ready { epoch } => {
                let epoch = *epoch;
                self.restarts += 1;
                *self.restart_counts.entry(why).or_default() += 1;
                self.last_restart = Some(LastRestart::now(epoch, &reason, None, None));
                (Answer::Accepted, self.stop(epoch, Then::Start { reason }, now))
            }
            P::Stopping { then, .. } => {
                if !matches!(then, Then::Start { .. }) {
                    *then = Then::Start { reason };
                }
                (Answer::Queued, vec![Action::Publish])
            }
            P::ShuttingDown => (Answer::ShuttingDown, vec![]),
        }
    }

    fn shutdown(&mut self, now: Instant) -> Vec<Action> {
        use Phase as P;
        match std::mem::replace(&mut self.phase, P::ShuttingDown) {
            P::Ready { epoch } if self.keep_on_exit => vec![Action::Release { epoch }, Action::Publish, Action::Exit],
            P::Starting { epoch } | P::Ready { epoch } => self.stop(epoch, Then::Exit, now),
            P::Stopping { epoch, .. } => {
                self.phase = P::Stopping {
                    epoch,
                    then: Then::Exit,
                };
                vec![Action::Publish]
            }
            P::Preparing { .. } => vec![Action::CancelPrepare, Action::Publish, Action::Exit],
            P::Stopped | P::Failed { .. } | P::Backoff { .. } | P::ShuttingDown => {
                vec![Action::Publish, Action::Exit]
            }
        }
    }

    /// What the ranks, the start, the stop and the timers report.
    fn happened(&mut self, event: Event, now: Instant) -> Vec<Action> {
        use Phase as P;
        match (event, &self.phase) {
            (Event::Prepared(Ok(())), P::Preparing { epoch }) => {
                let epoch = *epoch;
                self.prepared = true;
                self.launch(epoch)
            }
            (Event::Prepared(Err(reason)), P::Preparing { epoch }) => {
                let epoch = *epoch;
                self.failed(
                    epoch,
                    Failure {
                        reason: format!("node preparation failed: {reason}"),
                        detected_in: None,
                        cause: LossCause::FailedStart,
                    },
                )
            }
            (Event::Up { epoch, outcome: Ok(()) }, P::Starting { epoch: e }) if epoch == *e => {
                self.phase = P::Ready { epoch };
                self.ready_since = Some(now);
                // The watch first: its first memory sample goes out with the ready state, so the
                // gateway's memory guard never admits into a group it has not read.
                vec![Action::Watch { epoch }, Action::Publish]
            }
            (
                Event::Up {
                    epoch,
                    outcome: Err(reason),
                },
                P::Starting { epoch: e },
            ) if epoch == *e => {
                let failure = Failure {
                    reason,
                    detected_in: None,
                    cause: LossCause::FailedStart,
                };
                self.stop(epoch, Then::Retry(failure), now)
            }
            (Event::RankExited { epoch, reason, cause }, P::Starting { epoch: e } | P::Ready { epoch: e })
                if epoch == *e =>
            {
                let failure = Failure {
                    reason,
                    detected_in: Some(Duration::ZERO),
                    cause,
                };
                self.stop(epoch, Then::Retry(failure), now)
            }
            (Event::Unwell { epoch, failure }, P::Starting { epoch: e } | P::Ready { epoch: e }) if epoch == *e => {
                self.stop(epoch, Then::Retry(failure), now)
            }
            (Event::Down { epoch }, P::Stopping { epoch: e, then }) if epoch == *e => {
                let then = then.clone();
                self.stopped(epoch, then)
            }
            (Event::RetryDue { epoch }, P::Backoff { epoch: e, .. }) if epoch == *e => self.start(),
            // Anything else is from an earlier epoch, a phase already left, or expected (the
            // exits of ranks being stopped): nothing to do.
            _ => vec![],
        }
    }

    /// A new epoch: preparation first when it has not run.
    fn start(&mut self) -> Vec<Action> {
        self.epoch += 1;
        if self.prepared {
            self.launch(self.epoch)
        } else {
            self.phase = Phase::Preparing { epoch: self.epoch };
            vec![Action::Publish, Action::Prepare]
        }
    }

    fn launch(&mut self, epoch: u64) -> Vec<Action> {
        self.mode = self.next_mode();
        self.wanted = None;
        self.phase = Phase::Starting { epoch };
        vec![Action::Publish, Action::Start { epoch, mode: self.mode }]
    }

    /// Stops `epoch`; a failure's ranks are diagnosed first, while they are still there.
    fn stop(&mut self, epoch: u64, then: Then, now: Instant) -> Vec<Action> {
        if let Some(since) = self.ready_since.take() {
            self.backoff.healthy_for(now.saturating_duration_since(since));
        }
        let diagnose = match &then {
            Then::Retry(failure) => Some(Action::Diagnose {
                epoch,
                failure: failure.clone(),
            }),
            Then::Stay | Then::Start { .. } | Then::Exit => None,
        };
        self.phase = Phase::Stopping { epoch, then };
        let mut actions = vec![Action::Publish];
        actions.extend(diagnose);
        actions.push(Action::Stop { epoch });
        actions
    }

    fn stopped(&mut self, epoch: u64, then: Then) -> Vec<Action> {
        match then {
            Then::Stay => {
                self.phase = Phase::Stopped;
                vec![Action::Publish]
            }
            Then::Start { .. } => self.start(),
            Then::Retry(failure) => self.failed(epoch, failure),
            Then::Exit => {
                self.phase = Phase::ShuttingDown;
                vec![Action::Publish, Action::Exit]
            }
        }
    }

    /// Counts a failure of `epoch` (its ranks already gone): back off, or give up.
    fn failed(&mut self, epoch: u64, failure: Failure) -> Vec<Action> {
        self.restarts += 1;
        *self
            .restart_counts
            .entry(RestartReason::of_cause(failure.cause))
            .or_default() += 1;
        let detected = failure.detected_in.map(|d| d.as_secs_f64());
        self.last_restart = Some(LastRestart::now(epoch, &failure.reason, detected, Some(failure.cause)));
        match self.backoff.failed() {
            None => {
                let reason = format!(
                    "gave up after {} failures in a row; last: {}",
                    self.backoff.failures() - 1,
                    failure.reason
                );
                self.phase = Phase::Failed { reason };
                vec![Action::Publish]
            }
            Some(delay) => {
                self.phase = Phase::Backoff {
                    epoch,
                    reason: failure.reason,
                    delay,
                };
                vec![Action::Publish, Action::Wait { epoch, delay }]
            }
        }
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "machine_runs.rs"]
mod runs;
