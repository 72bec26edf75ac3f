//! `POST /v1/completions`: a prompt (string or list of strings) continued with deterministic
//! prose; `max_tokens` defaults to 16 as in vLLM.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};

use super::chat::{error_frame, frame, now_secs, sse_response, with_request_id, DONE};
use super::generate::{ChoicePlan, Delta, Job, Step};
use super::request::{self, invalid};
use super::{bad_request, before, logprobs, schema, validate, App};
use super::{internal_error, json_response, ApiError, Shared};
use crate::sim::changes::{exclude_null, Change};
use crate::sim::parser::ParserConfig;
use crate::sim::{count, model, vocab};

/// The completion renderer's refusals (renderers/online_renderer.py, renderers/embed_utils.py):
/// a suffix where the model renders no fill-in-the-middle, and prompt embeddings (the server
/// runs without `--enable-prompt-embeds`).
fn renderer_checks(app: &App, req: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    if req.get("prompt") == Some(&Value::Array(Vec::new())) {
        return Err(bad_request("You must pass at least one prompt", Some("prompt"), None));
    }
    let suffix = req.get("suffix").is_some_and(|s| !s.is_null());
    let set = |k: &str| req.get(k).is_some_and(|v| !v.is_null());
    // The renderer's order: echo, prompt embeddings, truncation, then the model's FIM support.
    let conflict = [
        ("echo", "Echo is unsupported with suffix."),
        ("prompt_embeds", "suffix is not supported with prompt_embeds"),
        (
            "truncate_prompt_tokens",
            "suffix is not supported with truncate_prompt_tokens",
        ),
    ]
    .into_iter()
    .find(|(k, _)| {
        suffix
            && if *k == "echo" {
                req.get(*k) == Some(&Value::Bool(true))
            } else {
                set(k)
            }
    });
    if let Some((_, message)) = conflict {
        return Err(super::error(
            axum::http::StatusCode::BAD_REQUEST,
            "BadRequestError",
            message,
            Some("suffix"),
        ));
    }
    // DeepSeek's tokenizer renders fill-in-the-middle; GLM's does not.
    let fim = matches!(app.template, crate::sim::text::Template::DeepSeek);
    if !fim && req.get("suffix").is_some_and(|s| !s.is_null()) {
        // The renderer's own error response: the parameter named, not appended to the text.
        return Err(super::error(
            axum::http::StatusCode::BAD_REQUEST,
            "BadRequestError",
            "suffix is only supported for models with FIM completion rendering",
            Some("suffix"),
        ));
    }
    let embeds = match req.get("prompt_embeds") {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    if embeds && req.get("prompt_logprobs").is_some_and(|p| !p.is_null()) {
        return Err(bad_request(
            "prompt_logprobs is not compatible with prompt embeds.",
            None,
            None,
        ));
    }
    if embeds {
        return Err(bad_request(
            "You must set `--enable-prompt-embeds` to input `prompt_embeds`.",
            Some("prompt_embeds"),
            None,
        ));
    }
    Ok(())
}

/// A completions request checked in vLLM's order, before the engine.
pub(crate) struct Checked {
    pub(crate) req: serde_json::Map<String, Value>,
    pub(crate) prompts: Vec<String>,
    /// Each prompt's ids: as given, or a text's as the real frontend counts it (`prompt_ids`).
    pub(crate) ids: Vec<Vec<u32>>,
    pub(crate) stream: request::StreamOptions,
    /// `max_tokens`, 16 when not given.
    pub(crate) max_tokens: usize,
}

/// Validates a completions body and runs vLLM's serving checks on it.
pub(crate) fn checked(app: &App, headers: &HeaderMap, body: &[u8]) -> Result<Checked, ApiError> {
    let mut req = request::json_object(headers, body)?;
    before::run(before::COMPLETION, &mut req)?;
    before::run(before::COMPLETION_FIELDS, &mut req)?;
    schema::check_body("/v1/completions", &mut req)?;
    request::check_model(app, &req)?;
    request::untrusted_mm_kwargs(&req)?;
    request::truncation(app, &req)?;
    renderer_checks(app, &req)?;
    let prompts = prompts(&req)?;
    // Beam search builds `BeamSearchParams`, which `SamplingParams`' checks do not cover.
    if req.get("use_beam_search") == Some(&Value::Bool(true)) {
        validate::beam_search(&req, true)?;
    } else {
        validate::sampling(app, &req, &["max_tokens"])?;
        let prompt_lp = req.get("prompt_logprobs").and_then(Value::as_i64);
        validate::sample_logprobs(req.get("logprobs").and_then(Value::as_i64), prompt_lp)?;
        validate::speculation(app, &req)?;
    }
    request::empty_decoder_prompt(&req)?;
    let stream = request::stream_options(app, &req)?;
    let max_tokens = request::max_tokens(app, &req, &["max_tokens"])?.unwrap_or(16) as usize;
    let ids = prompt_ids(app, &req);
    let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
    request::check_prompt_length(app, lengths.iter().copied().max().unwrap_or(0))?;
    request::routed_experts_start(&req, lengths.iter().copied().min().unwrap_or(0))?;
    Ok(Checked {
        req,
        prompts,
        ids,
        stream,
        max_tokens,
    })
}

pub(crate) async fn handle(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let Checked {
        req,
        prompts,
        ids,
        stream,
        max_tokens,
    } = checked(&app, &headers, &body)?;
    let top = req.get("logprobs").and_then(Value::as_u64).map(|k| k as usize);
    let ignore_eos = req.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false);
    let choices: Vec<ChoicePlan> = prompts
        .iter()
        .map(|p| {
            // The model reads the prompt's tokens, as `/inference/v1/generate` does.
            let planned = model::continuation(app.template, &vocab::tokenize(p), None);
            ChoicePlan::new(planned, max_tokens, ignore_eos, 0, ParserConfig::default())
        })
        .collect();
    let request_id = request::request_id(&headers, &req);
    let texts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let job = Job::start_tokens(&app, &ids, &texts, choices)?;
    let reply = Reply {
        id: format!("cmpl-{request_id}"),
        model: app.args.served_name().to_owned(),
        created: now_secs(),
        top,
        fingerprint: app.fingerprint.clone(),
        beam_search: req.get("use_beam_search") == Some(&Value::Bool(true)),
        prompt_logprobs: req.get("prompt_logprobs").is_some_and(|p| !p.is_null()),
        prompt_ids: (req.get("return_token_ids") == Some(&Value::Bool(true)))
            .then(|| ids.iter().map(|i| json!(i)).collect()),
    };
    if !stream.stream {
        return whole(&app, job, &reply, &request_id).await;
    }
    let frames = frames(app.clone(), job, reply, stream.include_usage);
    Ok(sse_response(&app, &request_id, frames))
}

