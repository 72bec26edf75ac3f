//! The one table of what the gateway and the supervisor log about the service's life (issue
//! #39; docs/operations.md, "Events"): every lifecycle and request-path event is a variant, and
//! its level is decided here, once — planned or routine (an operator's command, a drain, an
//! adoption, a state change, a stall that ended) INFO; unplanned but recovered (a group lost
//! and restarted, a stall, an SSH loss, a stream cut and continued, a request re-sent) WARN; the
//! service or a client's answer lost (a group failed, a request failed, a poison request
//! quarantined, a rank that would not stop, a handler's panic) ERROR. A stall logs when it
//! starts (WARN), every `STALL_EVERY` while it lasts and when it ends (INFO): `Stall`.

mod recent;
mod stall;

use std::fmt;

pub use recent::{recent, Recorded, KEPT};
pub use stall::{Stall, STALL_EVERY};

/// How loud an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    /// As log lines spell it.
    pub fn label(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// An event of the service's life, with what names it (names, ids, counts — never a key or a
/// request body).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An operator (or the speculation policy) asked the supervisor for something.
    OperatorAsked { what: String, answer: String },
    /// The gateway drains its connections before exiting.
    Draining { connections: usize, drain_s: u64 },
    /// A running group of this configuration was adopted (the model stays loaded).
    Adopted { epoch: u64 },
    /// Running containers were not adopted (removed; the group starts fresh).
    NotAdopted { reason: String },
    /// The group's containers are left running for the next gateway to adopt.
    Released { epoch: u64 },
    /// The group's state changed (a start, ready, a planned restart, a back-off, a stop).
    StateChanged {
        group: String,
        state: String,
        epoch: u64,
        mode: String,
    },
    /// A stall goes on.
    StillStalled { group: String, for_s: u64 },
    /// The stall ended (a step came, or the group was restarted).
    StallOver { group: String, lasted_s: u64 },
    /// The upstream (gateway-only mode: nobody supervises it) answers again.
    UpstreamUp { upstream: String },
    /// A cut stream's continuation waits for its group to serve again.
    ContinuationWaits { request_id: String, why: String },
    /// A node has no `nvidia-smi`: the GPU watch is off there (said once).
    GpuWatchOff { node: String },
    /// A swap between models began (MODELS): `from` drains and stops, `to` is started.
    SwapStarted { from: String, to: String, trigger: String },
    /// The swapped-in model serves.
    Swapped {
        from: String,
        to: String,
        trigger: String,
        seconds: f64,
    },
    /// The loaded model was unloaded after IDLE_UNLOAD_S without work.
    ModelUnloaded { model: String, idle_s: u64 },
    /// A swap did not happen or did not finish (the model would not fit, its memory was not
    /// released, its ranks failed to start); the old model is (started again and) served, and
    /// the requests waiting for the other were answered 503.
    SwapFailed { from: String, to: String, reason: String },
    /// A serving (or starting) group was lost; it is restarted.
    GroupLost {
        group: String,
        epoch: u64,
        /// `RestartReason`'s label.
        reason: String,
        detail: String,
        /// Where its diagnostics bundle was written.
        diagnostics: Option<String>,
    },
    /// A serving group has had work pending and no engine step (or no health answer).
    Stalled { group: String, for_s: u64 },
    /// A worker's SSH session ended; it is reconnected.
    SshLost { node: String, destination: String },
    /// A stream cut by its group's loss is being continued.
    StreamCut {
        request_id: String,
        cut: String,
        tokens: usize,
    },
    /// A request in flight when its group was lost is sent again (a suspect).
    Requeued {
        request_id: String,
        client: String,
        strikes: u32,
    },
    /// A node's kernel log has an NVIDIA Xid or an OOM-killer line.
    KernelLog { node: String, line: String },
    /// The upstream (gateway-only mode) stopped answering.
    UpstreamDown { upstream: String, detail: String },
    /// Requests still ran when a drain ran out (`during`: before what); they end with an error.
    DrainTimeout { during: String },
    /// A rank an earlier gateway left running was removed.
    LeftoverRemoved { what: String },
    /// A remote rank's stop could not reach its node: a process ends with its SSH session, and
    /// the next start removes a container left behind.
    RankUnconfirmed { rank: u32, detail: String },
    /// A request whose body was quarantined twice is refused at arrival.
    PoisonRefused { request_id: String, client: String },
    /// The group gave up restarting (RESTART_BUDGET spent).
    GroupFailed { group: String, reason: String },
    /// A client's answer was lost: an error event ended its stream, or it was answered 5xx.
    RequestFailed {
        request_id: String,
        route: String,
        outcome: String,
    },
    /// A request the group was lost under twice is not sent again.
    Quarantined {
        request_id: String,
        client: String,
        strikes: u32,
    },
    /// A rank could not be stopped.
    RankNotStopped { rank: u32, detail: String },
    /// A request handler panicked; its request was answered 500.
    HandlerPanicked { message: String },
}

