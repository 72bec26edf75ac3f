//! `POST /inference/v1/generate`: token ids in, token ids out, through the same engine as
//! every generation (admission, `--max-num-seqs`, pacing, faults, metrics). The model reads
//! the ids as it reads any prompt (`model::continuation`), so a rendered chat prompt followed
//! by the tokens a cut stream already emitted goes on with exactly the rest of that stream.
//! `POST /inference/v1/abort_requests` checks its body and answers 200.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::super::chat::{error_frame, frame, now_secs, sse_response, DONE};
use super::super::generate::{ChoicePlan, Job, Step};
use super::super::pydantic::{self, PyErr};
use super::super::{bad_request, internal_error, request, ApiError, App, Shared};
use super::{ok, usage_info};
use crate::sim::parser::ParserConfig;
use crate::sim::structured::Constraint;
use crate::sim::{model, vocab};

/// A checked `GenerateRequest`.
struct Generate {
    ids: Vec<u32>,
    sp: Map<String, Value>,
    stream: bool,
    return_token_ids: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// `--enable-prompt-tokens-details`: the usage chunk names the cached prompt tokens.
    details: bool,
}

/// The body's fields as `GenerateRequest` validates them: `token_ids` a non-empty list of
/// non-negative integers, `sampling_params` an object.
fn validated(req: &Map<String, Value>) -> Result<Generate, ApiError> {
    let mut errors = Vec::new();
    let ids = match req.get("token_ids") {
        None => {
            errors.push(pydantic::missing("token_ids", req));
            Vec::new()
        }
        Some(Value::Array(a)) if a.is_empty() => {
            let mut e = PyErr::new(
                "too_short",
                "body.token_ids",
                "List should have at least 1 item after validation, not 0",
                &json!([]),
            );
            e.ctx = Some("'field_type': 'List', 'min_length': 1, 'actual_length': 0".into());
            errors.push(e);
            Vec::new()
        }
        Some(Value::Array(a)) => token_ids(a, &mut errors),
        Some(other) => {
            errors.push(PyErr::new(
                "list_type",
                "body.token_ids",
                "Input should be a valid list",
                other,
            ));
            Vec::new()
        }
    };
    let sp = match req.get("sampling_params") {
        Some(Value::Object(sp)) => sp.clone(),
        None => {
            errors.push(pydantic::missing("sampling_params", req));
            Map::new()
        }
        Some(other) => {
            errors.push(PyErr::new(
                "model_type",
                "body.sampling_params",
                "Input should be a valid dictionary or instance of SamplingParams",
                other,
            ));
            Map::new()
        }
    };
    if !errors.is_empty() {
        return Err(pydantic::to_error(&errors));
    }
    let flag = |v: Option<&Value>| v.and_then(Value::as_bool).unwrap_or(false);
    let opts = req.get("stream_options");
    Ok(Generate {
        ids,
        sp,
        stream: flag(req.get("stream")),
        return_token_ids: flag(req.get("return_token_ids")),
        include_usage: flag(opts.and_then(|o| o.get("include_usage"))),
        continuous_usage: flag(opts.and_then(|o| o.get("continuous_usage_stats"))),
        details: false,
    })
}

/// The ids of a `token_ids` list, each error of it recorded.
fn token_ids(items: &[Value], errors: &mut Vec<PyErr>) -> Vec<u32> {
    let mut ids = Vec::with_capacity(items.len());
    let mut negative = false;
    for (i, v) in items.iter().enumerate() {
        match v.as_i64() {
            Some(n) if n < 0 => negative = true,
            Some(n) => ids.push(u32::try_from(n).unwrap_or(u32::MAX)),
            None => errors.push(PyErr::new(
                "int_type",
                &format!("body.token_ids.{i}"),
                "Input should be a valid integer",
                v,
            )),
        }
    }
    if negative && errors.is_empty() {
        let mut e = PyErr::new(
            "value_error",
            "body.token_ids",
            "Value error, token_ids must not contain negative values",
            &Value::Array(items.to_vec()),
        );
        e.ctx = Some("'error': ValueError('token_ids must not contain negative values')".into());
        errors.push(e);
    }
    ids
}

/// The engine's refusals of a checked request: `n` past the slots, ids past the vocabulary,
/// a prompt past the context.
fn engine_checks(app: &App, g: &Generate) -> Result<usize, ApiError> {
    let n = g.sp.get("n").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
    let slots = app.args.max_num_seqs as usize;
    if n > slots {
        return Err(bad_request(
            &format!("sampling_params.n must be at most the server's max_num_seqs ({slots}), got {n}."),
            None,
            None,
        ));
    }
    if let Some(max) = g.ids.iter().copied().max().filter(|m| *m >= vocab::vocab_size()) {
        return Err(bad_request(&format!("Token id {max} is out of vocabulary"), None, None));
    }
    request::check_prompt_length(app, g.ids.len())?;
    if let Some(m) = g.sp.get("max_tokens").and_then(Value::as_i64).filter(|m| *m < 1) {
        return Err(bad_request(
            &format!("max_tokens must be at least 1, got {m}."),
            Some("max_tokens"),
            Some(&m.to_string()),
        ));
    }
    Ok(n)
}

