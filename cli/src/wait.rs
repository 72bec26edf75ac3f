//! Waiting for an operator command's outcome: `/admin/status` is polled, each phase the group
//! passes through is shown as it is reached (one line updated in place on a terminal, one line
//! per phase otherwise), and the outcome becomes the exit code — 0 done, 1 the group failed,
//! 2 still not done when the wait gave up.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;
use serde_json::Value;
use sparkgate_config::SpecMethod;
use sparkgate_supervisor::GroupState;

/// How a command that changes the group waits.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Return as soon as the gateway took the command, without waiting for the outcome.
    #[arg(long)]
    pub no_wait: bool,
    /// Print the outcome as JSON (the final `/admin/status`) instead of words.
    #[arg(long)]
    pub json: bool,
    /// Give up waiting after this many seconds (exit 2).
    #[arg(long, value_name = "S", default_value_t = 900)]
    pub timeout_s: u64,
}

/// What the command waits for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Goal {
    /// A ready group newer than `after` (a restart or a start).
    Ready { after: u64 },
    /// No rank running.
    Stopped,
    /// A ready group in `mode`, newer than `after` (a mode switch).
    Mode { mode: SpecMethod, after: u64 },
    /// The model `name` (as the operator named it) loaded and serving (a swap).
    Model { name: String },
}

/// Where the group is, in an operator's words.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Phase {
    /// A swap between models (MODELS) in one of its steps.
    Swapping {
        step: String,
        from: String,
        to: String,
    },
    Draining {
        in_flight: u64,
    },
    Preparing(String),
    Stopping,
    Starting {
        epoch: u64,
        up: usize,
        ranks: usize,
    },
    Backoff {
        reason: String,
        retry_in_s: f64,
    },
    /// `mode` is `None` when the gateway named a mode this build does not know.
    Ready {
        epoch: u64,
        mode: Option<SpecMethod>,
    },
    Stopped,
    Failed {
        reason: String,
    },
    ShuttingDown,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Phase::Swapping { step, from, to } => write!(f, "swapping {from} for {to}: {step}"),
            Phase::Draining { in_flight } => write!(f, "draining: {in_flight} in flight"),
            Phase::Preparing(what) => write!(f, "preparing: {what}"),
            Phase::Stopping => f.write_str("stopping the ranks"),
            Phase::Starting { epoch, up, ranks } => write!(f, "starting epoch {epoch}: {up}/{ranks} ranks up, loading"),
            Phase::Backoff { reason, retry_in_s } => write!(f, "backing off {retry_in_s:.0} s after: {reason}"),
            Phase::Ready { epoch, mode } => write!(f, "ready: epoch {epoch}, mode {}", shown(*mode)),
            Phase::Stopped => f.write_str("stopped"),
            Phase::Failed { reason } => write!(f, "failed: {reason}"),
            Phase::ShuttingDown => f.write_str("the gateway is shutting down"),
        }
    }
}

fn shown(mode: Option<SpecMethod>) -> &'static str {
    mode.map_or("?", SpecMethod::as_str)
}

