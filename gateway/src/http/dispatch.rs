//! One request from the connection loop to its answer: the path made canonical and matched
//! against the route table once, the edge steps in their order (`edge`), then the upstream
//! route's handler (`pipeline::upstream_route`, called directly, as one state machine with the
//! steps around it) or the axum router of the gateway's own routes (`admin::routes`).

use std::net::SocketAddr;

use axum::body::Body;
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;

use super::edge::{self, Edge, Head, RequestId};
use crate::api::family::Family;
use crate::api::routes::Route;
use crate::app::Shared;
use crate::control::clients::Caller;

/// What every connection's service calls.
#[derive(Debug, Clone)]
pub(crate) struct Dispatch {
    app: Shared,
    edge: std::sync::Arc<Edge>,
    own: Router,
}

impl Dispatch {
    pub(crate) fn new(app: Shared, edge: std::sync::Arc<Edge>) -> Dispatch {
        let own = crate::admin::routes::own_routes(app.clone());
        Dispatch { app, edge, own }
    }

    /// Answers one request from `peer`.
    pub(crate) async fn call(&self, mut req: hyper::Request<Incoming>, peer: SocketAddr) -> Response {
        let route = crate::api::routes::canonicalize(&mut req);
        let id = edge::request_id(req.headers());
        let head = Head {
            method: req.method(),
            path: req.uri().path(),
            headers: req.headers(),
            route,
            peer,
        };
        let line = edge::AccessLine::begin(&head);
        let admitted = edge::authenticate(&self.edge, &head)
            .and_then(|key| Ok((edge::rate_limit(&self.edge, &head, key.as_ref())?, key)));
        let mut resp = match admitted {
            // A refusal in the route's own envelope (vLLM's for the gateway's own paths).
            Err(refused) => refused.render(route.map_or(Family::OpenAi, |r| r.family)),
            Ok((allowance, key)) => {
                let caller = Caller {
                    key: key.map(edge::ValidatedKey::into_string),
                    addr: peer.ip(),
                };
                let mut resp = self.handle(route, &id, req, caller).await;
                if let Some(a) = allowance {
                    a.stamp(&mut resp);
                }
                resp
            }
        };
        if let Some(line) = line {
            line.end(&resp, &id, peer);
        }
        edge::echo_id(&mut resp, &id);
        resp
    }

    async fn handle(
        &self,
        route: Option<&'static Route>,
        id: &RequestId,
        req: hyper::Request<Incoming>,
        caller: Caller,
    ) -> Response {
        match route {
            Some(r) => crate::pipeline::upstream_route(&self.app, r, &id.0, req, caller).await,
            None => {
                use hyper::service::Service as _;
                let own = hyper_util::service::TowerToHyperService::new(self.own.clone());
                match own.call(req.map(Body::new)).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                }
            }
        }
    }
}
