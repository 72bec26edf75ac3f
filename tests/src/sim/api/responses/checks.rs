//! The Responses route's refusals between the model check and generation, in vLLM's order
//! (responses/serving.py and the response object's own pydantic model).

use axum::response::Response;
use bytes::Bytes;
use serde_json::{Map, Value};

use super::super::{bad_request, chat, error, request, schema, validate, ApiError, App};

/// The request fields that may be null where `ResponsesResponse` (a pydantic model built from
/// the request) refuses a null: (field, the error's type, its message).
const NOT_NULL_IN_RESPONSE: &[(&str, &str, &str)] = &[
    ("background", "bool_type", "Input should be a valid boolean"),
    ("truncation", "literal_error", "Input should be 'auto' or 'disabled'"),
];

/// Building the response object fails, as pydantic's `ValidationError` in its `str` form.
fn response_model_takes_nulls(req: &Map<String, Value>) -> Result<(), ApiError> {
    let errors: Vec<String> = NOT_NULL_IN_RESPONSE
        .iter()
        .filter(|(field, _, _)| req.get(*field) == Some(&Value::Null))
        .map(|(field, kind, msg)| {
            format!(
                "{field}\n  {msg} [type={kind}, input_value=None, input_type=NoneType]\n    For further information visit https://errors.pydantic.dev/2.14/v/{kind}"
            )
        })
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    let label = if errors.len() == 1 { "error" } else { "errors" };
    let text = format!(
        "{} validation {label} for ResponsesResponse\n{}",
        errors.len(),
        errors.join("\n")
    );
    Err(bad_request(&text, None, None))
}

/// vLLM's refusals between the model check and generation, in its order; `Some` is an answer
/// that is not an error (a stream that ends before its first event).
pub(super) fn serving_checks(
    app: &App,
    req: &Map<String, Value>,
    msgs: &[Value],
    stream: bool,
) -> Result<Option<Response>, ApiError> {
    // The previous response is looked up before anything is rendered. The simulator stores
    // none: every previous one is unknown, as to a fresh vLLM.
    if let Some(Value::String(prev)) = req.get("previous_response_id") {
        return Err(error(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("Response with id '{prev}' not found."),
            Some("response_id"),
        ));
    }
    // Without VLLM_ENABLE_RESPONSES_API_STORE (the default) there is no background mode.
    if req.get("background").is_some_and(|b| b.as_bool() == Some(true)) {
        return Err(error(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
            Some("background"),
        ));
    }
    request::untrusted_mm_kwargs(req)?;
    if msgs.is_empty() && matches!(app.template, crate::sim::text::Template::Glm) {
        return Err(bad_request(
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
            None,
            None,
        ));
    }
    // Only the fields the Responses model declares reach its sampling parameters, and a falsy
    // `stop` becomes none (`to_sampling_params`: `self.stop if self.stop else []`).
    let mut fields = schema::declared("/v1/responses", req);
    if matches!(fields.get("stop"), Some(Value::String(s)) if s.is_empty()) {
        fields.remove("stop");
    }
    validate::sampling(app, &fields, &["max_output_tokens"])?;
    validate::speculation(app, &fields)?;
    match response_model_takes_nulls(req) {
        // Streamed, the failure ends the stream before its first event.
        Err(_) if stream => Ok(Some(chat::sse_response(
            app,
            "",
            futures_util::stream::empty::<Bytes>(),
        ))),
        Err(e) => Err(e),
        Ok(()) => Ok(None),
    }
}
