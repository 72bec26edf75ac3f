//! The one struct every stage of a generation takes (`Ctx`), and what the stages hand on:
//! `Prepared` (the body as it will be sent, with what admission and routing read of it) and
//! `Sent` (rank 0's answer with the slots it holds).

use std::time::Instant;

use axum::http::HeaderMap;
use bytes::Bytes;

use super::pending::Pending;
use crate::api::family::Api;
use crate::api::normalize::{Normalized, Sequences};
use crate::api::routes::Route;
use crate::app::App;
use crate::control::admission::Permit;
use crate::control::clients::Caller;
use crate::control::fairq::Client;
use crate::groups::Lease;
use crate::quarantine::Dispatched;
use crate::upstream::UpstreamBody;

/// One generation on its way through the stages.
pub(super) struct Ctx<'a> {
    pub(super) app: &'a App,
    /// The same, shared: what outlives the stages (a stream's continuation) holds it.
    pub(super) shared: &'a std::sync::Arc<App>,
    pub(super) request_id: &'a str,
    pub(super) route: &'static Route,
    pub(super) api: Api,
    pub(super) caller: Caller,
    pub(super) headers: HeaderMap,
    /// Where it waits until its answer begins (for the client-gone count); its start time.
    pub(super) pending: Pending<'a>,
    /// Its trace when tracing is on (taken by its account).
    pub(super) trace: Option<crate::observe::otel::RequestTrace>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(
        shared: &'a std::sync::Arc<App>,
        request_id: &'a str,
        route: &'static Route,
        api: Api,
        caller: Caller,
        mut headers: HeaderMap,
    ) -> Ctx<'a> {
        let pending = Pending::new(request_id, route.label, Instant::now());
        // Begun before anything is sent: rank 0 is sent the trace's `traceparent`.
        let trace = crate::observe::otel::RequestTrace::begin(&mut headers, route.label);
        Ctx {
            app: shared,
            shared,
            request_id,
            route,
            api,
            caller,
            headers,
            pending,
            trace,
        }
    }

    pub(super) fn started(&self) -> Instant {
        self.pending.started
    }
}

/// What `prepare` made of the request.
pub(super) struct Prepared {
    pub(super) norm: Normalized,
    /// The body as it is sent to rank 0.
    pub(super) forward: Bytes,
    /// Its conversation's prefix, when groups are routed by prefix affinity.
    pub(super) prefix: Option<u64>,
    /// Who it is for in the admission queue.
    pub(super) client: Client,
    /// The sequences it makes vLLM run: the permits and group slots it takes.
    pub(super) seqs: Sequences,
    /// A Responses request whose answer is stored (docs/store.md).
    pub(super) stored: Option<std::sync::Arc<StorePlan>>,
}

/// What storing a Responses answer needs: its owner, the full input it was generated from (the
/// chain resolved), and the `previous_response_id` it named.
#[derive(Debug)]
pub(crate) struct StorePlan {
    pub(crate) store: sparkgate_store::Store,
    pub(crate) owner: String,
    pub(crate) input: serde_json::Value,
    pub(crate) previous: Option<String>,
}

/// Rank 0's answer to a sent request, with the slots it holds until the answer ends.
pub(super) struct Sent {
    pub(super) upstream: hyper::Response<UpstreamBody>,
    pub(super) lease: Lease,
    pub(super) permit: Permit,
    pub(super) dispatched: Dispatched,
    /// The request's losses so far (`quarantine`).
    pub(super) strikes: u32,
    /// When its group's slot was leased (the trace's lease and upstream stages).
    pub(super) leased: Instant,
}
