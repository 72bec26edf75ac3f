//! Stage 2, `admit`: a place in the admission queue until permits for all of the request's
//! sequences are free (the fair queue's order, its preferred group's slot reserved), then the
//! queue's and the gateway's own time recorded.

use std::time::Instant;

use super::account::Account;
use super::context::{Ctx, Prepared};
use super::pending::Waiting;
use crate::api::error::GatewayError;
use crate::control::admission::Permit;
use crate::observe;

pub(super) async fn admit(ctx: &Ctx<'_>, req: &Prepared, account: &mut Account) -> Result<Permit, GatewayError> {
    let app = ctx.app;
    let queued_at = Instant::now();
    let prefer = app.groups.preference(req.prefix);
    ctx.pending.at(Waiting::Queue);
    let model = req.norm.model_id;
    // Its model is not the one loaded: its wait is a swap's (MODELS).
    let swapping = app.swapper.as_ref().is_some_and(|s| s.loaded() != Some(model));
    let permit = app
        .control
        .admission()
        .acquire_for((req.seqs.total(), req.forward.len(), model), &req.client, prefer)
        .await
        .map_err(|e| match e {
            GatewayError::OverCapacity { capacity, .. } => req.seqs.refusal(capacity),
            e => e,
        })?;
    let waited = queued_at.elapsed();
    if swapping {
        metrics::histogram!(observe::MODEL_SWAP_WAIT_SECONDS).record(waited.as_secs_f64());
    }
    account.admitted(req.client, waited);
    account.mark(crate::observe::TraceStage::QueueWait, queued_at, queued_at + waited);
    ctx.pending.at(Waiting::Upstream);
    observe::queue_wait(waited.as_secs_f64());
    let snap = app.control.snapshot();
    observe::admission(snap.queued, snap.in_use);
    // The gateway's own time before the upstream request: everything but the queue wait.
    observe::overhead(ctx.started().elapsed().saturating_sub(waited).as_secs_f64());
    Ok(permit)
}
