//! What a stream that can be continued records as it is relayed (docs/resume.md): the prompt's
//! token ids, every generated id with the chunk it came in, the ids of the tool calls it
//! streamed, and its own last chunk — what vLLM's derender needs to carry on in the same state,
//! and what the continued chunks are made to look like. It also keeps the ids from a client that
//! did not ask for them.

use bytes::Bytes;
use serde_json::Value;

use crate::api::normalize::ResumeSpec;
use crate::api::resume::{finder, holds, id_list, ids_into, without_ids, IdKey, Resumable};
use crate::pipeline::splice::Sent;

/// The record of one stream, up to its cut.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    pub(crate) spec: ResumeSpec,
    /// The prompt's ids, from the first chunk.
    pub(crate) prompt: Option<Vec<u32>>,
    /// Every generated id so far.
    pub(crate) output: Vec<u32>,
    /// How many ids each chunk carried (derender replays its parser at these boundaries).
    pub(crate) chunk_lens: Vec<usize>,
    /// The id of each tool call streamed, by index.
    pub(crate) tool_ids: Vec<String>,
    /// The last chunk with a choice the client got (a continued chunk is this one with its
    /// delta and finish replaced).
    pub(crate) template: Option<Bytes>,
    /// A chunk with a finish reason went out: the generation is complete.
    pub(crate) finished: bool,
    /// The first chunk (the one with the prompt's ids) was seen.
    first_seen: bool,
    /// A stream continued by replay: what its client got, event by event.
    pub(crate) sent: Option<Sent>,
}

impl Trace {
    pub(crate) fn new(spec: ResumeSpec) -> Trace {
        Trace {
            spec,
            prompt: None,
            output: Vec::new(),
            chunk_lens: Vec::new(),
            tool_ids: Vec::new(),
            template: None,
            finished: false,
            first_seen: false,
            sent: match spec.kind {
                Resumable::Replay(api) => Some(Sent::new(api)),
                Resumable::Tokens(_) => None,
            },
        }
    }

    /// Records a chunk (`data: {…}`); what the client gets of it, if anything.
    pub(crate) fn observe(&mut self, event: Bytes) -> Option<Bytes> {
        if let Some(sent) = self.sent.as_mut() {
            sent.record(&event);
            self.finished = sent.finished;
            return Some(event);
        }
        if !event.starts_with(b"data: {") {
            return Some(event);
        }
        // At most two lists a chunk (the first chunk's prompt, then a choice's ids): no list
        // of lists allocated per token.
        let mut lists = [0..0, 0..0];
        let mut found = 0;
        if !std::mem::replace(&mut self.first_seen, true) {
            if let Some((list, ids)) = id_list(&event, IdKey::Prompt) {
                self.prompt = Some(ids);
                lists[found] = list;
                found += 1;
            }
        }
        let before = self.output.len();
        let output = ids_into(&event, IdKey::Output, &mut self.output);
        if let Some(list) = output.clone() {
            if self.output.len() > before {
                self.chunk_lens.push(self.output.len() - before);
            }
            lists[found] = list;
            found += 1;
        }
        let lists = &mut lists[..found];
        if holds!(&event, b"\"tool_calls\":[") {
            self.tool_call_ids(&event);
        }
        if holds!(&event, b"\"finish_reason\":\"") {
            self.finished = true;
        }
        // The prompt's list (first chunk only) comes before the choices' in vLLM's chunks.
        lists.sort_by_key(|l| l.start);
        let out = if self.spec.client_ids || lists.is_empty() {
            event
        } else {
            Bytes::from(without_ids(&event, lists)?)
        };
        // A token's chunk is what continued chunks look like (the role chunk, until one came).
        if output.is_some() || self.template.is_none() {
            self.template = Some(out.clone());
        }
        Some(out)
    }

