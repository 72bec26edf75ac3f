//! What the stages share about answering: the drain bound every wait runs under, the error a
//! failure to reach rank 0 becomes, and the client's response head made from rank 0's.

use axum::http::header;
use axum::response::Response;
use metrics::counter;

use crate::api::error::GatewayError;
use crate::app::App;
use crate::control::clients::Caller;
use crate::groups::Group;
use crate::observe;
use crate::quarantine::Stage;
use crate::upstream::{is_hop_by_hop, UpstreamBody, UpstreamError};

/// Runs `work` unless the gateway passes its drain first (DESIGN.md's shutdown contract): then
/// the request is answered 503 instead of being cut with the connection.
pub(super) async fn until_closed<T>(app: &App, work: impl std::future::Future<Output = T>) -> Result<T, GatewayError> {
    let mut lifecycle = app.control.lifecycle();
    tokio::select! {
        done = work => Ok(done),
        _ = lifecycle.wait_for(|l| *l == crate::control::state::Lifecycle::Closing) => Err(GatewayError::DrainTimeout { drain: app.drain_timeout }),
    }
}

/// The end of a quarantined request (logged and counted where it is decided: `Suspect`, or
/// here at arrival).
pub(super) fn quarantined(request_id: &str, caller: &Caller, refused: Option<String>) -> GatewayError {
    let stage = if refused.is_some() {
        Stage::Arrival
    } else {
        Stage::Dispatch
    };
    if stage == Stage::Arrival {
        counter!(observe::QUARANTINED, "stage" => stage.label()).increment(1);
        sparkgate_events::Event::PoisonRefused {
            request_id: request_id.to_owned(),
            client: caller.label().to_string(),
        }
        .emit();
    }
    GatewayError::RequestCrashedEngine {
        request_id: request_id.to_owned(),
        refused,
    }
}

/// Maps a failure to reach the upstream: a group its supervisor is (re)starting answers 503,
/// otherwise 502.
pub(super) fn unreachable(group: &Group, err: &UpstreamError) -> GatewayError {
    counter!(observe::UPSTREAM_ERRORS, "kind" => observe::UpstreamErrorKind::of(err.is_connect()).label()).increment(1);
    if group.restarting() {
        return GatewayError::Restarting;
    }
    GatewayError::UpstreamUnreachable {
        upstream: group.upstream.base().to_owned(),
        detail: error_chain(err),
    }
}

pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut src = err.source();
    while let Some(e) = src {
        s.push_str(": ");
        s.push_str(&e.to_string());
        src = e.source();
    }
    s
}

/// The client's response head from rank 0's: the headers are moved, not copied. The wire has
/// consumed the framing headers (hyper frames the answer anew); any other hop-by-hop header is
/// dropped here.
pub(super) fn response_head(upstream: &mut hyper::Response<UpstreamBody>) -> axum::http::response::Builder {
    let mut headers = std::mem::take(upstream.headers_mut());
    let forwarded = |k: &axum::http::HeaderName| !is_hop_by_hop(k) && k != header::CONTENT_LENGTH;
    if !headers.keys().all(forwarded) {
        headers = headers
            .iter()
            .filter(|(k, _)| forwarded(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
    let mut b = Response::builder().status(upstream.status());
    if let Some(h) = b.headers_mut() {
        *h = headers;
    }
    b
}