/// Each event's name and level: the table docs/operations.md lists (a test holds them equal).
macro_rules! table {
    ($($variant:ident => $name:literal, $level:ident;)+) => {
        impl Event {
            /// Every event's name and level, in the table's order.
            pub const TABLE: &'static [(&'static str, Level)] = &[$(($name, Level::$level),)+];

            /// The event's level.
            pub fn level(&self) -> Level {
                match self {
                    $(Event::$variant { .. } => Level::$level,)+
                }
            }

            /// The event's name, as the log line's `event` field spells it.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Event::$variant { .. } => $name,)+
                }
            }
        }
    };
}

table! {
    OperatorAsked => "operator_asked", Info;
    Draining => "draining", Info;
    Adopted => "adopted", Info;
    NotAdopted => "not_adopted", Info;
    Released => "released", Info;
    StateChanged => "state_changed", Info;
    StillStalled => "still_stalled", Info;
    StallOver => "stall_over", Info;
    UpstreamUp => "upstream_up", Info;
    ContinuationWaits => "continuation_waits", Info;
    GpuWatchOff => "gpu_watch_off", Info;
    SwapStarted => "swap_started", Info;
    Swapped => "swapped", Info;
    ModelUnloaded => "model_unloaded", Info;
    GroupLost => "group_lost", Warn;
    Stalled => "stalled", Warn;
    SshLost => "ssh_lost", Warn;
    StreamCut => "stream_cut", Warn;
    Requeued => "requeued", Warn;
    KernelLog => "kernel_log", Warn;
    UpstreamDown => "upstream_down", Warn;
    DrainTimeout => "drain_timeout", Warn;
    LeftoverRemoved => "leftover_removed", Warn;
    RankUnconfirmed => "rank_unconfirmed", Warn;
    PoisonRefused => "poison_refused", Warn;
    SwapFailed => "swap_failed", Warn;
    GroupFailed => "group_failed", Error;
    RequestFailed => "request_failed", Error;
    Quarantined => "quarantined", Error;
    RankNotStopped => "rank_not_stopped", Error;
    HandlerPanicked => "handler_panicked", Error;
}

