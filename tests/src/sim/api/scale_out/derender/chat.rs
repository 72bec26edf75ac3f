//! The streaming chat derender, vLLM's parser path: a fresh parser replays the output the
//! client already has (`output_token_ids`, in its chunks `output_chunk_lens`), then parses this
//! chunk's tokens and sends what they add — reasoning until `</think>` when the prompt left it
//! open, content, tool calls (a call already streamed keeps its id from
//! `last_tool_call_ids`) — with `finish_reason` `tool_calls` once a call went out. The parser
//! is the chat stream's own, so the two read the same tokens alike.

use axum::extract::State as Axum;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::super::super::chat::{self as chat_route, now_secs};
use super::super::super::chat_stream::new_call_id;
use super::super::super::{bad_request, request, ApiError, App, Shared};
use super::super::ok;
use super::completion::{decode_window, STOP_STRINGS};
use super::{check_bounds, ids_of, one_choice, stream_body, text_ids, usage_of, Models, State, StreamBody};
use crate::sim::parser::{self, Parser, ParserConfig, ToolDelta};
use crate::sim::vocab;

const MODELS: Models = Models {
    whole: "DerenderChatRequest",
    stream: "DerenderChatStreamRequest",
    whole_field: "generate_response",
};

/// Whether the server runs a reasoning or tool parser (vLLM then needs the chat request and
/// the prompt's ids).
fn parser_configured(app: &App) -> bool {
    app.args.reasoning_parser.is_some() || (app.args.enable_auto_tool_choice && app.args.tool_call_parser.is_some())
}

pub(crate) async fn chat(Axum(app): Axum<Shared>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let b = stream_body(request::json_object(&headers, &body)?, &MODELS)?;
    request::check_model(&app, &b.req)?;
    let creq = b.req.get("chat_request").and_then(Value::as_object).cloned();
    if creq.as_ref().is_some_and(|r| !request::stop_strings(r).is_empty()) {
        return Err(bad_request(STOP_STRINGS, None, None));
    }
    let parsed = parser_configured(&app);
    let chat_req = match (parsed, creq) {
        (true, None) => return Err(bad_request(
            "chat_request is required when a tool or reasoning parser is configured because plain detokenization would leak raw parser markup into content.",
            None,
            None,
        )),
        (_, r) => r.unwrap_or_default(),
    };
    if parsed && b.prompt_ids.is_none() {
        return Err(bad_request(
            "prompt_token_ids is required when a tool or reasoning parser is configured. Without it parse_delta cannot tell whether the prompt left reasoning open (e.g. a chat template that pre-opens <think>) and would misclassify reasoning content as plain content.",
            None,
            None,
        ));
    }
    let choice = one_choice(&b.chunk, "derender_chat_stream")?;
    let delta = choice.as_ref().map_or(0, |c| ids_of(c.get("token_ids")).len());
    let prompt_len = b.prompt_ids.as_ref().map_or(0, Vec::len);
    check_bounds(&app, prompt_len, b.state.output_ids.len(), delta)?;
    let cfg = parsed.then(|| config(&app, &chat_req, b.prompt_ids.as_deref().unwrap_or_default()));
    let mut state = b.state.clone();
    let choices: Vec<Value> = choice
        .map(|c| derender_choice(&mut state, cfg.as_ref(), &chat_req, &c))
        .into_iter()
        .collect();
    let chunk = chunk_object(&app, &b, &chat_req, choices);
    Ok(ok(&json!({"chunk": chunk, "stream_state": state.to_json()})))
}

/// How the chat request's output is parsed; the prompt's ids say whether it left reasoning
/// open (its last thinking marker is no `</think>`).
fn config(app: &App, chat_req: &Map<String, Value>, prompt_ids: &[u32]) -> ParserConfig {
    let messages = chat_req
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let kwargs = request::template_kwargs(app, chat_req).unwrap_or_default();
    let (rendering, opening) = chat_route::rendering_of(app, chat_req, &messages, &kwargs);
    let open = parser::reasoning_open_after(prompt_ids);
    chat_route::parser_config(app, chat_req, &rendering, opening, open)
}

