//! Stage 1, `prepare`: the body read within its limits, parsed and normalised, then every check
//! that needs no slot — the ranks stopped or failed, a quarantined body, more sequences than a
//! group holds — and what admission and routing read of it.

use metrics::counter;

use super::account::Account;
use super::answer::quarantined;
use super::context::{Ctx, Prepared};
use crate::api::body::{check_content_type, RequestBody};
use crate::api::error::GatewayError;
use crate::control::state::UpstreamState;
use crate::observe;

pub(super) async fn prepare(
    ctx: &Ctx<'_>,
    account: &mut Account,
    body: impl RequestBody,
) -> Result<Prepared, GatewayError> {
    let app = ctx.app;
    check_content_type(&ctx.headers)?;
    let bytes = crate::api::body::read(body).await?;
    let crate::api::body::Prepared {
        norm,
        forward,
        user,
        priority,
        output_limit,
        session,
    } = crate::api::body::prepare(&app.models, (app.groups.rules(), app.fallback_model()), ctx.api, bytes).await?;
    for rule in &norm.repairs {
        counter!(observe::REPAIRS, "rule" => rule.label()).increment(1);
    }
    if let Some((from, to)) = &norm.effort_mapping {
        counter!(observe::EFFORT_MAPPINGS, "from" => from.clone(), "to" => to.clone()).increment(1);
    }
    match app.control.upstream() {
        UpstreamState::Failed(reason) => return Err(GatewayError::NotRunning(reason)),
        UpstreamState::Stopped => return Err(GatewayError::NotRunning("the ranks were stopped by an operator".into())),
        _ => {}
    }
    // A body quarantined twice (under two requests) is refused before it reaches a rank.
    if let Some(refused) = app.quarantine.refuses(&forward) {
        return Err(quarantined(ctx.request_id, &ctx.caller, Some(refused)));
    }
    let (forward, stored) = match (ctx.api, &app.store) {
        (crate::api::family::Api::Responses, Some(slot)) => super::chain::resolve(ctx, slot, forward).await?,
        _ => (forward, None),
    };
    let seqs = norm.sequences;
    let model = norm.model_id;
    model_allowed(ctx, model)?;
    // A request runs on one group: with several, its sequences must fit the largest (with
    // MODELS, its own model's).
    let capacity = app.groups.capacity_for(model);
    if app.groups.all().len() > 1 && seqs.total() > capacity {
        return Err(seqs.refusal(capacity));
    }
    // Over its key's quota, it is refused before it takes a place in the queue.
    account.reserve(&norm, output_limit, forward.len())?;
    // A conversation the client names stays on its group; else its prefix routes it.
    let prefix = app
        .groups
        .wants_prefix()
        .then(|| session_key(ctx, session.as_deref()).or_else(|| crate::groups::prefix_key(&forward)))
        .flatten();
    let client = account.client(
        app.clients
            .identify(&ctx.caller, &ctx.headers, user.as_deref(), priority),
    );
    Ok(Prepared {
        norm,
        forward,
        prefix,
        client,
        seqs,
        stored,
    })
}

/// A key limited to some models (`models=`) asks for one of them; with SWAP_POLICY=manual, a
/// model neither loaded nor being loaded is refused (an operator swaps).
fn model_allowed(ctx: &Ctx<'_>, model: crate::api::models::ModelId) -> Result<(), GatewayError> {
    let app = ctx.app;
    let n = app.models.get(model);
    if let Some(allowed) = ctx.caller.key.as_ref().and_then(|k| k.settings.models.as_ref()) {
        if !app.models.allows(allowed, model) {
            return Err(GatewayError::ModelForbidden {
                model: n.served().to_owned(),
                allowed: allowed.join(", "),
            });
        }
    }
    let Some(swapper) = &app.swapper else { return Ok(()) };
    let (loaded, target) = (swapper.loaded(), swapper.target());
    let elsewhere = Some(model) != loaded && Some(model) != target && (loaded.is_some() || target.is_some());
    if swapper.policy == sparkgate_config::SwapPolicy::Manual && elsewhere {
        return Err(app.not_loaded(
            model,
            format!(
                "SWAP_POLICY=manual: an operator loads it with `sparkgate model {}`",
                n.profile()
            ),
        ));
    }
    Ok(())
}

/// The conversation a request names for routing: the SESSION_HEADER's value, else Anthropic's
/// `metadata.user_id` — hashed apart from prefix keys, so the group that served it keeps it.
fn session_key(ctx: &Ctx<'_>, user_id: Option<&str>) -> Option<u64> {
    let header = ctx
        .app
        .session_header
        .as_ref()
        .and_then(|h| ctx.headers.get(h))
        .and_then(|v| v.to_str().ok());
    header
        .or(user_id)
        .filter(|v| !v.is_empty())
        .map(crate::groups::session_key)
}
