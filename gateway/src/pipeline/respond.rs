//! Stage 4, `respond`: rank 0's answer to the client. A successful stream is relayed event by
//! event (`relay`), holding its slots until it ends; anything else is complete upstream work,
//! read whole within REQUEST_TIMEOUT, its tokens counted, its bytes passed through.

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use http_body_util::BodyExt;

use super::account::Account;
use super::answer::{error_chain, response_head, until_closed};
use super::context::{Ctx, Prepared, Sent};
use super::hold::{Held, HoldPermit};
use super::send::suspect;
use crate::api::error::GatewayError;
use crate::api::family::Framing;
use crate::observe;
use crate::pipeline::relay::{relay, RelayCtx, ResumePlan};
use crate::pipeline::trace::Trace;

/// What a generation answered: a stream (the relay writes its log line when it ends), or a
/// whole body with its usage.
pub(super) enum Reply {
    Stream(Response),
    Whole {
        resp: Response,
        usage: observe::Usage,
        model: Option<std::sync::Arc<str>>,
    },
}

pub(super) async fn respond(
    ctx: &Ctx<'_>,
    req: Prepared,
    mut sent: Sent,
    account: &mut Option<Account>,
) -> Result<Reply, GatewayError> {
    let is_sse = sent
        .upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    // With MODELS a replay could reach another model's ranks: no warm replays there.
    let warms = sent.upstream.status().is_success() && !ctx.app.groups.models();
    if let Some(warm) = ctx.app.warm.as_ref().filter(|_| warms) {
        use crate::api::family::Api;
        if matches!(ctx.api, Api::Chat | Api::Completions | Api::Messages | Api::Responses) {
            warm.remember(ctx.route.path, &req.forward);
        }
    }
    let mut head = response_head(&mut sent.upstream);
    if ctx.app.groups.replicas() {
        // Which group answered, for clients and operators that follow a conversation's group.
        head = head.header("x-sparkgate-group", sent.lease.group().name.as_str());
    }
    if req.norm.stream && is_sse && sent.upstream.status().is_success() {
        return Ok(stream(ctx, req, sent, head, account.take()));
    }
    whole(ctx, req, sent, head, account.as_mut()).await
}

/// The relayed stream, holding the request's slots until it ends (or hands them to the abort
/// fence when it is cut), with what continuing it would need when it can be (docs/resume.md).
fn stream(
    ctx: &Ctx<'_>,
    req: Prepared,
    sent: Sent,
    head: axum::http::response::Builder,
    account: Option<Account>,
) -> Reply {
    let app = ctx.app;
    let trace = req.norm.resume.map(Trace::new);
    let resume = trace.as_ref().map(|_| {
        Box::new(ResumePlan {
            app: ctx.shared.clone(),
            headers: ctx.headers.clone(),
            forward: req.forward.clone(),
            path: ctx.route.path,
            prefix: req.prefix,
            model: req.norm.model_id,
        })
    });
    let relay_ctx = RelayCtx {
        started: ctx.started(),
        usage_injected: req.norm.usage_injected,
        framing: Framing::of(ctx.route.family, ctx.api),
        first_token_timeout: app.first_token_timeout,
        idle_timeout: app.idle_timeout,
        mode: sent.lease.group().mode(),
        control: app.control.clone(),
        request_id: ctx.request_id.to_owned(),
        route: ctx.route.label,
        model: req.norm.model.clone(),
        drain_timeout: app.drain_timeout,
        suspect: Some(suspect(ctx, &req, sent.strikes, sent.dispatched)),
        held: Some(Held::new(sent.lease, sent.permit)),
        resume,
        stored: req.stored.clone(),
        account,
    };
    let events = relay(sent.upstream.into_body(), relay_ctx, trace);
    Reply::Stream(head.body(Body::new(events)).expect("valid response parts"))
}

/// Non-streaming (or an upstream error before streaming): the body is complete upstream work.
async fn whole(
    ctx: &Ctx<'_>,
    req: Prepared,
    sent: Sent,
    head: axum::http::response::Builder,
    account: Option<&mut Account>,
) -> Result<Reply, GatewayError> {
    let app = ctx.app;
    let (status, mode) = (sent.upstream.status(), sent.lease.group().mode());
    let held = Held::new(sent.lease, sent.permit);
    let read = tokio::time::timeout(app.request_timeout, sent.upstream.into_body().collect());
    let bytes = match until_closed(app, read).await? {
        Err(_) => {
            return Err(GatewayError::UpstreamTimeout {
                after: app.request_timeout,
            })
        }
        Ok(Err(e)) => {
            return Err(GatewayError::UpstreamUnreachable {
                upstream: held.group().upstream.base().to_owned(),
                detail: error_chain(&e),
            })
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    if let Some(a) = account {
        a.saw(&bytes);
        a.first_token(false);
    }
    let usage = observe::Usage::of_body(&bytes);
    if let (true, Some(t)) = (status.is_success(), usage.completion) {
        app.control.count_tokens(mode, t);
    }
    // Stored before the answer's first byte goes out (docs/store.md).
    let bytes = match &req.stored {
        Some(plan) if status.is_success() => super::chain::persist_body(plan, bytes).await,
        _ => bytes,
    };
    // vLLM has finished it: the slots go back with the answer's last byte.
    let body = HoldPermit::new(http_body_util::Full::new(bytes), held);
    Ok(Reply::Whole {
        resp: head.body(Body::new(body)).expect("valid response parts"),
        usage,
        model: req.norm.model,
    })
}
