//! `/admin/model` (MODELS): which model is loaded and the swap under way (GET), and an
//! operator's swap (`POST {"model": NAME}`, NAME a served name, an alias or a profile).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::error::GatewayError;
use crate::app::Shared;
use crate::groups::{SwapAnswer, Swapper};

fn swapper(app: &Shared) -> Result<&std::sync::Arc<Swapper>, GatewayError> {
    app.swapper.as_ref().ok_or_else(|| {
        GatewayError::NotFound("/admin/model: this gateway serves one model (set MODELS for several)".into())
    })
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// `GET /admin/model`: every model, the loaded one, the swap under way.
pub(crate) async fn show(State(app): State<Shared>) -> Result<Response, GatewayError> {
    let s = swapper(&app)?;
    Ok(answer(
        StatusCode::OK,
        json!({"models": app.models_json(), "swap": s.status_json()}),
    ))
}

/// `POST /admin/model {"model": NAME}`: 200 when it is loaded already, 202 when its swap began
/// (or is under way), 409 when another swap runs or it would not fit.
pub(crate) async fn swap(State(app): State<Shared>, body: Bytes) -> Result<Response, GatewayError> {
    let s = swapper(&app)?;
    let asked: Value = serde_json::from_slice(&body)
        .map_err(|e| GatewayError::bad_request(format!("the body must be {{\"model\": NAME}}: {e}"), "model"))?;
    let Some(name) = asked.get("model").and_then(Value::as_str) else {
        return Err(GatewayError::bad_request("the body must be {\"model\": NAME}", "model"));
    };
    let Some(id) = app.models.named(name) else {
        let mut known = app.models.valid();
        known.extend(app.models.ids().map(|id| app.models.get(id).profile().to_string()));
        return Err(GatewayError::bad_request(
            format!("model {name:?} is not one of: {}", known.join(", ")),
            "model",
        ));
    };
    let served = app.models.get(id).served().to_owned();
    let from = s.loaded().map(|l| app.models.get(l).served().to_owned());
    match s.ask(id).await {
        None => Err(GatewayError::ShuttingDown),
        Some(SwapAnswer::Loaded) => Ok(answer(StatusCode::OK, json!({"loaded": served, "swapping": false}))),
        Some(SwapAnswer::Accepted) => Ok(answer(
            StatusCode::ACCEPTED,
            json!({"swapping": true, "from": from, "to": served}),
        )),
        Some(SwapAnswer::Busy(to)) => Err(GatewayError::Conflict(format!(
            "a swap to {} is under way; ask again once it is done",
            app.models.get(to).served()
        ))),
        Some(SwapAnswer::Refused(why)) => Err(GatewayError::Conflict(format!("{served} is not loaded: {why}"))),
    }
}