    /// The ids a tool-call chunk names, by index (read whole: a call's first chunk is rare).
    fn tool_call_ids(&mut self, event: &[u8]) {
        let json = event.strip_prefix(b"data: ").unwrap_or(event);
        let Ok(chunk) = serde_json::from_slice::<Value>(json.trim_ascii_end()) else {
            return;
        };
        let calls = chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for call in calls {
            let (Some(index), Some(id)) = (call["index"].as_u64(), call["id"].as_str()) else {
                continue;
            };
            let index = index as usize;
            if self.tool_ids.len() <= index {
                self.tool_ids.resize(index + 1, String::new());
            }
            self.tool_ids[index] = id.to_owned();
        }
    }

    /// The derender's stream state for what was generated so far (parser path: the tokens,
    /// their chunking, the tool calls already sent).
    pub(crate) fn stream_state(&self) -> Value {
        serde_json::json!({
            "role_sent": self.first_seen,
            "output_token_ids": self.output,
            "output_chunk_lens": self.chunk_lens,
            "tools_streamed": !self.tool_ids.is_empty(),
            "last_tool_call_ids": self.tool_ids,
        })
    }

    /// The client chunk continued chunks are made from, as JSON. Cut right after the role chunk,
    /// that one with what vLLM's first chunk alone carries (the prompt's ids and text) taken out
    /// and what a token's chunk carries (its ids, `kv_transfer_params`) put in.
    pub(crate) fn template_json(&self) -> Option<Value> {
        let t = self.template.as_ref()?;
        let json = t.strip_prefix(b"data: ").unwrap_or(t);
        let mut chunk: Value = serde_json::from_slice(json.trim_ascii_end()).ok()?;
        if chunk["choices"][0]["delta"].get("role").is_some() {
            let top = chunk.as_object_mut()?;
            top.remove("prompt_token_ids");
            top.remove("prompt_text");
            top.insert("kv_transfer_params".into(), Value::Null);
            chunk["choices"][0]["token_ids"] = Value::Null;
        }
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resume::TokenApi;

    fn spec(client_ids: bool) -> ResumeSpec {
        ResumeSpec {
            kind: Resumable::Tokens(TokenApi::Chat),
            client_ids,
        }
    }

    #[test]
    fn a_stream_is_recorded_and_its_ids_kept_from_a_client_that_did_not_ask() {
        let mut t = Trace::new(spec(false));
        let role = Bytes::from_static(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"prompt_token_ids\":[5,6]}\n\n");
        let out = t.observe(role).unwrap();
        assert!(out.ends_with(b"\"prompt_token_ids\":null}\n\n"), "{out:?}");
        let text = Bytes::from_static(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"a\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[7,8]}]}\n\n");
        t.observe(text).unwrap();
        let control = Bytes::from_static(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[9]}]}\n\n");
        assert_eq!(
            t.observe(control),
            None,
            "vLLM sends a control token's chunk only for its ids"
        );
        let call = Bytes::from_static(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"call-1\",\"type\":\"function\",\"index\":0,\"function\":{\"name\":\"f\"}}]},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[10]}]}\n\n");
        t.observe(call).unwrap();
        assert_eq!(t.prompt.as_deref(), Some(&[5, 6][..]));
        assert_eq!(t.output, [7, 8, 9, 10]);
        assert_eq!(t.chunk_lens, [2, 1, 1]);
        assert_eq!(t.tool_ids, ["call-1"]);
        assert!(!t.finished);
        let state = t.stream_state();
        assert_eq!(state["output_token_ids"], serde_json::json!([7, 8, 9, 10]));
        assert_eq!(state["tools_streamed"], true);
        assert_eq!(t.template_json().unwrap()["choices"][0]["token_ids"], Value::Null);
    }

    #[test]
    fn a_client_that_asked_for_ids_gets_them() {
        let mut t = Trace::new(spec(true));
        let text = Bytes::from_static(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[9]}]}\n\n");
        assert_eq!(t.observe(text.clone()), Some(text));
    }
}
