//! `POST /v1/chat/completions`'s answer: the whole body, or the SSE chunk sequence of a
//! streamed chat completion as vLLM shapes it: the role chunks,
//! one chunk per engine step with what the parser made of the step's tokens (a step whose
//! tokens show nothing still goes out, with an empty delta, when token ids or logprobs were
//! asked for), the finish chunk (carrying the end-of-sequence token's id after a natural end),
//! the usage chunk, `[DONE]`.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::chat::{error_frame, frame, full_body, run, sse_response, usage, with_request_id, Ctx, DONE};
use super::generate::{Delta, Job, Step};
use super::{internal_error, json_response, logprobs, request, Shared};
use crate::sim::changes::{since, Change};
use crate::sim::parser::ToolDelta;

pub(crate) async fn handle(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    match run(&app, &headers, &body) {
        Ok((job, ctx)) if ctx.stream.stream => stream(app.clone(), job, ctx),
        Ok((mut job, ctx)) => match job.complete().await {
            Ok(()) => with_request_id(
                &app,
                &ctx.request_id,
                json_response(StatusCode::OK, &full_body(&app, &job, &ctx)),
            ),
            Err(msg) => internal_error(&msg).into_response(),
        },
        Err(e) => e.into_response(),
    }
}

struct StreamState {
    app: Shared,
    job: Job,
    ctx: Ctx,
    pending: std::collections::VecDeque<Bytes>,
    finished: bool,
    /// The role chunks go out with the first engine output (after prefill), as in vLLM.
    started: bool,
    /// Each choice's tool call ids, by call index.
    call_ids: Vec<Vec<String>>,
}

/// A tool call's id as vLLM makes them.
pub(crate) fn new_call_id() -> String {
    format!("chatcmpl-tool-{}", request::random_hex(16))
}

/// The `tool_calls` entries of `tools`; a call's first part names its id (a new one, kept in
/// `ids` by index).
pub(crate) fn tool_calls_json(
    tools: &[ToolDelta],
    ids: &mut Vec<String>,
    mut id_for: impl FnMut(usize) -> String,
) -> Value {
    let mut id_of = |index: usize, ids: &mut Vec<String>| {
        if ids.len() <= index {
            ids.resize(index + 1, String::new());
        }
        if ids[index].is_empty() {
            ids[index] = id_for(index);
        }
        ids[index].clone()
    };
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| match t {
            ToolDelta::Header { index, name } => {
                json!({"id": id_of(*index, ids), "type": "function", "index": index, "function": {"name": name}})
            }
            ToolDelta::Arguments { index, arguments } => {
                json!({"index": index, "function": {"arguments": arguments}})
            }
            ToolDelta::Whole { index, name, arguments } => {
                json!({"id": id_of(*index, ids), "type": "function", "index": index, "function": {"name": name, "arguments": arguments}})
            }
        })
        .collect();
    Value::Array(calls)
}