impl Event {
    /// Writes the event's one line at its level, its name in the `event` field. A detail that
    /// carries line breaks (a remote command's stderr) is joined with ` | `: one event, one line.
    pub fn emit(&self) {
        let event = self.name();
        let text = self.to_string();
        let text = if text.contains('\n') {
            text.lines().collect::<Vec<_>>().join(" | ")
        } else {
            text
        };
        recent::record(self, &text);
        match self.level() {
            Level::Info => tracing::info!(event, "{text}"),
            Level::Warn => tracing::warn!(event, "{text}"),
            Level::Error => tracing::error!(event, "{text}"),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::OperatorAsked { what, answer } => write!(f, "operator: {what}: {answer}"),
            Event::Draining { connections, drain_s } => {
                write!(f, "draining: {connections} connections, at most {drain_s} s")
            }
            Event::Adopted { epoch } => write!(f, "adopted the running rank group (no reload), epoch {epoch}"),
            Event::NotAdopted { reason } => {
                write!(f, "not adopting: {reason}; removing the old containers and starting fresh")
            }
            Event::Released { epoch } => {
                write!(f, "leaving epoch {epoch}'s rank containers running for the next gateway to adopt")
            }
            Event::StateChanged {
                group,
                state,
                epoch,
                mode,
            } => write!(f, "group {group}: {state} (epoch {epoch}, mode {mode})"),
            Event::StillStalled { group, for_s } => write!(f, "group {group}: still stalled after {for_s} s"),
            Event::StallOver { group, lasted_s } => write!(f, "group {group}: the stall ended after {lasted_s} s"),
            Event::UpstreamUp { upstream } => write!(f, "upstream {upstream}: answers"),
            Event::ContinuationWaits { request_id, why } => {
                write!(f, "request {request_id}: continuation waits for the group: {why}")
            }
            Event::GpuWatchOff { node } => write!(f, "{node}: no nvidia-smi; the GPU watch is off there"),
            Event::KernelLog { node, line } => write!(f, "{node} kernel: {line}"),
            Event::GroupLost {
                group,
                epoch,
                reason,
                detail,
                diagnostics,
            } => {
                write!(f, "group {group}: epoch {epoch} lost ({reason}): {detail}; restarting")?;
                match diagnostics {
                    Some(d) => write!(f, "; diagnostics in {d}"),
                    None => Ok(()),
                }
            }
            Event::Stalled { group, for_s } => write!(
                f,
                "group {group}: stalled: no engine step (or health answer) for {for_s} s with requests pending"
            ),
            Event::SshLost { node, destination } => {
                write!(f, "{node} ({destination}): the SSH session is gone; reconnecting")
            }
            Event::StreamCut {
                request_id,
                cut,
                tokens,
            } => write!(f, "request {request_id}: stream cut after {tokens} tokens ({cut}); continuing it"),
            Event::Requeued {
                request_id,
                client,
                strikes,
            } => write!(
                f,
                "request {request_id} from {client}: in flight when its group was lost (strike {strikes}): sent again"
            ),
            Event::UpstreamDown { upstream, detail } => write!(f, "upstream {upstream}: down: {detail}"),
            Event::DrainTimeout { during } => {
                write!(f, "drain timeout before {during}: what still runs ends with an error")
            }
            Event::LeftoverRemoved { what } => write!(f, "removed a rank an earlier gateway left running: {what}"),
            Event::RankUnconfirmed { rank, detail } => write!(
                f,
                "rank {rank}: its stop could not reach its node ({detail}); a remote process ends with its SSH session, a container is removed by the next start"
            ),
            Event::SwapStarted { from, to, trigger } => {
                write!(f, "swapping models ({trigger}): {from} drains and stops, then {to} starts")
            }
            Event::Swapped {
                from,
                to,
                trigger,
                seconds,
            } => write!(f, "swapped models ({trigger}): {to} serves, {from} is unloaded, in {seconds:.1} s"),
            Event::ModelUnloaded { model, idle_s } => write!(
                f,
                "{model} unloaded after {idle_s} s without work: the nodes' memory is free; the next request loads its model"
            ),
            Event::SwapFailed { from, to, reason } => write!(
                f,
                "swap from {from} to {to} failed: {reason}; {from} serves, the requests waiting for {to} were answered 503"
            ),
            Event::PoisonRefused { request_id, client } => write!(
                f,
                "request {request_id} from {client}: request_crashed_engine: refused at arrival (its body was quarantined twice)"
            ),
            Event::GroupFailed { group, reason } => write!(f, "group {group}: failed, not restarting: {reason}"),
            Event::RequestFailed {
                request_id,
                route,
                outcome,
            } => write!(f, "request {request_id} ({route}): answer lost: {outcome}"),
            Event::Quarantined {
                request_id,
                client,
                strikes,
            } => write!(
                f,
                "request {request_id} from {client}: request_crashed_engine: quarantined, not sent again (strike {strikes})"
            ),
            Event::RankNotStopped { rank, detail } => write!(f, "rank {rank} could not be stopped: {detail}"),
            Event::HandlerPanicked { message } => {
                write!(f, "a request handler panicked ({message}); the request was answered 500")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_events_are_info_recovered_ones_warn_and_lost_ones_error() {
        let lost = Event::GroupLost {
            group: "main".into(),
            epoch: 1,
            reason: "killed".into(),
            detail: "rank 0 exited (signal: 9)".into(),
            diagnostics: Some("/l/epoch-1/diagnostics".into()),
        };
        assert_eq!(lost.level(), Level::Warn);
        assert_eq!(
            lost.to_string(),
            "group main: epoch 1 lost (killed): rank 0 exited (signal: 9); restarting; diagnostics in /l/epoch-1/diagnostics"
        );
        let asked = Event::OperatorAsked {
            what: "restart".into(),
            answer: "accepted".into(),
        };
        assert_eq!((asked.level(), asked.name()), (Level::Info, "operator_asked"));
        let failed = Event::GroupFailed {
            group: "main".into(),
            reason: "x".into(),
        };
        assert_eq!(failed.level(), Level::Error);
        let cut = Event::StreamCut {
            request_id: "r".into(),
            cut: "upstream broke".into(),
            tokens: 3,
        };
        assert_eq!(cut.level(), Level::Warn);
    }

    #[test]
    fn a_detail_with_line_breaks_is_still_one_line() {
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Writer(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            Event::RankNotStopped {
                rank: 1,
                detail: "kill 7: pyenv: cannot rehash\nkill: (7) - No such process".into(),
            }
            .emit();
        });
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("cannot rehash | kill: (7)") && text.contains("event=\"rank_not_stopped\""),
            "{text}"
        );
    }

    struct Writer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Writer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_table_names_each_event_once() {
        let mut names: Vec<_> = Event::TABLE.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Event::TABLE.len());
        assert!(Event::TABLE.contains(&("quarantined", Level::Error)));
    }
}
