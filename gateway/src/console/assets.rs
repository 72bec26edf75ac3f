//! The console's files, embedded in the binary (one table: name, media type, contents), and the
//! headers every console answer carries: a Content-Security-Policy that allows only these files
//! (no inline script or style, no other origin), no framing, no Referer, no sniffing.

use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::api::error::GatewayError;

/// The page: served to anyone (it is the sign-in form until a session exists); it holds no data.
const PAGE: &str = include_str!("assets/index.html");

/// The files the page loads, by name under `/console/assets/`.
const ASSETS: [(&str, &str, &str); 3] = [
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("assets/console.css"),
    ),
    (
        "charts.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/charts.js"),
    ),
];

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub(super) async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

pub(super) async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, ..)| *n == name) {
        Some((_, media, body)) => ([(header::CONTENT_TYPE, *media)], *body).into_response(),
        None => GatewayError::NotFound(format!("/console/assets/{name}")).into_response(),
    }
}

/// Every console answer: the policy headers; nothing cached (the data is live and personal).
pub(super) async fn secured(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    resp
}
