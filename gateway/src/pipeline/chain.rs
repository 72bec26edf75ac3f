//! A Responses request's stored state (docs/store.md), before it is sent: its
//! `previous_response_id` resolved from the gateway's store into the full input vLLM is sent
//! (vLLM's own store is never used), and what storing its answer will need. After the answer,
//! `persist` writes it — for a stream, before its last event goes out.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::context::{Ctx, StorePlan};
use crate::api::error::GatewayError;
use crate::api::lax::lax_bool;
use crate::api::stored::{as_stored, chained_input, input_items, resolved_body};

/// The body to send and, unless it says `store: false`, how its answer is stored.
pub(super) async fn resolve(
    ctx: &Ctx<'_>,
    slot: &crate::control::storage::StoreSlot,
    forward: Bytes,
) -> Result<(Bytes, Option<Arc<StorePlan>>), GatewayError> {
    // The body was checked as a JSON object by `body::prepare`.
    let Ok(mut body) = serde_json::from_slice::<Map<String, Value>>(&forward) else {
        return Ok((forward, None));
    };
    // vLLM's `store: bool | None = True`: absent is true, null is not.
    let keep = body.get("store").is_none_or(|v| lax_bool(v) == Some(true));
    if !keep && !body.contains_key("previous_response_id") {
        return Ok((forward, None));
    }
    let store = slot.get().await?;
    let owner = ctx.caller.owner();
    let previous = match body.get("previous_response_id") {
        Some(Value::String(id)) => Some(id.clone()),
        _ => None,
    };
    let input = body.get("input").cloned();
    let (forward, full) = match (&previous, input) {
        // Without an input the body is vLLM's to refuse, before it looks for the previous
        // response.
        (_, None) => return Ok((forward, None)),
        (Some(id), Some(input)) => {
            let failed = |e: sparkgate_store::StoreError| GatewayError::StoreFailed(e.to_string());
            // An unknown id (or another key's) goes to vLLM as it came: its store is off, so it
            // answers the 404 — or, first, its own refusal of the rest of the body.
            let Some(record) = store.get(id, &owner).await.map_err(failed)? else {
                return Ok((forward, None));
            };
            let unreadable = |_| GatewayError::StoreFailed(format!("the stored response {id} is not JSON"));
            let prev_input: Value = serde_json::from_str(&record.input).map_err(unreadable)?;
            let prev: Value = serde_json::from_str(&record.response).map_err(unreadable)?;
            let full = chained_input(&prev_input, &prev, &input);
            body = resolved_body(body, full.clone());
            let bytes = serde_json::to_vec(&body).map_err(|e| GatewayError::StoreFailed(e.to_string()))?;
            (Bytes::from(bytes), full)
        }
        (None, Some(input)) => (forward, Value::Array(input_items(&input))),
    };
    let plan = keep.then(|| {
        Arc::new(StorePlan {
            store: store.clone(),
            owner,
            input: full,
            previous,
        })
    });
    Ok((forward, plan))
}

/// Stores `response` (a Responses answer's JSON) as `plan` says; the answer as the client gets
/// it (with its `store` and `previous_response_id`). A write that fails is logged and the
/// answer still goes out.
pub(crate) async fn persist(plan: &StorePlan, mut response: Value) -> Value {
    as_stored(&mut response, plan.previous.as_deref());
    let (Some(id), created_at) = (response["id"].as_str(), response["created_at"].as_i64()) else {
        return response;
    };
    let record = sparkgate_store::Stored {
        id: id.to_owned(),
        owner: plan.owner.clone(),
        created_at: created_at.unwrap_or(0),
        response: response.to_string(),
        input: plan.input.to_string(),
    };
    match plan.store.put(record).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(id, "a response id another key stored was not overwritten"),
        Err(e) => tracing::warn!(id, error = %e, "the response could not be stored"),
    }
    response
}

/// A whole answer's body, stored.
pub(super) async fn persist_body(plan: &StorePlan, body: Bytes) -> Bytes {
    match serde_json::from_slice::<Value>(&body) {
        Ok(response) if response.is_object() => Bytes::from(persist(plan, response).await.to_string()),
        _ => body,
    }
}

/// A stream's final event (`response.completed` or `response.incomplete`), its response
/// stored; the event as the client gets it.
pub(crate) async fn persist_event(plan: Arc<StorePlan>, event: Bytes) -> Bytes {
    let Some(mut e) = super::splice::Event::parse(&event) else {
        return event;
    };
    let response = e.data["response"].take();
    e.data["response"] = persist(&plan, response).await;
    e.to_bytes()
}
