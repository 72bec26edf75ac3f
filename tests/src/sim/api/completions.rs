//! `POST /v1/completions`: a prompt (string or list of strings) continued with deterministic
//! prose; `max_tokens` defaults to 16 as in vLLM.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};

use super::chat::{error_frame, frame, now_secs, sse_response, with_request_id, DONE};
use super::generate::{ChoicePlan, Job, Step};
use super::request::{self, invalid};
use super::{bad_request, logprobs, validate, App};
use super::{error, json_response, ApiError, Shared};
use crate::sim::text::{self, Output};

pub(crate) async fn handle(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let mut req = request::json_object(&headers, &body)?;
    validate::stream_options_need_stream(&req)?;
    validate::fields(&mut req, validate::COMPLETION, &[])?;
    let prompts: Vec<String> = match req.get("prompt") {
        Some(Value::String(p)) if !p.is_empty() => vec![p.clone()],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
            a.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        Some(other) if !other.is_null() && !other.as_str().is_some_and(str::is_empty) => {
            return Err(invalid(
                "string_type",
                "prompt",
                "Input should be a valid string",
                other,
            ))
        }
        _ => {
            return Err(bad_request(
                "Either prompt or prompt_embeds must be provided and non-empty.",
                Some("prompt"),
                None,
            ))
        }
    };
    request::check_model(&app, &req)?;
    validate::sampling(&app, &req, &["max_tokens"])?;
    let stream = request::stream_options(&app, &req)?;
    let max_tokens = request::max_tokens(&app, &req, &["max_tokens"])?.unwrap_or(16) as usize;
    let top = req.get("logprobs").and_then(Value::as_u64).map(|k| k as usize);
    request::check_prompt_length(&app, prompts.iter().map(|p| text::count_tokens(p)).max().unwrap_or(0))?;
    let ignore_eos = req.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false);
    let choices: Vec<ChoicePlan> = prompts
        .iter()
        .map(|p| {
            let out = Output {
                reasoning: Vec::new(),
                content: text::plan_completion(p),
                tool_call: None,
            };
            ChoicePlan::new(out, max_tokens, ignore_eos, 0)
        })
        .collect();
    let request_id = request::request_id(&headers, &req);
    let texts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let mut job = Job::start(&app, &texts, choices)?;
    let prompt_tokens = job.prompt_tokens;
    let id = format!("cmpl-{request_id}");
    let model = app.args.served_name().to_owned();
    let created = now_secs();
    if !stream.stream {
        if let Err(msg) = job.complete().await {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                &msg,
                None,
            ));
        }
        let choices: Vec<Value> = job
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"index": i, "text": c.content_text(), "logprobs": top.map_or(Value::Null, |k| logprobs::completion(c.released(), k)), "finish_reason": c.finish, "stop_reason": null, "token_ids": null, "prompt_logprobs": null, "prompt_token_ids": null, "routed_experts": null, "weight_versions": null}))
            .collect();
        let completion = job.completion_tokens();
        let body = json!({
            "id": id, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "service_tier": null, "system_fingerprint": app.fingerprint,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion, "completion_tokens": completion,
                "prompt_tokens_details": details(&app, job.cached_tokens, false).unwrap_or(Value::Null), "completion_tokens_details": null},
            "kv_transfer_params": null, "ec_transfer_params": null, "metrics": null
        });
        return Ok(with_request_id(&app, &request_id, json_response(StatusCode::OK, &body)));
    }
    let include_usage = stream.include_usage;
    let fingerprint = app.fingerprint.clone();
    let state = (job, false);
    let app2 = app.clone();
    let frames = futures_util::stream::unfold(state, move |(mut job, done)| {
        let (id, model, fingerprint, app2) = (id.clone(), model.clone(), fingerprint.clone(), app2.clone());
        async move {
            if done {
                return None;
            }
            let chunk = |choices: Value| json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices});
            loop {
                match job.next().await {
                    Some(Step::Delta(i, d)) => {
                        if d.content.is_empty() && !d.last {
                            continue;
                        }
                        let finish = if d.last {
                            Value::String(job.choices[i].finish.into())
                        } else {
                            Value::Null
                        };
                        let lp = match top {
                            Some(k) if !d.tokens.is_empty() => logprobs::completion(&d.tokens, k),
                            _ => Value::Null,
                        };
                        let mut c = chunk(
                            json!([{"index": i, "text": d.content, "logprobs": lp, "finish_reason": finish, "stop_reason": null, "prompt_token_ids": null, "token_ids": null, "weight_versions": null}]),
                        );
                        if d.last && !include_usage {
                            c["system_fingerprint"] = Value::String(fingerprint.clone());
                        }
                        c["kv_transfer_params"] = Value::Null;
                        return Some((frame(&c), (job, false)));
                    }
                    Some(Step::Failed(msg)) => {
                        let mut b = error_frame(&msg).to_vec();
                        b.extend_from_slice(DONE);
                        return Some((Bytes::from(b), (job, true)));
                    }
                    None => {
                        let mut b = Vec::new();
                        if include_usage {
                            let completion = job.completion_tokens();
                            let mut c = chunk(json!([]));
                            c["usage"] = json!({"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens + completion, "completion_tokens": completion});
                            if let Some(d) = details(&app2, job.cached_tokens, true) {
                                c["usage"]["prompt_tokens_details"] = d;
                            }
                            c["system_fingerprint"] = Value::String(fingerprint.clone());
                            b.extend_from_slice(&frame(&c));
                        }
                        b.extend_from_slice(DONE);
                        return Some((Bytes::from(b), (job, true)));
                    }
                }
            }
        }
    });
    Ok(sse_response(&app, &request_id, frames))
}

/// `prompt_tokens_details` as vLLM's completions render it: with `--enable-prompt-tokens-details`
/// the full object (the usage chunk only `cached_tokens`), else null (absent in the chunk).
fn details(app: &App, cached: usize, streamed: bool) -> Option<Value> {
    match (app.args.enable_prompt_tokens_details, streamed) {
        (true, false) => {
            Some(json!({"cached_tokens": cached, "created_cache_tokens": null, "multimodal_tokens": null}))
        }
        (true, true) => Some(json!({"cached_tokens": cached})),
        (false, _) => None,
    }
}