/// Each prompt's ids: token ids as given; a text's as the real frontend counts them (the
/// fixture's tokenizer), shown as [`vocab::prompt_ids`] (reading back as the text).
fn prompt_ids(app: &App, req: &serde_json::Map<String, Value>) -> Vec<Vec<u32>> {
    let given = |ids: &[Value]| ids.iter().filter_map(Value::as_u64).map(|i| i as u32).collect();
    let text = |p: &str| vocab::prompt_ids(p, count::text_ids(app.template, p).len());
    match req.get("prompt") {
        Some(Value::String(p)) => vec![text(p)],
        Some(Value::Array(a)) if a.iter().all(Value::is_u64) => vec![given(a)],
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| match p {
                Value::Array(ids) => given(ids),
                other => text(other.as_str().unwrap_or_default()),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The prompts: one string or a list of them, none empty.
/// A token-id prompt as text: the ids the simulator's vocabulary knows, else one word a token.
fn from_ids(ids: &[Value]) -> String {
    let ids: Vec<u64> = ids.iter().filter_map(Value::as_u64).collect();
    vocab::detokenize(&ids).unwrap_or_else(|| vec!["a"; ids.len()].join(" "))
}

fn prompts(req: &serde_json::Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match req.get("prompt") {
        Some(Value::String(p)) if !p.is_empty() => Ok(vec![p.clone()]),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
            Ok(a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        }
        // Token ids: one prompt, or a list of them.
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => Ok(vec![from_ids(a)]),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_array) => Ok(a
            .iter()
            .filter_map(Value::as_array)
            .map(|ids| from_ids(ids.as_slice()))
            .collect()),
        Some(other) if !other.is_null() && !other.as_str().is_some_and(str::is_empty) => Err(invalid(
            "string_type",
            "prompt",
            "Input should be a valid string",
            other,
        )),
        _ => Err(bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty.",
            Some("prompt"),
            None,
        )),
    }
}

/// What every body or chunk of one completion names.
#[derive(Debug, Clone)]
struct Reply {
    id: String,
    model: String,
    created: u64,
    /// `logprobs`: the alternatives shown per token (none: no logprobs).
    top: Option<usize>,
    fingerprint: String,
    /// `use_beam_search`: vLLM's beam-search path reports no prompt token details.
    beam_search: bool,
    /// `prompt_logprobs` asked: one entry a prompt token, each null as the engine (no model)
    /// gives none.
    prompt_logprobs: bool,
    /// `return_token_ids`: each prompt's ids.
    prompt_ids: Option<Vec<Value>>,
}

impl Reply {
    /// Choice `i`'s prompt ids with `return_token_ids` (a choice a prompt), else null.
    fn prompt_ids_of(&self, i: usize) -> Value {
        self.prompt_ids
            .as_ref()
            .and_then(|p| p.get(i).cloned())
            .unwrap_or(Value::Null)
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": choices})
    }
}

/// The whole completion in one body, once every choice is done.
async fn whole(app: &Shared, mut job: Job, reply: &Reply, request_id: &str) -> Result<Response, ApiError> {
    job.complete().await.map_err(|msg| internal_error(&msg))?;
    let top = reply.top;
    let prompt_lp = if reply.prompt_logprobs {
        Value::Array(vec![Value::Null; job.prompt_tokens])
    } else {
        Value::Null
    };
    let choices: Vec<Value> = job
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"index": i, "text": c.content_text(), "logprobs": top.map_or(Value::Null, |k| logprobs::completion(c.released(), k)), "finish_reason": c.finish, "stop_reason": null,
            "token_ids": reply.prompt_ids.as_ref().map_or(Value::Null, |_| json!(c.ids().iter().chain(&c.eos).collect::<Vec<_>>())),
            "prompt_logprobs": prompt_lp,
            "prompt_token_ids": reply.prompt_ids_of(i), "routed_experts": null, "weight_versions": null}))
        .collect();
    let (prompt_tokens, completion) = (job.prompt_tokens, job.completion_tokens());
    let mut body = json!({
        "id": reply.id, "object": "text_completion", "created": reply.created, "model": reply.model, "choices": choices,
        "service_tier": null, "system_fingerprint": app.fingerprint,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion, "completion_tokens": completion,
            "prompt_tokens_details": if reply.beam_search { Value::Null } else { details(app, job.cached_tokens, false).unwrap_or(Value::Null) },
            "completion_tokens_details": null},
        "kv_transfer_params": null, "ec_transfer_params": null, "metrics": null
    });
    exclude_null(
        &mut body["usage"],
        "prompt_tokens_details",
        Change::PromptDetailsOmittedWhenNone,
    );
    Ok(with_request_id(app, request_id, json_response(StatusCode::OK, &body)))
}

