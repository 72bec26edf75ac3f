//! A generation from its head to its answer: the stages in order (`prepare` → `admit` →
//! `send` → `respond`), then its outcome written once — a stream's line is the relay's when it
//! ends; a whole answer's or a refusal's is written here, its usage durable before its head
//! goes out — with the request metrics.

use axum::response::Response;
use metrics::counter;

use super::account::{Account, Ending};
use super::admit::admit;
use super::context::Ctx;
use super::prepare::prepare;
use super::respond::{respond, Reply};
use super::send::send;
use crate::api::body::RequestBody;
use crate::api::error::GatewayError;
use crate::observe::{self, TraceStage};
use std::time::Instant;

pub(super) async fn generate(mut ctx: Ctx<'_>, body: impl RequestBody) -> Response {
    let trace = ctx.trace.take();
    let mut account = Some(Account::open(ctx.shared, &ctx.caller, ctx.route.label).traced(trace));
    let result = stages(&ctx, &mut account, body).await;
    ctx.pending.answered();
    finish(&ctx, account, result).await
}

/// The stages; a stream takes the account with it (the relay closes it when the stream ends).
async fn stages(ctx: &Ctx<'_>, account: &mut Option<Account>, body: impl RequestBody) -> Result<Reply, GatewayError> {
    let open = account.as_mut().expect("the account is open until the answer");
    let from = Instant::now();
    let req = prepare(ctx, open, body).await?;
    open.mark(TraceStage::Normalize, from, Instant::now());
    let permit = admit(ctx, &req, open).await?;
    let from = Instant::now();
    let sent = send(ctx, &req, permit).await?;
    open.sent(ctx.request_id, &sent.dispatched.group.name, (from, sent.leased));
    respond(ctx, req, sent, account).await
}

/// The answer's log line and metrics, by how the stages ended; a whole answer (or a refusal)
/// leaves once its usage is durable.
async fn finish(ctx: &Ctx<'_>, account: Option<Account>, result: Result<Reply, GatewayError>) -> Response {
    let label = ctx.route.label;
    let (resp, whole) = match result {
        // A stream's line is written by the relay when the stream ends.
        Ok(Reply::Stream(resp)) => (resp, None),
        Ok(Reply::Whole { resp, usage, model }) => {
            let outcome = if resp.status().is_success() {
                "completed"
            } else {
                "upstream_error"
            };
            (resp, Some((usage, model, outcome)))
        }
        Err(e) => {
            let outcome = match e.rejection() {
                Some(reason) => {
                    counter!(observe::REJECTIONS, "reason" => reason.label()).increment(1);
                    reason.label()
                }
                None => e.stream_end().label(),
            };
            (
                e.render(ctx.route.family),
                Some((observe::Usage::default(), None, outcome)),
            )
        }
    };
    if let (Some(account), Some((usage, _, outcome))) = (account, &whole) {
        account.close(usage, Ending::of(outcome)).durable().await;
    }
    let elapsed = ctx.started().elapsed();
    if let Some((usage, model, outcome)) = whole {
        observe::generation_done(&observe::Finished {
            request_id: ctx.request_id,
            route: label,
            status: resp.status().as_u16(),
            model: model.as_deref(),
            usage,
            ttft: None,
            duration: elapsed,
            outcome,
        });
    }
    observe::request_done(label, resp.status().as_u16(), elapsed.as_secs_f64());
    resp
}
