//! Two edge steps: `Routing` makes the path canonical and matches it against the route table
//! once (the route rides in the request's extensions, `step::Seen`, for every step and
//! handler after it), and `AccessLog` writes one structured line per response — polls (health,
//! readiness, metrics, status) at DEBUG; generations skip it, since each gets one INFO line
//! with tokens and TTFT when it ends (`observe::generation_done`).

use std::net::SocketAddr;
use std::time::Instant;

use axum::http::Method;
use axum::response::Response;
use hyper::Request;

use super::step::{Seen, Step};
use crate::api::error::GatewayError;
use crate::api::routes::Role;

/// The canonical path and its route.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routing;

impl Step for Routing {
    type Carry = ();

    fn on_request<B>(&self, req: &mut Request<B>) -> Result<(), GatewayError> {
        let route = crate::api::routes::canonicalize(req);
        if let Some(seen) = Seen::of_mut(req) {
            seen.route = route;
        }
        Ok(())
    }

    fn on_response(&self, (): (), _: &mut Response) {}
}

/// How loud a request's access-log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loudness {
    /// What monitors and `sparkgate` poll (health, readiness, metrics, status): DEBUG.
    Poll,
    Info,
}

/// One line per response, begun before the handler and written when it answered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AccessLog;

/// A request's line in the making.
#[derive(Debug)]
pub(crate) struct AccessLine {
    loudness: Loudness,
    started: Instant,
    method: Method,
    path: String,
    id: String,
    peer: SocketAddr,
}

impl Step for AccessLog {
    /// `None` for a generation: its one line is written when it ends.
    type Carry = Option<AccessLine>;

    fn on_request<B>(&self, req: &mut Request<B>) -> Result<Option<AccessLine>, GatewayError> {
        if Seen::route(req).is_some_and(|r| matches!(r.role, Role::Generate(_))) {
            return Ok(None);
        }
        let (path, method) = (req.uri().path(), req.method());
        let polled = matches!(
            path,
            "/health" | "/ready" | "/metrics" | "/admin/status" | "/ping" | "/version" | "/load"
        ) || (path == "/admin/spec" && method == Method::GET);
        Ok(Some(AccessLine {
            loudness: if polled { Loudness::Poll } else { Loudness::Info },
            started: Instant::now(),
            method: method.clone(),
            path: path.to_owned(),
            id: Seen::id(req).to_owned(),
            peer: Seen::peer(req),
        }))
    }

    fn on_response(&self, line: Option<AccessLine>, resp: &mut Response) {
        let Some(l) = line else { return };
        let (status, duration_ms) = (resp.status().as_u16(), crate::observe::ms(l.started.elapsed()));
        let (method, path, id, peer) = (l.method, l.path, l.id, l.peer.ip());
        match l.loudness {
            Loudness::Poll => tracing::debug!(request_id = %id, %method, path, status, duration_ms, %peer, "request"),
            Loudness::Info => tracing::info!(request_id = %id, %method, path, status, duration_ms, %peer, "request"),
        }
    }
}
