//! The web console at `/console` (docs/operations.md "The console"): one page, its script and
//! its style embedded in the binary (no CDN, no external font or script), a thin client over the
//! admin routes. Sign-in exchanges the admin token or an API key for a session cookie
//! (`control::sessions`); an operator's cookie opens `/admin/*` (the edge checks it), a team
//! member's opens only this module's `/console/api/*`: the service's state without its secrets
//! and the member's own usage. Every answer here carries a strict Content-Security-Policy.

mod assets;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::api::error::GatewayError;
use crate::app::Shared;
use crate::control::sessions::{cookie, Role, Sessions, COOKIE};

/// What the console's handlers share.
struct Console {
    app: Shared,
    sessions: Arc<Sessions>,
}

type Ctx = State<Arc<Console>>;

/// The console's routes, each answer with the console's security headers.
pub(crate) fn routes(app: Shared, sessions: Arc<Sessions>) -> Router {
    Router::new()
        .route("/console", get(assets::page))
        .route("/console/", get(assets::page))
        .route("/console/assets/{name}", get(assets::asset))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .route("/console/api/session", get(session))
        .route("/console/api/status", get(status))
        .route("/console/api/usage", get(usage))
        .route("/console/api/quotas", get(quotas))
        .layer(axum::middleware::map_response(assets::secured))
        .with_state(Arc::new(Console { app, sessions }))
}

/// The session the request's cookie names, or 401.
fn signed_in(c: &Console, headers: &HeaderMap) -> Result<Role, GatewayError> {
    cookie(headers)
        .and_then(|id| c.sessions.find(id))
        .ok_or(GatewayError::SignIn(
            "not signed in, or the console session expired or was signed out: sign in at /console",
        ))
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn who(role: &Role) -> Value {
    match role {
        Role::Operator => json!({"role": "operator", "key": null}),
        Role::Member(name) => json!({"role": "member", "key": &**name}),
    }
}

/// `POST /console/login` with `{"token": "…"}`: the admin token or an API key.
async fn login(
    State(c): Ctx,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    scheme: Option<axum::Extension<crate::app::Scheme>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let token = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("token")?.as_str().map(str::to_owned))
        .ok_or_else(|| GatewayError::bad_request("the sign-in body is {\"token\": \"…\"}", "token"))?;
    let (id, role) = c.sessions.sign_in(token.trim(), peer.ip())?;
    let ttl = c.sessions.ttl().as_secs();
    // HttpOnly: no script reads it; SameSite=Strict: no other site's page sends it; Secure
    // when the browser reached the console over HTTPS (the gateway's own TLS, or a
    // TLS-terminating proxy in front that says so), so it never travels in clear text afterwards.
    let tls = scheme.is_some_and(|s| s.0 == crate::app::Scheme::Https);
    let secure = if tls || over_https(&headers) { "; Secure" } else { "" };
    let set = format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={ttl}{secure}");
    let mut body = who(&role);
    body["expires_in_s"] = json!(ttl);
    let mut resp = json_response(StatusCode::OK, &body);
    resp.headers_mut()
        .insert(header::SET_COOKIE, HeaderValue::from_str(&set).expect("ascii"));
    Ok(resp)
}

/// Whether the browser's side of the connection is HTTPS: a proxy in front says so in
/// `X-Forwarded-Proto` (a client that claims it over plain HTTP only loses its own cookie).
fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// `POST /console/logout`: the session ends and the cookie is cleared.
async fn logout(State(c): Ctx, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers) {
        c.sessions.end(id);
    }
    let mut resp = json_response(StatusCode::OK, &json!({"signed_out": true}));
    let clear = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    resp.headers_mut()
        .insert(header::SET_COOKIE, HeaderValue::from_str(&clear).expect("ascii"));
    resp
}

/// `GET /console/api/session`: who is signed in.
async fn session(State(c): Ctx, headers: HeaderMap) -> Result<Response, GatewayError> {
    let role = signed_in(&c, &headers)?;
    Ok(json_response(StatusCode::OK, &who(&role)))
}

/// `GET /console/api/status`: `/admin/status`, without what only an operator sees (the
/// upstream's address, the store, the quarantine's key names, the ranks' log paths) for a member.
async fn status(State(c): Ctx, headers: HeaderMap) -> Result<Response, GatewayError> {
    let role = signed_in(&c, &headers)?;
    let mut body = crate::admin::ops::status_body(&c.app);
    if let Role::Member(_) = role {
        for_member(&mut body);
    }
    Ok(json_response(StatusCode::OK, &body))
}

fn for_member(body: &mut Value) {
    fn no_logs(supervisor: Option<&mut Value>) {
        let ranks = supervisor
            .and_then(|s| s.get_mut("ranks"))
            .and_then(Value::as_array_mut);
        for r in ranks.into_iter().flatten().filter_map(Value::as_object_mut) {
            r.remove("log");
        }
    }
    let Some(obj) = body.as_object_mut() else { return };
    for private in ["upstream_url", "store", "quarantine"] {
        obj.remove(private);
    }
    no_logs(obj.get_mut("supervisor"));
    if let Some(groups) = obj.get_mut("groups").and_then(Value::as_array_mut) {
        for g in groups.iter_mut().filter_map(Value::as_object_mut) {
            g.remove("upstream_url");
            no_logs(g.get_mut("supervisor"));
        }
    }
}

/// `GET /console/api/usage`: `/admin/usage`'s answer; a member's `key` is always its own.
async fn usage(State(c): Ctx, headers: HeaderMap, Query(mut q): Query<HashMap<String, String>>) -> Response {
    let role = match signed_in(&c, &headers) {
        Ok(role) => role,
        Err(e) => return e.into_response(),
    };
    if let Role::Member(name) = &role {
        q.insert("key".into(), name.to_string());
    }
    crate::admin::usage::answer(&c.app, &q)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /console/api/quotas`: each key's quotas and what its sliding windows hold now (a
/// member: its own key's).
async fn quotas(State(c): Ctx, headers: HeaderMap) -> Result<Response, GatewayError> {
    let role = signed_in(&c, &headers)?;
    let now = crate::control::ledger::now_secs();
    let rows: Vec<Value> = c
        .sessions
        .keys()
        .infos()
        .iter()
        .filter(|k| match &role {
            Role::Member(name) => k.name == *name,
            Role::Operator => true,
        })
        .flat_map(|k| {
            let standing = c.app.quotas.standing(k, now);
            standing
                .into_iter()
                .map(|(limit, quota, used)| json!({"key": &*k.name, "limit": limit, "quota": quota, "used": used}))
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(json_response(StatusCode::OK, &json!({ "quotas": rows })))
}
