//! Telling systemd the truth about the service (sd_notify over NOTIFY_SOCKET; nothing is sent
//! when systemd did not start the gateway): `READY=1` once the gateway listens and can serve —
//! a group is Ready, or no group is starting any more (every one failed or stopped: the gateway
//! is up and answers 503 and `/admin`, the STATUS says why), or at once in gateway-only mode
//! (the upstream is someone else's); `STATUS=` each group's state in words on every change;
//! `WATCHDOG=1` only while the event loop runs and every supervisor's actor answers a ping;
//! `STOPPING=1` at the drain; `RELOADING=1` … `READY=1` around a SIGHUP's reload.

use std::time::Duration;

use sd_notify::NotifyState;
use sparkgate_supervisor::{GroupState, SupervisorHandle};

/// Sends `states`; a failure is logged once at DEBUG (systemd is gone or never was).
fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Whether systemd listens for notifications (NOTIFY_SOCKET is set).
fn listening() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// Shutdown begins: the drain.
pub(crate) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining: shutting down")]);
}

/// A reload (SIGHUP) begins; `reloaded` ends it.
pub(crate) fn reloading() {
    // systemd 253+ wants the monotonic time beside RELOADING=1 (Type=notify-reload).
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

pub(crate) fn reloaded() {
    send(&[NotifyState::Ready]);
}

/// A group's state in an operator's words.
fn words(name: &str, state: &GroupState) -> String {
    let what = match state {
        GroupState::Stopped => "stopped".to_owned(),
        GroupState::Starting { epoch } => format!("starting (epoch {epoch})"),
        GroupState::Ready { epoch } => format!("ready (epoch {epoch})"),
        GroupState::Restarting { reason, .. } => format!("restarting: {reason}"),
        GroupState::Backoff { reason, retry_in_s } => format!("retrying in {retry_in_s:.0} s after: {reason}"),
        GroupState::Stopping => "stopping".to_owned(),
        GroupState::Failed { reason } => format!("failed: {reason}"),
        GroupState::ShuttingDown => "shutting down".to_owned(),
    };
    format!("{name} {what}")
}

/// What the groups' states say to systemd.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Told {
    /// The gateway can serve, or will not get further by waiting.
    ready: bool,
    status: String,
}

/// The readiness and status of `groups` (name, state); empty is gateway-only mode.
fn tell(groups: &[(String, GroupState)]) -> Told {
    if groups.is_empty() {
        return Told {
            ready: true,
            status: "serving (gateway only: the upstream is not supervised)".to_owned(),
        };
    }
    let any_ready = groups.iter().any(|(_, s)| matches!(s, GroupState::Ready { .. }));
    let settled = groups.iter().all(|(_, s)| {
        matches!(
            s,
            GroupState::Failed { .. } | GroupState::Stopped | GroupState::Ready { .. }
        )
    });
    let states: Vec<String> = groups.iter().map(|(n, s)| words(n, s)).collect();
    let lead = match (any_ready, settled) {
        (true, _) => "serving",
        (false, true) => "up, no group ready (answering 503; `sparkgate start` or fix and restart)",
        (false, false) => "starting",
    };
    Told {
        ready: any_ready || settled,
        status: format!("{lead}: {}", states.join("; ")),
    }
}

/// Follows the groups' states: STATUS on every change, READY=1 the first time `tell` says so;
/// and the watchdog, when systemd asked for one (WATCHDOG_USEC).
pub(crate) fn start(handles: Vec<(String, SupervisorHandle)>) {
    if !listening() {
        return;
    }
    if let Some(every) = sd_notify::watchdog_enabled() {
        let alive: Vec<SupervisorHandle> = handles.iter().map(|(_, h)| h.clone()).collect();
        sparkgate_task::spawn("systemd-watchdog", watchdog(alive, every));
    }
    sparkgate_task::spawn("systemd-status", follow(handles));
}

async fn follow(handles: Vec<(String, SupervisorHandle)>) {
    for (_, h) in &handles {
        h.begun().await;
    }
    let mut watches: Vec<_> = handles.iter().map(|(_, h)| h.subscribe()).collect();
    let (mut ready, mut last) = (false, String::new());
    loop {
        let states: Vec<(String, GroupState)> = handles
            .iter()
            .zip(&watches)
            .map(|((n, _), w)| (n.clone(), w.borrow().state.clone()))
            .collect();
        let told = tell(&states);
        if told.status != last || (told.ready && !ready) {
            match (told.ready && !ready, told.status.as_str()) {
                (true, status) => send(&[NotifyState::Ready, NotifyState::Status(status)]),
                (false, status) => send(&[NotifyState::Status(status)]),
            }
            ready |= told.ready;
            last = told.status;
        }
        if watches.is_empty() {
            return;
        }
        let changed = futures_util::future::select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        if changed.await.0.is_err() {
            return;
        }
    }
}

/// `WATCHDOG=1` every half period, while every actor answers within that half.
async fn watchdog(handles: Vec<SupervisorHandle>, every: Duration) {
    let half = every / 2;
    let mut tick = tokio::time::interval(half);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let answers = futures_util::future::join_all(handles.iter().map(|h| h.alive(half))).await;
        if answers.iter().all(|a| *a) {
            send(&[NotifyState::Watchdog]);
        } else {
            tracing::error!(
                "a supervisor's actor did not answer within {} s: no watchdog ping (systemd restarts the gateway once WatchdogSec passes)",
                half.as_secs_f64()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(name: &str, state: GroupState) -> (String, GroupState) {
        (name.to_owned(), state)
    }

    #[test]
    fn ready_once_a_group_serves_or_nothing_is_starting_any_more() {
        let starting = tell(&[g("main", GroupState::Starting { epoch: 1 })]);
        assert_eq!(
            (starting.ready, starting.status.as_str()),
            (false, "starting: main starting (epoch 1)")
        );
        let ready = tell(&[
            g("g1", GroupState::Ready { epoch: 2 }),
            g("g2", GroupState::Starting { epoch: 1 }),
        ]);
        assert!(ready.ready);
        assert_eq!(ready.status, "serving: g1 ready (epoch 2); g2 starting (epoch 1)");
        let failed = tell(&[g(
            "main",
            GroupState::Failed {
                reason: "rank 1 exited".into(),
            },
        )]);
        assert!(
            failed.ready,
            "a failed group does not hold the start: the gateway is up"
        );
        assert!(failed.status.starts_with("up, no group ready"), "{}", failed.status);
        assert!(
            failed.status.ends_with("main failed: rank 1 exited"),
            "{}",
            failed.status
        );
        let backoff = tell(&[g(
            "main",
            GroupState::Backoff {
                reason: "oom".into(),
                retry_in_s: 4.0,
            },
        )]);
        assert!(!backoff.ready, "a retry is still coming");
        assert!(tell(&[]).ready, "gateway-only mode is ready once it listens");
    }
}