/// What the wait reads of `/admin/status`'s `supervisor` beside its lifecycle (`GroupState`,
/// read typed from the same object): its epoch, mode and ranks.
#[derive(Debug, Deserialize)]
struct Seen {
    #[serde(default)]
    epoch: u64,
    /// Read as text: a mode this build does not know is shown as `?`, not a failed wait.
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    ranks: Vec<RankSeen>,
    #[serde(default)]
    preparing: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RankSeen {
    running: bool,
}

/// The phase a `/admin/status` answer shows.
pub(super) fn phase_of(status: &Value) -> Phase {
    if let Some(phase) = swapping(status) {
        return phase;
    }
    let supervisor = &status["supervisor"];
    let (Ok(state), Ok(seen)) = (GroupState::deserialize(supervisor), Seen::deserialize(supervisor)) else {
        return Phase::ShuttingDown;
    };
    let epoch = seen.epoch;
    match state {
        GroupState::Ready { .. } if status["admission"]["open"] == false => Phase::Draining {
            in_flight: status["admission"]["in_flight"].as_u64().unwrap_or(0),
        },
        GroupState::Ready { .. } => Phase::Ready {
            epoch,
            mode: seen.mode.and_then(|m| m.parse().ok()),
        },
        GroupState::Starting { .. } => match seen.preparing {
            Some(p) => Phase::Preparing(p),
            None => Phase::Starting {
                epoch,
                up: seen.ranks.iter().filter(|r| r.running).count(),
                ranks: seen.ranks.len(),
            },
        },
        GroupState::Backoff { reason, retry_in_s } => Phase::Backoff { reason, retry_in_s },
        GroupState::Restarting { .. } | GroupState::Stopping => Phase::Stopping,
        GroupState::Stopped => Phase::Stopped,
        GroupState::Failed { reason } => Phase::Failed { reason },
        GroupState::ShuttingDown => Phase::ShuttingDown,
    }
}

/// A swap's step, in an operator's words, while one runs (MODELS).
fn swapping(status: &Value) -> Option<Phase> {
    let swap = &status["swap"];
    let step = match swap["phase"].as_str()? {
        "draining" => format!(
            "draining: {} in flight",
            status["admission"]["in_flight"].as_u64().unwrap_or(0)
        ),
        "unloading" => "stopping the loaded model's ranks".to_owned(),
        "releasing" => "waiting for the nodes' memory to come back".to_owned(),
        "loading" => "starting its ranks, loading".to_owned(),
        _ => return None,
    };
    let name = |k: &str| swap["swap"][k].as_str().unwrap_or("nothing").to_owned();
    Some(Phase::Swapping {
        step,
        from: name("from"),
        to: name("to"),
    })
}

/// Whether `status` ends the wait: `Some(Ok(()))` reached, `Some(Err(why))` it cannot be.
pub(super) fn verdict(goal: &Goal, status: &Value) -> Option<Result<(), String>> {
    let phase = phase_of(status);
    let newer = |after: u64| status["supervisor"]["epoch"].as_u64().unwrap_or(0) > after;
    match (&phase, goal) {
        (Phase::Failed { reason }, Goal::Ready { .. } | Goal::Mode { .. }) => Some(Err(reason.clone())),
        (Phase::ShuttingDown, _) => Some(Err("the gateway is shutting down".into())),
        (Phase::Ready { .. }, Goal::Ready { after }) if newer(*after) => Some(Ok(())),
        (Phase::Ready { mode, .. }, Goal::Mode { mode: want, after }) if *mode == Some(*want) && newer(*after) => {
            Some(Ok(()))
        }
        (Phase::Stopped | Phase::Failed { .. }, Goal::Stopped) => Some(Ok(())),
        (Phase::Ready { .. }, Goal::Model { name }) => Some(model_loaded(status, name)),
        (Phase::Failed { reason }, Goal::Model { .. }) => Some(Err(reason.clone())),
        _ => None,
    }
}

/// Once no swap runs: whether the model loaded is the one asked for (a served name, an alias or
/// a profile), else the swap failed and the old model serves.
fn model_loaded(status: &Value, asked: &str) -> Result<(), String> {
    let loaded = status["models"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["loaded"] == true);
    let Some(m) = loaded else {
        return Err("no model is loaded".into());
    };
    let named = m["name"] == asked
        || m["profile"] == asked
        || m["aliases"].as_array().is_some_and(|a| a.iter().any(|x| x == asked));
    match named {
        true => Ok(()),
        false => Err(format!(
            "the swap to {asked} did not finish ({} serves; `sparkgate logs` and the swap_failed event say why)",
            m["name"].as_str().unwrap_or("?")
        )),
    }
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Show {
    /// One line, rewritten in place, with the time so far.
    Terminal,
    /// One line per phase, with the time it was reached.
    Lines,
    /// Nothing until the outcome, which is the final status as JSON.
    Json,
}

/// Polls `status()` until `goal` is reached, fails, or `args.timeout_s` passes.
pub(super) fn wait(
    goal: &Goal,
    args: &WaitArgs,
    mut status: impl FnMut() -> anyhow::Result<Value>,
) -> anyhow::Result<ExitCode> {
    let show = if args.json {
        Show::Json
    } else if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        Show::Terminal
    } else {
        Show::Lines
    };
    let started = Instant::now();
    let mut last: Option<Phase> = None;
    let mut out = std::io::stdout();
    loop {
        let now = status()?;
        let phase = phase_of(&now);
        let t = started.elapsed().as_secs_f64();
        match show {
            Show::Terminal => {
                write!(out, "\r\x1b[2K{phase} ({t:.0} s)")?;
                out.flush()?;
            }
            Show::Lines if last.as_ref() != Some(&phase) => writeln!(out, "{t:6.1} s  {phase}")?,
            _ => {}
        }
        last = Some(phase);
        let verdict = verdict(goal, &now);
        let timed_out = started.elapsed() >= Duration::from_secs(args.timeout_s);
        if verdict.is_some() || timed_out {
            if show == Show::Terminal {
                writeln!(out)?;
            }
            return Ok(conclude(goal, verdict, &now, t, show, args.timeout_s));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn conclude(
    goal: &Goal,
    verdict: Option<Result<(), String>>,
    status: &Value,
    t: f64,
    show: Show,
    timeout_s: u64,
) -> ExitCode {
    if show == Show::Json {
        println!("{}", serde_json::to_string_pretty(status).unwrap_or_default());
    }
    let (words, code) = match verdict {
        Some(Ok(())) => {
            let done = match (goal, phase_of(status)) {
                (Goal::Stopped, _) => format!("stopped in {t:.1} s"),
                (Goal::Model { name }, Phase::Ready { epoch, mode }) => {
                    format!("{name} serves, in {t:.1} s: epoch {epoch}, mode {}", shown(mode))
                }
                (_, Phase::Ready { epoch, mode }) => format!("ready in {t:.1} s: epoch {epoch}, mode {}", shown(mode)),
                (_, other) => format!("done in {t:.1} s: {other}"),
            };
            (done, ExitCode::SUCCESS)
        }
        Some(Err(why)) => (format!("sparkgate: did not come up: {why}"), ExitCode::FAILURE),
        None => (
            format!(
                "sparkgate: still {} after {timeout_s} s (--timeout-s); `sparkgate status` shows where it is",
                phase_of(status)
            ),
            ExitCode::from(2),
        ),
    };
    match (show, code == ExitCode::SUCCESS) {
        (Show::Json, _) => {}
        (_, true) => println!("{words}"),
        (_, false) => eprintln!("{words}"),
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(state: Value, open: bool) -> Value {
        json!({"admission": {"open": open, "in_flight": 2}, "supervisor": state})
    }

    #[test]
    fn phases_in_an_operators_words() {
        let ready = json!({"state": "ready", "epoch": 3, "mode": "dspark", "ranks": []});
        assert_eq!(
            phase_of(&status(ready.clone(), false)),
            Phase::Draining { in_flight: 2 }
        );
        assert_eq!(
            phase_of(&status(ready, true)).to_string(),
            "ready: epoch 3, mode dspark"
        );
        let starting = json!({"state": "starting", "epoch": 4, "ranks": [{"running": true}, {"running": false}]});
        assert_eq!(
            phase_of(&status(starting, false)).to_string(),
            "starting epoch 4: 1/2 ranks up, loading"
        );
        let backoff = json!({"state": "backoff", "epoch": 4, "reason": "rank 1 exited", "retry_in_s": 10.2});
        assert_eq!(
            phase_of(&status(backoff, false)).to_string(),
            "backing off 10 s after: rank 1 exited"
        );
        let stopping = json!({"state": "restarting", "epoch": 4, "reason": "operator"});
        assert_eq!(phase_of(&status(stopping, false)), Phase::Stopping);
    }

    #[test]
    fn a_wait_ends_on_its_goal_or_on_failure() {
        let ready = |epoch: u64, mode: &str| status(json!({"state": "ready", "epoch": epoch, "mode": mode}), true);
        let restart = Goal::Ready { after: 3 };
        assert_eq!(
            verdict(&restart, &ready(3, "dspark")),
            None,
            "the old epoch is not the outcome"
        );
        assert_eq!(verdict(&restart, &ready(4, "dspark")), Some(Ok(())));
        let failed = status(json!({"state": "failed", "epoch": 6, "reason": "budget spent"}), false);
        assert_eq!(verdict(&restart, &failed), Some(Err("budget spent".into())));
        let switch = Goal::Mode {
            mode: SpecMethod::None,
            after: 3,
        };
        assert_eq!(verdict(&switch, &ready(4, "dspark")), None);
        assert_eq!(verdict(&switch, &ready(4, "none")), Some(Ok(())));
        let stopped = status(json!({"state": "stopped", "epoch": 4}), false);
        assert_eq!(verdict(&Goal::Stopped, &stopped), Some(Ok(())));
        assert_eq!(verdict(&Goal::Stopped, &ready(4, "none")), None);
    }
}
