//! The Responses routes the gateway answers from its own store (docs/store.md), never vLLM's:
//! `GET` and `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items` and
//! `POST /v1/responses/{id}/cancel`. A response another API key stored is answered as if it did
//! not exist (404, no existence oracle).

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse as _, Response};
use serde_json::Value;

use crate::api::error::GatewayError;
use crate::api::stored::{deleted, input_items_page, Page};
use crate::app::App;
use crate::control::clients::Caller;

/// What the path names: the response and, after it, the sub-resource.
fn parts(path: &str) -> (&str, Option<&str>) {
    let rest = path.trim_start_matches("/v1/responses/");
    match rest.split_once('/') {
        Some((id, sub)) => (id, Some(sub)),
        None => (rest, None),
    }
}

fn json(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) async fn answer(app: &App, method: &Method, path: &str, query: Option<&str>, caller: &Caller) -> Response {
    match stored(app, method, path, query, caller).await {
        Ok(resp) => resp,
        Err(e) => e.render(crate::api::family::Family::OpenAi),
    }
}

async fn stored(
    app: &App,
    method: &Method,
    path: &str,
    query: Option<&str>,
    caller: &Caller,
) -> Result<Response, GatewayError> {
    let (id, sub) = parts(path);
    let slot = app
        .store
        .as_ref()
        .ok_or(GatewayError::ResponseNotFound(id.to_owned()))?;
    let store = slot.get().await?;
    let owner = caller.owner();
    let failed = |e: sparkgate_store::StoreError| GatewayError::StoreFailed(e.to_string());
    if *method == Method::DELETE && sub.is_none() {
        return match store.delete(id, &owner).await.map_err(failed)? {
            true => Ok(json(StatusCode::OK, &deleted(id))),
            false => Err(GatewayError::ResponseNotFound(id.to_owned())),
        };
    }
    let record = store
        .get(id, &owner)
        .await
        .map_err(failed)?
        .ok_or_else(|| GatewayError::ResponseNotFound(id.to_owned()))?;
    let unreadable = |_| GatewayError::StoreFailed(format!("the stored response {id} is not JSON"));
    match sub {
        None => {
            let response: Value = serde_json::from_str(&record.response).map_err(unreadable)?;
            Ok(json(StatusCode::OK, &response))
        }
        Some("input_items") => {
            let page = Page::parse(query).map_err(|(message, param)| GatewayError::bad_request(message, param))?;
            let input: Value = serde_json::from_str(&record.input).map_err(unreadable)?;
            Ok(json(StatusCode::OK, &input_items_page(id, &input, &page)))
        }
        // Every stored response is a finished one: background mode is not served.
        Some(_) => Err(GatewayError::BadRequest {
            message: "Cannot cancel a synchronous response.".into(),
            param: Some("response_id"),
        }),
    }
}
