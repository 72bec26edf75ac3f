//! A request on an upstream route, as named stages, its key's `account` kept along the way
//! (quota, fair charge, usage). A generation goes `prepare` → `admit` →
//! `send` (lease a group's slot and send, or go back to the queue: `send::Attempt`) →
//! `respond` (the relayed stream or the whole body), each a function over the one context
//! (`context::Ctx`), and `generate` writes its one log line and metrics; utilities and the rest
//! of vLLM's surface are forwarded (`forward`). Below the stages: the response body (`relay`), the slots an answer holds (`hold`) and the
//! client-gone accounting (`pending`); a stream cut by its group's loss is recorded (`trace`)
//! and continued (`resume`, docs/resume.md): from its token ids, or replayed and spliced past
//! what was sent (`splice`).

mod account;
mod admit;
mod answer;
mod chain;
mod context;
mod forward;
mod generate;
mod hold;
mod pending;
mod prepare;
pub(crate) mod relay;
mod respond;
mod resume;
mod send;
mod splice;
mod stored;
mod trace;

use axum::response::Response;

use crate::api::body::RequestBody;
use crate::api::error::GatewayError;
use crate::api::routes::{Role, Route};
use crate::app::App;
use crate::control::clients::Caller;

/// A request on an upstream route (`routes::ROUTES`): the methods it answers, then its role's
/// handler. Called by `http::dispatch` after the edge steps, without a router in between.
pub(crate) async fn upstream_route(
    app: &std::sync::Arc<App>,
    route: &'static Route,
    request_id: &str,
    req: hyper::Request<impl RequestBody>,
    caller: Caller,
) -> Response {
    if !route.methods.allow(req.method()) {
        return GatewayError::MethodNotAllowed.render(route.family);
    }
    let (parts, body) = req.into_parts();
    match route.role {
        Role::Generate(api) => {
            let ctx = context::Ctx::new(app, request_id, route, api, caller, parts.headers);
            generate::generate(ctx, body).await
        }
        Role::Utility => forward::utility(app, request_id, parts, body)
            .await
            .unwrap_or_else(|e| e.render(route.family)),
        // With MODELS, or a key limited to some, the gateway lists the models itself.
        Role::Forward if route.label == "models" && forward::lists_models(app, &caller) => {
            forward::models(app, &caller)
        }
        Role::Forward => forward::passthrough(app, request_id, parts, body)
            .await
            .unwrap_or_else(|e| e.render(route.family)),
        Role::Stored => stored::answer(app, &parts.method, parts.uri.path(), parts.uri.query(), &caller).await,
    }
}
