//! Each rank group's lifecycle as metrics (docs/operations.md), set from its supervisor's
//! published status: restarts by reason and whether an operator asked for them, the epoch, the
//! state and since when, a stall's length, the last restart's time, and what LOG_DIR retention
//! removed.

use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use sparkgate_supervisor::{GroupState, Status};

pub(crate) const GROUP_RESTARTS: &str = "sparkgate_group_restarts_total";
pub(crate) const GROUP_EPOCH: &str = "sparkgate_group_epoch";
pub(crate) const GROUP_STATE: &str = "sparkgate_group_state";
pub(crate) const GROUP_STATE_SINCE: &str = "sparkgate_group_state_since_timestamp_seconds";
pub(crate) const GROUP_LAST_RESTART: &str = "sparkgate_group_last_restart_timestamp_seconds";
pub(crate) const GROUP_STALLED: &str = "sparkgate_group_stalled_seconds";
pub(crate) const LOG_EPOCHS_REMOVED: &str = "sparkgate_log_epochs_removed_total";
pub(crate) const LOG_BYTES_REMOVED: &str = "sparkgate_log_bytes_removed_total";

pub(super) fn describe() {
    describe_counter!(
        GROUP_RESTARTS,
        "Restarts of a running rank group, by group, reason (operator, spec_switch, crashed, killed, unreachable, unwell, memory, failed_start) and planned (true: an operator or the speculation policy asked)."
    );
    describe_gauge!(GROUP_EPOCH, "Each group's current epoch (one per start).");
    describe_gauge!(
        GROUP_STATE,
        "Each group's state: 1 for the one it is in (stopped, starting, ready, restarting, backoff, stopping, failed, shutting_down), 0 for the others."
    );
    describe_gauge!(
        GROUP_STATE_SINCE,
        Unit::Seconds,
        "When each group entered its current state (Unix time): time() minus it is the time in the state."
    );
    describe_gauge!(
        GROUP_LAST_RESTART,
        Unit::Seconds,
        "When each group last restarted (Unix time), by its reason."
    );
    describe_gauge!(
        GROUP_STALLED,
        Unit::Seconds,
        "Seconds each serving group has had work pending and no engine step (0: stepping); STALL_TIMEOUT restarts it."
    );
    describe_counter!(
        LOG_EPOCHS_REMOVED,
        "Old epochs' log directories removed by LOG_KEEP_EPOCHS / LOG_KEEP_BYTES."
    );
    describe_counter!(
        LOG_BYTES_REMOVED,
        "Bytes of old epochs' logs removed by LOG_KEEP_EPOCHS / LOG_KEEP_BYTES."
    );
}

/// Sets `group`'s lifecycle metrics from its supervisor's `status`.
pub(crate) fn published(group: &str, status: &Status) {
    let g = || group.to_owned();
    for c in &status.restart_counts {
        let planned = if c.planned { "true" } else { "false" };
        counter!(GROUP_RESTARTS, "group" => g(), "reason" => c.reason.label(), "planned" => planned).absolute(c.count);
    }
    gauge!(GROUP_EPOCH, "group" => g()).set(status.epoch as f64);
    let now = status.state.name();
    for state in GroupState::NAMES {
        gauge!(GROUP_STATE, "group" => g(), "state" => state).set(f64::from(u8::from(state == now)));
    }
    gauge!(GROUP_STATE_SINCE, "group" => g()).set(status.state_since_unix);
    gauge!(GROUP_STALLED, "group" => g()).set(status.stalled_s.unwrap_or(0.0));
    if let Some(last) = &status.last_restart {
        let reason = last
            .cause
            .map_or("planned", |c| sparkgate_supervisor::RestartReason::of_cause(c).label());
        gauge!(GROUP_LAST_RESTART, "group" => g(), "reason" => reason).set(last.at_unix as f64);
    }
    counter!(LOG_EPOCHS_REMOVED, "group" => g()).absolute(status.logs_pruned.epochs);
    counter!(LOG_BYTES_REMOVED, "group" => g()).absolute(status.logs_pruned.bytes);
}
