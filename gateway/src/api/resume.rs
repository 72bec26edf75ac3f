//! What continuing a cut stream needs of the OpenAI APIs (docs/resume.md): which requests can
//! be continued exactly, the token ids their chunks carry for it (asked upstream with
//! `return_token_ids`, and kept from a client that did not ask for them), and the client's chunk
//! made from one that vLLM's derender returned.

use serde_json::{json, Map, Value};

/// How a stream can be continued (docs/resume.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resumable {
    /// Exactly, from its token ids: vLLM's render, tokens-in generate and derender.
    Tokens(TokenApi),
    /// A temperature-0 stream whose API's stream carries no token ids: the request run again
    /// and spliced past what was sent (`pipeline::splice`).
    Replay(ReplayApi),
}

/// The APIs continued from their token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenApi {
    Chat,
    Completions,
}

impl TokenApi {
    pub(crate) fn render_path(self) -> &'static str {
        match self {
            TokenApi::Chat => "/v1/chat/completions/render",
            TokenApi::Completions => "/v1/completions/render",
        }
    }

    pub(crate) fn derender_path(self) -> &'static str {
        match self {
            TokenApi::Chat => "/v1/chat/completions/derender",
            TokenApi::Completions => "/v1/completions/derender",
        }
    }

    /// The derender's field for the original request.
    pub(crate) fn request_field(self) -> &'static str {
        match self {
            TokenApi::Chat => "chat_request",
            TokenApi::Completions => "completion_request",
        }
    }

    /// `max_tokens` when the render leaves it out: 0.33's completions render omits
    /// completions' default (16); chat's it fills in.
    pub(crate) fn default_max_tokens(self) -> u64 {
        match self {
            TokenApi::Chat => u64::MAX,
            TokenApi::Completions => 16,
        }
    }
}

/// The APIs continued by replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayApi {
    /// Anthropic's Messages.
    Messages,
    Responses,
}

/// Whether a sampling temperature's JSON text is 0: the only sampling a replay repeats.
pub(crate) fn greedy(temperature: &str) -> bool {
    temperature.trim().parse::<f64>() == Ok(0.0)
}

/// A stream that can be continued, and whether its client asked for token ids itself (else
/// the gateway asked, and removes them from what the client gets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResumeSpec {
    pub(crate) kind: Resumable,
    pub(crate) client_ids: bool,
}

pub(crate) const GENERATE_PATH: &str = "/inference/v1/generate";

/// Whether the field `key`, whose JSON text is `value`, rules a continuation out: a grammar's
/// state at the cut (structured outputs, a forced tool call), logprobs (the continuation's are a
/// new request's), stop strings (vLLM's streaming derender cannot hold text back for them), a
/// minimum length, the prompt echoed, several candidates. Null or false rules nothing out. A
/// `match` (length first, then the bytes): every key of every body passes here.
pub(crate) fn blocks(key: &str, value: &str) -> bool {
    let listed = match key {
        // A forced call is a grammar; auto and none are the model's own choice.
        "tool_choice" => return !matches!(value.trim(), "null" | "\"auto\"" | "\"none\""),
        "response_format" | "structured_outputs" | "guided_json" | "guided_regex" | "guided_choice"
        | "guided_grammar" | "logprobs" | "top_logprobs" | "prompt_logprobs" | "echo" | "best_of"
        | "use_beam_search" | "stop" | "min_tokens" | "suffix" => true,
        _ => false,
    };
    listed && !matches!(value.trim(), "null" | "false" | "[]" | "0")
}

/// A searcher for one literal, built once (building one per search costs more than searching a
/// token's chunk).
macro_rules! finder {
    ($needle:literal) => {{
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new($needle));
        &*FINDER
    }};
}

/// Where `"key":[` is, for the keys that carry token ids.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IdKey {
    /// A choice's `token_ids` (`"token_ids":[`).
    Output,
    /// The first chunk's `prompt_token_ids`.
    Prompt,
}