impl StreamState {
    fn chunk(&self, choices: Value, extra: Option<(&str, Value)>) -> Value {
        let mut c = json!({"id": self.ctx.id, "object": "chat.completion.chunk", "created": self.ctx.created, "model": self.ctx.model, "choices": choices});
        if let Some((k, v)) = extra {
            c[k] = v;
        }
        if self.ctx.stream.continuous_usage && !c["choices"].as_array().is_some_and(Vec::is_empty) {
            let (p, n) = (self.job.prompt_tokens, self.job.completion_tokens());
            c["usage"] = json!({"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n, "completion_tokens_details": {"reasoning_tokens": self.job.reasoning_tokens()}});
        }
        c
    }

    fn role_chunks(&mut self) {
        if self.started {
            return;
        }
        self.started = true;
        for index in 0..self.job.choices.len() {
            let choice = json!({"index": index, "delta": {"role": self.ctx.role, "content": ""}, "logprobs": null, "finish_reason": null});
            let mut c = self.chunk(json!([choice]), None);
            if c.get("usage").is_some() && since(Change::FirstChunkPromptDetails) {
                // The role chunks' usage: the prompt's split is known from the first output.
                let details = usage(&self.app, &self.job, false)["prompt_tokens_details"].take();
                if !details.is_null() {
                    c["usage"]["prompt_tokens_details"] = details;
                }
            }
            c["prompt_token_ids"] = self.ctx.prompt_ids.clone().unwrap_or(Value::Null);
            c["prompt_text"] = self.ctx.prompt_text.clone();
            self.pending.push_back(frame(&c));
        }
    }

    /// Whether a step that shows nothing still sends a chunk (for its ids or logprobs).
    fn shows_tokens(&self) -> bool {
        self.ctx.prompt_ids.is_some() || self.ctx.logprobs.is_some()
    }

    /// A content (or reasoning, or tool-call) chunk: vLLM adds `token_ids` to the choice and
    /// `kv_transfer_params` to the chunk.
    fn push_delta(&mut self, index: usize, delta: Map<String, Value>, ids: &[u32], tokens: &[String]) {
        let lp = self.logprobs(tokens);
        let choice =
            json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": null, "token_ids": self.ids(ids)});
        let c = self.chunk(json!([choice]), Some(("kv_transfer_params", Value::Null)));
        self.pending.push_back(frame(&c));
    }

    /// A chunk's token ids, with `return_token_ids`.
    fn ids(&self, ids: &[u32]) -> Value {
        match self.ctx.prompt_ids {
            Some(_) => json!(ids),
            None => Value::Null,
        }
    }

    fn logprobs(&self, tokens: &[String]) -> Value {
        match self.ctx.logprobs {
            Some(top) if !tokens.is_empty() => logprobs::chat(tokens, top),
            _ => Value::Null,
        }
    }

    /// With `include_reasoning: false` the reasoning parser sets each delta's reasoning to
    /// None (`parse_delta`), which pydantic then writes: `"reasoning": null` on every delta
    /// that carries content or a tool call.
    fn hide_reasoning(&self, delta: &mut Map<String, Value>) {
        if !self.ctx.include_reasoning {
            delta.insert("reasoning".into(), Value::Null);
        }
    }

    /// The delta a step shows: its reasoning, content and tool calls' parts.
    fn delta_of(&mut self, index: usize, d: &Delta) -> Map<String, Value> {
        let mut delta = Map::new();
        if !d.reasoning.is_empty() && self.ctx.include_reasoning {
            delta.insert("reasoning".into(), Value::String(d.reasoning.clone()));
        }
        if !d.content.is_empty() {
            delta.insert("content".into(), Value::String(d.content.clone()));
            self.hide_reasoning(&mut delta);
        }
        if !d.tools.is_empty() {
            let calls = tool_calls_json(&d.tools, &mut self.call_ids[index], |_| new_call_id());
            delta.insert("tool_calls".into(), calls);
            self.hide_reasoning(&mut delta);
        }
        delta
    }

    fn on_delta(&mut self, index: usize, d: Delta) {
        self.role_chunks();
        let delta = self.delta_of(index, &d);
        let shows = !delta.is_empty() || (self.shows_tokens() && !d.ids.is_empty());
        if !d.last {
            if shows {
                self.push_delta(index, delta, &d.ids, &d.tokens);
            }
            return;
        }
        let plan = &self.job.choices[index];
        let (finish, stop_reason, eos) = (plan.finish, plan.stop_reason.clone(), plan.eos);
        let (mut delta, mut ids, mut tokens) = (delta, d.ids, d.tokens);
        if finish != "length" && shows {
            // The end-of-sequence token (or the stop string) has no text: the step's text goes
            // first, the finish in a chunk of its own.
            self.push_delta(
                index,
                std::mem::take(&mut delta),
                &std::mem::take(&mut ids),
                &std::mem::take(&mut tokens),
            );
        }
        ids.extend(eos);
        let lp = self.logprobs(&tokens);
        let choice = json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": self.ids(&ids), "weight_versions": null});
        let mut c = self.chunk(json!([choice]), Some(("kv_transfer_params", Value::Null)));
        if !self.ctx.stream.include_usage {
            c["system_fingerprint"] = Value::String(self.app.fingerprint.clone());
        }
        self.pending.push_back(frame(&c));
    }

    fn on_end(&mut self) {
        if self.ctx.stream.include_usage {
            let mut c = self.chunk(json!([]), None);
            c["usage"] = usage(&self.app, &self.job, true);
            c["system_fingerprint"] = Value::String(self.app.fingerprint.clone());
            self.pending.push_back(frame(&c));
        }
        self.pending.push_back(Bytes::from_static(DONE));
        self.finished = true;
    }
}

pub(crate) fn stream(app: Shared, job: Job, ctx: Ctx) -> Response {
    let request_id = ctx.request_id.clone();
    let state = StreamState {
        app: app.clone(),
        call_ids: vec![Vec::new(); job.choices.len()],
        job,
        ctx,
        pending: Default::default(),
        finished: false,
        started: false,
    };
    let frames = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.pending.pop_front() {
                return Some((b, s));
            }
            if s.finished {
                return None;
            }
            match s.job.next().await {
                Some(Step::Delta(i, d)) => s.on_delta(i, d),
                Some(Step::Failed(msg)) => {
                    s.pending.push_back(error_frame(&msg));
                    s.pending.push_back(Bytes::from_static(DONE));
                    s.finished = true;
                }
                None => {
                    s.role_chunks();
                    s.on_end()
                }
            }
        }
    });
    sse_response(&app, &request_id, frames)
}