pub(crate) async fn generate(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req = request::json_object(&headers, &body)?;
    let mut g = validated(&req)?;
    g.details = app.args.enable_prompt_tokens_details;
    request::check_model(&app, &req)?;
    let n = engine_checks(&app, &g)?;
    let sp = &g.sp;
    let room = app.args.max_model_len as usize - g.ids.len();
    let budget = match sp.get("max_tokens").and_then(Value::as_u64) {
        Some(m) => (m as usize).min(room),
        None => room,
    };
    let so = Map::from_iter(
        sp.get("structured_outputs")
            .map(|so| ("structured_outputs".to_owned(), so.clone())),
    );
    let planned = model::continuation(app.template, &g.ids, Constraint::of_request(&so).as_ref());
    let ignore_eos = sp.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false);
    let min_tokens = sp.get("min_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
    let stops = request::stop_strings(sp);
    let choices = (0..n)
        .map(|_| {
            let mut plan = ChoicePlan::new(planned.clone(), budget, ignore_eos, min_tokens, ParserConfig::default());
            plan.apply_stop(&stops);
            plan
        })
        .collect();
    let text = vocab::text_of(&g.ids);
    let job = Job::start_tokens(&app, std::slice::from_ref(&g.ids), &[&text], choices)?;
    let request_id = format!("generate-tokens-{}", request::request_id(&headers, &req));
    if g.stream {
        let frames = frames(job, g, request_id.clone());
        return Ok(sse_response(&app, &request_id, frames));
    }
    whole(&app, job, &g, &request_id).await
}

/// The engine's finish reason (a call is the parser's business: the engine stopped).
fn finish_of(plan: &ChoicePlan) -> &'static str {
    match plan.finish {
        "length" => "length",
        _ => "stop",
    }
}

fn choice(index: usize, finish: Value, stop_reason: Value, ids: Vec<u32>) -> Value {
    json!({"index": index, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": ids,
           "routed_experts": null, "sampling_mask": null, "weight_versions": null, "logprobs": null})
}

async fn whole(app: &App, mut job: Job, g: &Generate, request_id: &str) -> Result<Response, ApiError> {
    job.complete().await.map_err(|m| internal_error(&m))?;
    let mut completion = 0;
    let choices: Vec<Value> = job
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let ids: Vec<u32> = c.ids().iter().chain(&c.eos).copied().collect();
            completion += ids.len();
            choice(i, json!(finish_of(c)), json!(c.stop_reason), ids)
        })
        .collect();
    let mut usage = usage_info(job.prompt_tokens, completion);
    if app.args.enable_prompt_tokens_details {
        usage["prompt_tokens_details"] =
            json!({"cached_tokens": job.cached_tokens, "created_cache_tokens": null, "multimodal_tokens": null});
    }
    Ok(ok(&json!({
        "request_id": request_id, "model": app.args.served_name(), "created": now_secs(), "usage": usage,
        "prompt_logprobs": null, "prompt_token_id_logprobs": null,
        "prompt_token_ids": if g.return_token_ids { json!(g.ids) } else { Value::Null },
        "mm_placeholders": null, "metrics": null, "kv_transfer_params": null, "ec_transfer_params": null,
        "output_mode": "tokens", "choices": choices
    })))
}

/// A chunk per engine step and choice (the prompt's ids on the first with
/// `return_token_ids`), the usage chunk when asked for, `[DONE]`.
fn frames(job: Job, g: Generate, request_id: String) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
    let generated = vec![0usize; job.choices.len()];
    let first = g.return_token_ids.then(|| json!(g.ids));
    let state = (job, g, request_id, generated, first, false);
    futures_util::stream::unfold(state, |(mut job, g, id, mut generated, mut first, done)| async move {
        if done {
            return None;
        }
        let bytes = match job.next().await {
            Some(Step::Delta(i, d)) => {
                let plan = &job.choices[i];
                let mut ids = d.ids;
                let (finish, stop) = if d.last {
                    ids.extend(plan.eos);
                    (json!(finish_of(plan)), json!(plan.stop_reason))
                } else {
                    (Value::Null, Value::Null)
                };
                generated[i] += ids.len();
                let usage = match g.continuous_usage {
                    true => usage_info(job.prompt_tokens, generated[i]),
                    false => Value::Null,
                };
                let mut c = json!({"request_id": id, "usage": usage});
                if let Some(p) = first.take() {
                    c["prompt_token_ids"] = p;
                }
                c["output_mode"] = json!("tokens");
                c["choices"] = json!([choice(i, finish, stop, ids)]);
                return Some((frame(&c), (job, g, id, generated, first, false)));
            }
            Some(Step::Failed(msg)) => [error_frame(&msg).to_vec(), DONE.to_vec()].concat(),
            None => {
                let mut out = Vec::new();
                if g.include_usage {
                    let (p, n) = (job.prompt_tokens, generated.iter().sum::<usize>());
                    let mut usage = json!({"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n});
                    if g.details {
                        usage["prompt_tokens_details"] = json!({"cached_tokens": job.cached_tokens});
                    }
                    out.extend_from_slice(&frame(
                        &json!({"request_id": id, "usage": usage, "output_mode": "tokens", "choices": []}),
                    ));
                }
                out.extend_from_slice(DONE);
                out
            }
        };
        Some((Bytes::from(bytes), (job, g, id, generated, first, true)))
    })
}

/// `POST /inference/v1/abort_requests`: `request_ids` one id or a list of them. The engine
/// keeps no ids (a request ends when its client goes), so nothing else happens.
pub(crate) async fn abort(headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req = request::json_object(&headers, &body)?;
    match req.get("request_ids") {
        Some(Value::String(_)) => {}
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {}
        None => return Err(pydantic::to_error(&[pydantic::missing("request_ids", &req)])),
        Some(other) => {
            return Err(pydantic::to_error(&[PyErr::new(
                "string_type",
                "body.request_ids.str",
                "Input should be a valid string",
                other,
            )]))
        }
    }
    Ok(axum::http::StatusCode::OK.into_response())
}