impl IdKey {
    fn finder(self) -> &'static memchr::memmem::Finder<'static> {
        match self {
            IdKey::Output => finder!(b"\"token_ids\":["),
            IdKey::Prompt => finder!(b"\"prompt_token_ids\":["),
        }
    }
}

/// Whether `hay` holds `needle` (a literal; its searcher built once).
macro_rules! holds {
    ($hay:expr, $needle:literal) => {
        finder!($needle).find($hay).is_some()
    };
}
pub(crate) use {finder, holds};

/// The integers of the list that follows `"key":[` in `event`, with the byte range of the list
/// (`[` to `]`) so it can be written `null` instead.
pub(crate) fn id_list(event: &[u8], key: IdKey) -> Option<(std::ops::Range<usize>, Vec<u32>)> {
    let mut ids = Vec::new();
    let list = ids_into(event, key, &mut ids)?;
    Some((list, ids))
}

/// [`id_list`] appending to `out` (no list of its own per chunk); on a malformed list, `out` is
/// left as it was and nothing is found.
pub(crate) fn ids_into(event: &[u8], key: IdKey, out: &mut Vec<u32>) -> Option<std::ops::Range<usize>> {
    let finder = key.finder();
    let at = finder.find(event)?;
    let open = at + finder.needle().len() - 1;
    let close = open + memchr::memchr(b']', &event[open..])?;
    let len = out.len();
    for item in event[open + 1..close].split(|b| *b == b',') {
        let digits = item.trim_ascii();
        if digits.is_empty() {
            continue;
        }
        match std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()) {
            Some(id) => out.push(id),
            None => {
                out.truncate(len);
                return None;
            }
        }
    }
    Some(open..close + 1)
}

/// A chunk as a client that did not ask for token ids gets it: the id lists at `lists` (found
/// by `id_list`, in order) written `null`, as vLLM writes them then; `None` when nothing else is
/// left to send — a control token's chunk (an empty delta, no finish), which vLLM sends only to
/// carry its ids.
pub(crate) fn without_ids(event: &[u8], lists: &[std::ops::Range<usize>]) -> Option<Vec<u8>> {
    if holds!(event, b"\"delta\":{}") && holds!(event, b"\"finish_reason\":null") {
        return None;
    }
    let mut out = Vec::with_capacity(event.len());
    let mut from = 0;
    for list in lists {
        out.extend_from_slice(&event[from..list.start]);
        out.extend_from_slice(b"null");
        from = list.end;
    }
    out.extend_from_slice(&event[from..]);
    Some(out)
}

