//! The routes that reuse chat and completions: `POST /v1/chat/completions/batch` (one choice
//! per conversation, no streaming, usage details null) and SageMaker's `POST /invocations`
//! (chat when the body has `messages`, else completions — vLLM dispatches by the body's shape).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};

use super::pydantic::{self, PyErr};
use super::{chat, completions, internal_error, json_response, request, ApiError, Shared};
use crate::sim::changes::{exclude_null, since, Change};

pub(crate) async fn batch(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    match run_batch(&app, &headers, &body).await {
        Ok(r) | Err(r) => r,
    }
}

/// vLLM 0.33's `BatchChatCompletionRequest.check_batch_mode` (chat_completion/protocol.py), a
/// before-validator: a batch runs one sequence per conversation, so any `n` but 1 is refused.
fn check_batch_n(req: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let n = match req.get("n") {
        None | Some(Value::Null) => return Ok(()),
        Some(n) => n,
    };
    // Python's `n != 1`: 1, 1.0 and True (== 1 in Python) pass; "1" and every other value do
    // not.
    if n.as_f64() == Some(1.0) || *n == Value::Bool(true) {
        return Ok(());
    }
    let shown = match n {
        Value::String(s) => s.clone(),
        Value::Bool(_) => "False".to_owned(),
        other => other.to_string(),
    };
    Err(super::bad_request(
        "Batch chat completions do not support `n > 1`. Please set `n` to 1.",
        Some("n"),
        Some(&shown),
    ))
}

async fn run_batch(app: &Shared, headers: &HeaderMap, body: &[u8]) -> Result<Response, Response> {
    let req = request::json_object(headers, body).map_err(IntoResponse::into_response)?;
    check_batch_n(&req).map_err(IntoResponse::into_response)?;
    let conversations = match req.get("messages") {
        None => return Err(pydantic::to_error(&[pydantic::missing("messages", &req)]).into_response()),
        Some(Value::Array(c)) if c.is_empty() => {
            let mut e = PyErr::new(
                "too_short",
                "body.messages",
                "List should have at least 1 item after validation, not 0",
                &json!([]),
            );
            e.ctx = Some("'field_type': 'List', 'min_length': 1, 'actual_length': 0".into());
            return Err(pydantic::to_error(&[e]).into_response());
        }
        Some(Value::Array(c)) => c.clone(),
        Some(other) => {
            return Err(pydantic::to_error(&[PyErr::new(
                "list_type",
                "body.messages",
                "Input should be a valid list",
                other,
            )])
            .into_response())
        }
    };
    let mut choices = Vec::new();
    let (mut prompt, mut completion, mut reasoning, mut cached) = (0, 0, 0, 0);
    let mut first: Option<Value> = None;
    for (index, conversation) in conversations.into_iter().enumerate() {
        let mut one = req.clone();
        one.insert("messages".into(), conversation);
        one.remove("stream");
        let one = chat::validated(one).map_err(IntoResponse::into_response)?;
        let (mut job, ctx) = chat::prepare(app, headers, one).map_err(IntoResponse::into_response)?;
        job.complete().await.map_err(|m| internal(&m))?;
        let mut body = chat::full_body(app, &job, &ctx);
        let mut choice = body["choices"][0].take();
        choice["index"] = json!(index);
        choices.push(choice);
        prompt += job.prompt_tokens;
        completion += job.completion_tokens();
        reasoning += job.reasoning_tokens();
        cached += job.cached_tokens;
        first.get_or_insert(body);
    }
    let mut body = first.unwrap_or_default();
    body["choices"] = Value::Array(choices);
    body["usage"] = json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
        "prompt_tokens_details": null, "completion_tokens_details": null});
    if since(Change::BatchUsageDetails) {
        // batch_serving.py: the prompts' summed counts, and the reasoning the parser counted.
        body["usage"]["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
        if app.args.enable_prompt_tokens_details {
            body["usage"]["prompt_tokens_details"] =
                json!({"cached_tokens": cached, "created_cache_tokens": 0, "multimodal_tokens": null});
        }
    }
    exclude_null(
        &mut body["usage"],
        "prompt_tokens_details",
        Change::PromptDetailsOmittedWhenNone,
    );
    Ok(json_response(StatusCode::OK, &body))
}

fn internal(msg: &str) -> Response {
    internal_error(msg).into_response()
}

pub(crate) async fn invocations(state: State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req = request::json_object(&headers, &body)?;
    if req.contains_key("messages") {
        Ok(super::chat_stream::handle(state, headers, body).await)
    } else {
        completions::handle(state, headers, body).await
    }
}

/// vLLM's decision, system-one and scoring routes: their required fields are checked as vLLM's
/// models do; a complete body is refused, since the simulator does not model those tasks.
pub(crate) async fn unsimulated(
    headers: HeaderMap,
    body: Bytes,
    required: &'static [&'static str],
) -> Result<Response, ApiError> {
    let req = request::json_object(&headers, &body)?;
    let missing: Vec<PyErr> = required
        .iter()
        .filter(|f| !req.contains_key(**f))
        .map(|f| pydantic::missing(f, &req))
        .collect();
    if !missing.is_empty() {
        return Err(pydantic::to_error(&missing));
    }
    Err(super::bad_request("vllm-sim does not simulate this task", None, None))
}