/// The chunk's choice derendered; `state` moves past its tokens.
fn derender_choice(
    state: &mut State,
    cfg: Option<&ParserConfig>,
    chat_req: &Map<String, Value>,
    c: &Map<String, Value>,
) -> Value {
    let ids = ids_of(c.get("token_ids"));
    let shown = text_ids(&ids, c, Some(chat_req));
    let hide = cfg.is_some() && chat_req.get("include_reasoning") == Some(&Value::Bool(false));
    let mut finish = c.get("finish_reason").cloned().unwrap_or(Value::Null);
    let mut delta = json!({"role": if state.role_sent { Value::Null } else { json!("assistant") }, "content": null, "reasoning": null});
    match cfg {
        Some(cfg) => {
            let step = replay_and_step(state, cfg, shown, !ids.is_empty() || !finish.is_null());
            if !step.content.is_empty() {
                delta["content"] = json!(step.content);
            }
            if !step.reasoning.is_empty() && !hide {
                delta["reasoning"] = json!(step.reasoning);
            }
            if !step.tools.is_empty() {
                state.tools_streamed = true;
                delta["tool_calls"] = tool_calls(&step.tools, &mut state.tool_ids);
            }
            let named = matches!(chat_req.get("tool_choice"), Some(Value::Object(_)));
            if finish == "stop" && state.tools_streamed && !named {
                finish = json!("tool_calls");
            }
            state.output_ids.extend(&ids);
            if !ids.is_empty() {
                state.chunk_lens.push(ids.len());
            }
        }
        None => {
            let text = decode_window(state, shown);
            if !text.is_empty() {
                delta["content"] = json!(text);
            }
        }
    }
    state.role_sent = true;
    state.advance_context(&ids);
    let rti = chat_req.get("return_token_ids") == Some(&Value::Bool(true)) && !hide;
    let field = |k: &str| c.get(k).cloned().unwrap_or(Value::Null);
    json!({"index": field("index"), "delta": delta, "logprobs": null, "finish_reason": finish,
           "stop_reason": field("stop_reason"), "token_ids": if rti { field("token_ids") } else { Value::Null },
           "weight_versions": null})
}

/// Replays the output the client has through a fresh parser (one step per chunk it came in),
/// then parses `shown`; one detokenizer runs over both.
fn replay_and_step(state: &State, cfg: &ParserConfig, shown: &[u32], step: bool) -> crate::sim::parser::Parsed {
    let all: Vec<u32> = state.output_ids.iter().chain(shown).copied().collect();
    let (texts, _) = vocab::piece_texts(&all);
    let mut parser = Parser::new(cfg.clone());
    let mut at = 0;
    for &len in &state.chunk_lens {
        let end = (at + len).min(state.output_ids.len());
        parser.step(&all[at..end], &texts[at..end]);
        at = end;
    }
    if !step {
        return Default::default();
    }
    parser.step(&all[at..], &texts[at..])
}

/// The tool-call deltas as vLLM's `DeltaToolCall` writes them (every field, null when
/// absent); a call's id is the one already streamed for its index, else a new one.
fn tool_calls(tools: &[ToolDelta], ids: &mut Vec<String>) -> Value {
    let mut id_of = |index: usize| match ids.get(index) {
        Some(id) => id.clone(),
        None => {
            let id = new_call_id();
            ids.push(id.clone());
            id
        }
    };
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| match t {
            ToolDelta::Header { index, name } => {
                json!({"id": id_of(*index), "type": "function", "index": index, "function": {"name": name, "arguments": null}})
            }
            ToolDelta::Arguments { index, arguments } => {
                json!({"id": null, "type": null, "index": index, "function": {"name": null, "arguments": arguments}})
            }
            ToolDelta::Whole { index, name, arguments } => {
                json!({"id": id_of(*index), "type": "function", "index": index, "function": {"name": name, "arguments": arguments}})
            }
        })
        .collect();
    Value::Array(calls)
}

fn chunk_object(app: &App, b: &StreamBody, chat_req: &Map<String, Value>, choices: Vec<Value>) -> Value {
    let model = b
        .req
        .get("model")
        .filter(|m| m.as_str().is_some_and(|m| !m.is_empty()))
        .cloned()
        .unwrap_or_else(|| json!(app.args.served_name()));
    let rti = chat_req.get("return_token_ids") == Some(&Value::Bool(true));
    let prompt_ids = b.chunk.get("prompt_token_ids").cloned().filter(|_| rti);
    let prompt_tokens = b.req.get("prompt_tokens").and_then(Value::as_u64);
    json!({"id": b.chunk.get("request_id").cloned().unwrap_or(Value::Null), "object": "chat.completion.chunk",
           "created": now_secs(), "model": model, "choices": choices, "usage": usage_of(&b.chunk, prompt_tokens),
           "system_fingerprint": null, "prompt_token_ids": prompt_ids, "prompt_text": null, "metrics": null,
           "kv_transfer_params": null})
}