/// The chunk a derendered one becomes: the original stream's own chunk (`template`, its last one
/// before the cut) with the derendered choice's delta (unset fields left out, as vLLM's stream
/// leaves them), finish, and the generated `ids` it came from (the relay records them and, for
/// a client that did not ask for them, writes them `null`); `None` when it carries nothing.
pub(crate) fn client_chunk(template: &Value, derendered: &Value, ids: &[u32]) -> Option<Value> {
    let choice = derendered.get("choices")?.get(0)?;
    let mut delta: Map<String, Value> = choice
        .get("delta")
        .and_then(Value::as_object)
        .map(|d| {
            d.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    if template.get("id") != derendered.get("id") {
        // The role went out with the stream's own first chunk.
        delta.remove("role");
    }
    let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
    let text = choice.get("text").cloned();
    let silent = delta.is_empty() && finish.is_null() && text.as_ref().is_none_or(|t| t.as_str() == Some(""));
    if silent && ids.is_empty() {
        return None;
    }
    let mut out = template.clone();
    let slot = out.get_mut("choices")?.get_mut(0)?;
    if let Some(text) = text {
        slot["text"] = text;
    } else {
        slot["delta"] = Value::Object(delta);
    }
    slot["finish_reason"] = finish.clone();
    if !finish.is_null() {
        slot["stop_reason"] = choice.get("stop_reason").cloned().unwrap_or(Value::Null);
    }
    slot["token_ids"] = json!(ids);
    Some(out)
}

/// The usage chunk of a continued stream: the prompt counted once, the completion tokens of
/// both parts.
pub(crate) fn usage_chunk(template: &Value, prompt: usize, completion: usize) -> Value {
    let mut out = json!({
        "id": template["id"],
        "object": template["object"],
        "created": template["created"],
        "model": template["model"],
        "choices": [],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion},
    });
    if template.get("system_fingerprint").is_some() {
        out["system_fingerprint"] = template["system_fingerprint"].clone();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_call_structured_output_logprobs_or_stop_strings_rule_a_continuation_out() {
        assert!(blocks("tool_choice", "\"required\""));
        assert!(blocks("tool_choice", r#"{"type":"function","function":{"name":"f"}}"#));
        assert!(!blocks("tool_choice", "\"auto\""));
        assert!(blocks("response_format", r#"{"type":"json_object"}"#));
        assert!(blocks("logprobs", "true"));
        assert!(!blocks("logprobs", "false"));
        assert!(blocks("stop", r#"["\n"]"#));
        assert!(!blocks("stop", "[]"));
        assert!(!blocks("temperature", "0"));
    }

    #[test]
    fn only_a_temperature_of_zero_is_replayed() {
        assert!(greedy("0") && greedy(" 0.0") && greedy("-0"));
        assert!(!greedy("0.1") && !greedy("\"0\"") && !greedy("null"));
    }

    #[test]
    fn token_ids_are_read_and_removed_with_their_key() {
        let chunk = br#"data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":[12, 7]}],"kv_transfer_params":null}"#;
        let (range, ids) = id_list(chunk, IdKey::Output).unwrap();
        assert_eq!(ids, [12, 7]);
        assert_eq!(&chunk[range.clone()], b"[12, 7]");
        let clean = without_ids(chunk, &[range]).unwrap();
        assert_eq!(
            std::str::from_utf8(&clean).unwrap(),
            r#"data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}"#
        );
        let role = br#"data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1,2,3]}"#;
        let (prompt, ids) = id_list(role, IdKey::Prompt).unwrap();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(id_list(role, IdKey::Output), None, "prompt_token_ids is not token_ids");
        assert!(without_ids(role, &[prompt])
            .unwrap()
            .ends_with(br#""prompt_token_ids":null}"#));
        let control = br#"data: {"id":"c","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[233]}]}"#;
        let (list, _) = id_list(control, IdKey::Output).unwrap();
        assert_eq!(
            without_ids(control, &[list]),
            None,
            "a control token's chunk is vLLM's only for its ids"
        );
    }

    #[test]
    fn a_derendered_chunk_becomes_the_streams_own() {
        let template = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": null, "finish_reason": null}]});
        let derendered = json!({"id": "generate-tokens-9", "created": 6, "model": "m",
            "choices": [{"index": 0, "delta": {"role": null, "content": "hi", "reasoning": null},
                         "logprobs": null, "finish_reason": null, "token_ids": null}]});
        let out = client_chunk(&template, &derendered, &[4]).unwrap();
        assert_eq!(out["id"], "chatcmpl-1");
        assert_eq!(out["choices"][0]["delta"], json!({"content": "hi"}));
        assert_eq!(out["choices"][0]["token_ids"], json!([4]));
        let empty = json!({"choices": [{"delta": {"role": null, "content": null}, "finish_reason": null}]});
        assert_eq!(client_chunk(&template, &empty, &[]), None);
        let control = client_chunk(&template, &empty, &[9]).unwrap();
        assert_eq!(
            control["choices"][0]["delta"],
            json!({}),
            "a control token's ids still travel"
        );
        let last = json!({"choices": [{"delta": {}, "finish_reason": "stop", "stop_reason": null}]});
        assert_eq!(
            client_chunk(&template, &last, &[]).unwrap()["choices"][0]["finish_reason"],
            "stop"
        );
    }
}