/// The streamed completion: a chunk per delta, then the usage chunk when asked for, `[DONE]`.
fn frames(
    app: Shared,
    job: Job,
    reply: Reply,
    include_usage: bool,
) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
    let started = vec![false; job.choices.len()];
    futures_util::stream::unfold((job, false, started), move |(mut job, done, mut started)| {
        let (reply, app) = (reply.clone(), app.clone());
        async move {
            if done {
                return None;
            }
            loop {
                match job.next().await {
                    Some(Step::Delta(i, d)) => {
                        // A step with no text yet (a character's first bytes) still shows its ids.
                        if d.content.is_empty() && !d.last && (reply.prompt_ids.is_none() || d.ids.is_empty()) {
                            continue;
                        }
                        let first = !std::mem::replace(&mut started[i], true);
                        let c = delta_chunk(&reply, &job, i, &d, include_usage, first);
                        return Some((frame(&c), (job, false, started)));
                    }
                    Some(Step::Failed(msg)) => {
                        let mut b = error_frame(&msg).to_vec();
                        b.extend_from_slice(DONE);
                        return Some((Bytes::from(b), (job, true, started)));
                    }
                    None => {
                        let mut b = Vec::new();
                        if include_usage {
                            b.extend_from_slice(&frame(&usage_chunk(&app, &reply, &job)));
                        }
                        b.extend_from_slice(DONE);
                        return Some((Bytes::from(b), (job, true, started)));
                    }
                }
            }
        }
    })
}

/// The chunk of choice `i`'s delta `d`; the last one names the fingerprint unless the usage
/// chunk follows.
/// `first`: choice `i`'s first chunk, which carries its prompt's ids with `return_token_ids`.
fn delta_chunk(reply: &Reply, job: &Job, i: usize, d: &Delta, include_usage: bool, first: bool) -> Value {
    let finish = if d.last {
        Value::String(job.choices[i].finish.into())
    } else {
        Value::Null
    };
    let lp = match reply.top {
        Some(k) if !d.tokens.is_empty() => logprobs::completion(&d.tokens, k),
        _ => Value::Null,
    };
    let eos = job.choices[i].eos.filter(|_| d.last);
    let (prompt_ids, ids) = match &reply.prompt_ids {
        Some(_) => (
            if first { reply.prompt_ids_of(i) } else { Value::Null },
            json!(d.ids.iter().chain(&eos).collect::<Vec<_>>()),
        ),
        None => (Value::Null, Value::Null),
    };
    let mut c = reply.chunk(
        json!([{"index": i, "text": d.content, "logprobs": lp, "finish_reason": finish, "stop_reason": null, "prompt_token_ids": prompt_ids, "token_ids": ids, "weight_versions": null}]),
    );
    if d.last && !include_usage {
        c["system_fingerprint"] = Value::String(reply.fingerprint.clone());
    }
    c["kv_transfer_params"] = Value::Null;
    c
}

/// The usage chunk that ends a stream with `include_usage`.
fn usage_chunk(app: &App, reply: &Reply, job: &Job) -> Value {
    let completion = job.completion_tokens();
    let mut c = reply.chunk(json!([]));
    c["usage"] = json!({"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens + completion, "completion_tokens": completion});
    if let Some(d) = details(app, job.cached_tokens, true) {
        c["usage"]["prompt_tokens_details"] = d;
    }
    c["system_fingerprint"] = Value::String(reply.fingerprint.clone());
    c
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
