//! `GET /admin/quarantine` lists the bodies quarantined as poisonous (read again from the store
//! first, so another gateway's verdicts and releases show); `POST
//! /admin/quarantine/{id}/release` releases one here and in the store (404 for an id not on
//! record).

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::error::GatewayError;
use crate::app::Shared;

pub(crate) async fn list(State(app): State<Shared>) -> Response {
    if let Err(e) = app.quarantine.sync().await {
        return GatewayError::StoreFailed(e).into_response();
    }
    let body = json!({"quarantine": app.quarantine.list()});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(crate) async fn release(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return GatewayError::bad_request(
            format!("{id:?} is not a quarantine id (16 hex digits, as `sparkgate quarantine list` shows)"),
            "id",
        )
        .into_response();
    }
    match app.quarantine.release(&id.to_ascii_lowercase()).await {
        Ok(true) => {
            sparkgate_events::Event::OperatorAsked {
                what: format!("release quarantined body {id}"),
                answer: "released".to_owned(),
            }
            .emit();
            let body = json!({"released": id});
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Ok(false) => {
            GatewayError::NotFound(format!("/admin/quarantine/{id}: no body quarantined under this id")).into_response()
        }
        Err(e) => GatewayError::StoreFailed(e).into_response(),
    }
}
