//! Stage 3, `send`: lease a slot on a group and send the request to its rank 0, until rank 0
//! answers. One try is an `Attempt`: answered; back to the queue (no group had room just now, or
//! the group was lost before vLLM answered); or back to the queue once another suspect's
//! probation on that group is over. A request vLLM held when its group was lost is judged by
//! `quarantine` on the way back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Method;

use super::answer::{quarantined, unreachable, until_closed};
use super::context::{Ctx, Prepared, Sent};
use super::hold::Held;
use crate::api::error::GatewayError;
use crate::control::admission::Permit;
use crate::groups::{Group, Lease, Lost};
use crate::quarantine::{Dispatched, Suspect, Verdict, PROBATION_FROM};
use crate::upstream::UpstreamError;

/// What one try came to.
// One value per try, moved once: a box would be an allocation per request on the hot path.
#[allow(clippy::large_enum_variant)]
enum Attempt {
    Answered(Sent),
    /// To the head of the queue, for the group that comes up.
    Requeue,
    /// Another twice-lost suspect is on trial on this group: its outcome first, then the queue.
    AwaitProbation(Arc<Group>),
}

/// What the tries of one request carry from one to the next.
struct Tries {
    /// The request's losses so far (`quarantine`).
    strikes: u32,
    /// When a try first failed to reach a rank: requeued tries end after REQUEST_TIMEOUT.
    refused_at: Option<Instant>,
    /// How long rank 0 has to begin its answer.
    limit: Duration,
}

/// A send that failed before any answer began, with the slots it still holds.
struct Unanswered {
    slots: (Lease, Permit),
    dispatched: Dispatched,
    err: UpstreamError,
}

pub(super) async fn send(ctx: &Ctx<'_>, req: &Prepared, mut permit: Permit) -> Result<Sent, GatewayError> {
    let app = ctx.app;
    let limit = if req.norm.stream {
        app.first_token_timeout
    } else {
        app.request_timeout
    };
    let mut tries = Tries {
        strikes: 0,
        refused_at: None,
        limit,
    };
    loop {
        match attempt(ctx, req, permit, &mut tries).await? {
            Attempt::Answered(sent) => return Ok(sent),
            Attempt::AwaitProbation(group) => group.probation_over().await,
            Attempt::Requeue => {}
        }
        permit = app
            .control
            .admission()
            .requeue_for(req.seqs.total(), req.forward.len(), req.norm.model_id)
            .await?;
    }
}

/// One try: a lease (admission counted the open groups' slots, so one has room unless it
/// closed just now), then the request sent under it.
async fn attempt(
    ctx: &Ctx<'_>,
    req: &Prepared,
    mut permit: Permit,
    tries: &mut Tries,
) -> Result<Attempt, GatewayError> {
    let app = ctx.app;
    let Some(mut lease) = app.groups.lease(
        req.prefix,
        permit.take_reservation(),
        req.seqs.total(),
        req.norm.model_id,
    ) else {
        return Ok(Attempt::Requeue);
    };
    let leased = Instant::now();
    let group = lease.shared();
    if tries.strikes > 0 {
        lease.mark_suspect();
    }
    if tries.strikes >= PROBATION_FROM && !lease.on_probation() {
        return Ok(Attempt::AwaitProbation(group));
    }
    let dispatched = Dispatched::now(group.clone(), req.seqs.total(), tries.strikes > 0);
    // Boxed: inline, the upstream exchange's state would make every enclosing stage's future
    // as large, and each move of one a copy of it.
    let send = Box::pin(group.upstream.send(
        Method::POST,
        ctx.route.path,
        &ctx.headers,
        ctx.request_id,
        req.forward.clone(),
    ));
    // Held while sending: a client that leaves now hands the slots to the abort fence.
    let held = Held::new(lease, permit);
    let sent = until_closed(app, tokio::time::timeout(tries.limit, send)).await;
    let slots = held.into_parts();
    match sent {
        Err(drained) => Err(drained),
        Ok(Err(_)) => {
            // Given up on: vLLM holds it until it sees the connection close.
            slots.0.release_after_abort(slots.1);
            Err(GatewayError::UpstreamTimeout { after: tries.limit })
        }
        Ok(Ok(Ok(upstream))) => Ok(Attempt::Answered(Sent {
            upstream,
            lease: slots.0,
            permit: slots.1,
            dispatched,
            strikes: tries.strikes,
            leased,
        })),
        Ok(Ok(Err(err))) => unanswered(ctx, req, tries, Unanswered { slots, dispatched, err }).await,
    }
}

/// No answer has begun, so nothing reached the client. A refused connect never reached vLLM;
/// any other failure to send counts as not reached when the group it went to is lost (the
/// supervisor's verdict, within a second). Either way the request goes back to the head of the
/// queue — within REQUEST_TIMEOUT of its first such failure.
async fn unanswered(
    ctx: &Ctx<'_>,
    req: &Prepared,
    tries: &mut Tries,
    failed: Unanswered,
) -> Result<Attempt, GatewayError> {
    let Unanswered { slots, dispatched, err } = failed;
    let group = dispatched.group.clone();
    let in_window = dispatched.epoch.is_some()
        && tries.refused_at.get_or_insert_with(Instant::now).elapsed() < ctx.app.request_timeout;
    if !in_window {
        return Err(unreachable(&group, &err));
    }
    // Its slots (and a suspect's probation) stay taken until the verdict: a rank that just
    // died may still accept a connection while its process ends, and a queued request sent
    // into that moment would be lost under the same crash.
    let lost = group.lost_since(dispatched.epoch).await;
    drop(slots);
    let never_reached = err.is_connect();
    if !(lost.is_some() || never_reached || group.restarting()) {
        return Err(unreachable(&group, &err));
    }
    // vLLM held it when the group failed: a suspect, or a poison request. A group stopped on
    // purpose says nothing of the requests it held.
    if let (Some(Lost::Failed(cause)), false) = (lost, never_reached) {
        let (verdict, strikes) = suspect(ctx, req, tries.strikes, dispatched).judge(cause).await;
        if matches!(verdict, Verdict::Quarantined(_)) {
            return Err(quarantined(ctx.request_id, &ctx.caller, None));
        }
        tries.strikes = strikes;
    }
    Ok(Attempt::Requeue)
}

/// The request as the quarantine judges it, should its group be lost under it.
pub(super) fn suspect(ctx: &Ctx<'_>, req: &Prepared, strikes: u32, dispatched: Dispatched) -> Suspect {
    Suspect {
        strikes,
        quarantine: ctx.app.quarantine.clone(),
        body: req.forward.clone(),
        dispatched,
        request_id: ctx.request_id.to_owned(),
        client: ctx.caller.clone(),
    }
}
