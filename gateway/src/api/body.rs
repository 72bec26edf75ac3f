//! A request body read only as far as normalisation needs: the top-level object is split into
//! the few fields the normaliser reads or rewrites (parsed into JSON values) and everything else
//! (messages, prompts, tools… kept as raw text, never expanded into a value tree), then written
//! back as one object. A 32 MB prompt of small numbers thus costs about its own size instead of
//! the ~30× a `serde_json::Value` tree takes, and bodies over OFF_THREAD bytes are handled on a
//! blocking thread so `/health` and running streams are not held up by a parse.

use std::borrow::Cow;
use std::time::Duration;

use axum::http::{header, HeaderMap};
use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::api::catalog::Catalog;
use crate::api::encoding::json_text;
use crate::api::error::GatewayError;
use crate::api::family::Api;
use crate::api::lax::lax_integer;
use crate::api::models::ModelId;
use crate::api::normalize::{Normalized, ResumeSpec};
use sparkgate_config::VllmRelease;

/// How a request body is read: MAX_BODY_BYTES, BODY_TIMEOUT and BODY_MIN_RATE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    pub(crate) max: usize,
    pub(crate) timeout: Duration,
    /// Bytes per second a body must average to be given longer than `timeout`; 0: none.
    pub(crate) min_rate: u64,
}

/// Why a request body could not be read whole (`http::body_guard` enforces the limits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyError {
    /// More than MAX_BODY_BYTES.
    TooLarge { limit: usize },
    /// Still arriving BODY_TIMEOUT after the head, slower than BODY_MIN_RATE.
    Timeout { after: Duration, received: usize },
    /// The connection failed while the body was read.
    Read(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge { limit } => write!(f, "the body is over {limit} bytes"),
            BodyError::Timeout { after, received } => write!(f, "the body took over {after:?} ({received} bytes came)"),
            BodyError::Read(e) => write!(f, "could not read the body: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

impl From<BodyError> for GatewayError {
    fn from(e: BodyError) -> GatewayError {
        match e {
            BodyError::TooLarge { limit } => GatewayError::PayloadTooLarge { limit },
            BodyError::Timeout { after, received } => GatewayError::BodyTimeout { after, received },
            BodyError::Read(e) => GatewayError::InvalidJson(format!("could not read the body: {e}")),
        }
    }
}

/// A request body as the handlers get it: within the body guard's limits.
pub(crate) trait RequestBody: http_body::Body<Data = Bytes, Error = BodyError> + Send + 'static {}

impl<T: http_body::Body<Data = Bytes, Error = BodyError> + Send + 'static> RequestBody for T {}

/// Reads the whole body (its bounds are the body guard's); a body in one piece is not copied.
pub(crate) async fn read(body: impl RequestBody) -> Result<Bytes, GatewayError> {
    use http_body_util::BodyExt;
    Ok(body.collect().await?.to_bytes())
}

/// Fields the normaliser reads or rewrites; every other field passes as raw text.
const TOUCHED: &[&str] = &[
    "model",
    "reasoning_effort",
    "chat_template_kwargs",
    "extra_body",
    "stream",
    "stream_options",
    "n",
    "output_config",
    "reasoning",
    "thinking",
    "tool_choice",
    // Set to true upstream on a stream that can be continued (`resume`).
    "return_token_ids",
];

/// Bodies larger than this are parsed and re-serialised off the reactor thread.
const OFF_THREAD: usize = 256 * 1024;

/// vLLM's content-type rule (`validate_json_request`): the media type before any `;`, in any
/// case and untrimmed, is `application/json`.
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), GatewayError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct
        .split(';')
        .next()
        .is_some_and(|m| m.eq_ignore_ascii_case("application/json"))
    {
        Ok(())
    } else {
        Err(GatewayError::UnsupportedMediaType)
    }
}

/// A top-level key, borrowed from the body unless it holds an escape.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The top-level object's entries in the body's order, values as raw text.
struct Entries<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
                while let Some((Key(k), v)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    entries.push((k, v));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(V)
    }
}

/// The body split into normalised fields and raw ones (borrowed from the request's bytes: the
/// raw text is never copied before it is written out).
struct Split<'a> {
    fields: Map<String, Value>,
    /// Every other entry, in the body's order; of a repeated key only the last.
    raw: Vec<(Cow<'a, str>, &'a RawValue)>,
    /// A key appears more than once: the body is rewritten with the last of each, which is the
    /// one vLLM's JSON parser keeps.
    repeated: bool,
    /// The body's `user`, when it is a string: who the request is for in the fair queue.
    user: Option<String>,
    /// The body's `priority`, when it is an integer.
    priority: Option<i64>,
    /// The prompts a completions `prompt` holds (`prompt_count`), when the body has one.
    prompts: Option<u32>,
    /// A field a continuation cannot honour exactly (`resume::blocks`).
    resume_blocked: bool,
    /// Messages and Responses: `temperature` is 0, so a replay repeats the answer.
    greedy: bool,
    /// The largest output limit it names (`Api::output_limits`).
    output_limit: Option<u64>,
    /// Messages: `metadata.user_id`.
    session: Option<String>,
}

fn split(bytes: &[u8], api: Api) -> Result<Split<'_>, GatewayError> {
    let Entries(entries) = match serde_json::from_slice(bytes) {
        Ok(e) => e,
        Err(e) if e.is_data() => return Err(GatewayError::InvalidJson("the body must be a JSON object".into())),
        Err(e) => return Err(GatewayError::InvalidJson(e.to_string())),
    };
    let repeated = has_repeats(&entries);
    let mut fields = Map::new();
    let mut raw = Vec::with_capacity(entries.len());
    let (mut user, mut priority, mut prompts) = (None, None, None);
    let (mut output_limit, mut session) = (None, None);
    let mut resume_blocked = false;
    let mut greedy = false;
    let replayable = matches!(api, Api::Messages | Api::Responses);
    for (key, v) in entries {
        resume_blocked |= crate::api::resume::blocks(&key, v.get());
        if replayable && key == "temperature" {
            greedy = crate::api::resume::greedy(v.get());
        }
        // These stay raw: only read (the last one, as vLLM reads it), never rewritten.
        if key == "user" {
            user = serde_json::from_str::<String>(v.get()).ok();
        } else if key == "priority" {
            priority = integer(v);
        } else if key == "prompt" && matches!(api, Api::Completions | Api::Invocations) {
            prompts = Some(prompt_count(v));
        } else if key.starts_with("max_") && api.output_limits().contains(&key.as_ref()) {
            // A plain integer (the usual case) without a value tree; else as vLLM coerces it.
            let limit = v.get().parse::<u64>().ok();
            let limit = limit.or_else(|| integer(v).and_then(|n| u64::try_from(n).ok()));
            output_limit = output_limit.max(limit);
        } else if api == Api::Messages && key == "metadata" {
            session = user_id(v);
        }
        // A batch's permits are its conversations: the normaliser counts `messages` there.
        // An empty `tools` list may be repaired (`normalize::drop_empty_tools`); a full one stays raw.
        let empty_tools = key == "tools" && is_empty_list(v);
        if TOUCHED.contains(&key.as_ref()) || (api == Api::Batch && key == "messages") || empty_tools {
            // A repeated field: the later value replaces the earlier one.
            let value = serde_json::from_str(v.get()).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
            fields.insert(key.into_owned(), value);
        } else {
            raw.push((key, v));
        }
    }
    if repeated {
        keep_last(&mut raw);
    }
    Ok(Split {
        output_limit,
        session,
        fields,
        raw,
        repeated,
        user,
        priority,
        prompts,
        resume_blocked,
        greedy,
    })
}

/// `[]`, with or without whitespace inside.
fn is_empty_list(v: &RawValue) -> bool {
    let text = v.get();
    text.len() >= 2 && text.starts_with('[') && text[1..text.len() - 1].trim().is_empty()
}

/// How many prompts a completions `prompt` holds, as vLLM's request model reads it: a string
/// or one list of token ids is one prompt; a list of strings or of token-id lists is one per
/// element (each runs `n` sequences). Read without building the values: a 32 MB token list
/// costs one pass and no allocation. Anything else is vLLM's to refuse, counted as one.
fn prompt_count(v: &RawValue) -> u32 {
    serde_json::from_str::<PromptCount>(v.get()).map_or(1, |c| c.0.max(1))
}

struct PromptCount(u32);

impl<'de> Deserialize<'de> for PromptCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PromptCount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<PromptCount, A::Error> {
                let mut count = 0u32;
                while let Some(element) = seq.next_element::<Element>()? {
                    // A list of integers is one tokenised prompt.
                    if count == 0 && element == Element::Token {
                        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                        return Ok(PromptCount(1));
                    }
                    count = count.saturating_add(1);
                }
                Ok(PromptCount(count))
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<PromptCount, E> {
                Ok(PromptCount(1))
            }
        }
        d.deserialize_any(V)
    }
}

/// One element of a `prompt` list: a token id, or anything else (a prompt of its own).
#[derive(PartialEq)]
enum Element {
    Token,
    Prompt,
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Element;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a prompt or a token id")
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Element, E> {
                Ok(Element::Token)
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Element, E> {
                Ok(Element::Token)
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Element, E> {
                Ok(Element::Prompt)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Element::Prompt)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Element, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Element::Prompt)
            }
        }
        d.deserialize_any(V)
    }
}

/// An integer as vLLM's request model takes one in lax mode (`lax::lax_integer`), when it
/// fits an i64.
/// Anthropic's `metadata.user_id`, when it is a string.
fn user_id(v: &RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Metadata {
        user_id: Option<String>,
    }
    serde_json::from_str::<Metadata>(v.get()).ok()?.user_id
}

fn integer(v: &RawValue) -> Option<i64> {
    let value = serde_json::from_str::<Value>(v.get()).ok()?;
    lax_integer(&value).and_then(|i| i64::try_from(i).ok())
}

/// Drops every raw entry whose key appears again later (the rare path: a repeated key).
fn keep_last(raw: &mut Vec<(Cow<'_, str>, &RawValue)>) {
    let mut seen = std::collections::HashSet::with_capacity(raw.len());
    let mut kept: Vec<_> = raw.drain(..).rev().filter(|(k, _)| seen.insert(k.clone())).collect();
    kept.reverse();
    *raw = kept;
}

/// Whether any key appears twice (pairwise for the usual handful of keys; a set beyond that).
fn has_repeats(entries: &[(Cow<'_, str>, &RawValue)]) -> bool {
    if entries.len() <= 32 {
        return entries
            .iter()
            .enumerate()
            .any(|(i, (k, _))| entries[..i].iter().any(|(seen, _)| seen == k));
    }
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    !entries.iter().all(|(k, _)| seen.insert(k.as_ref()))
}

/// The normalised fields and the raw ones as one JSON object (a normalised field wins over a
/// raw one of the same name: `extra_body` may set any key).
fn join(fields: &Map<String, Value>, raw: &[(Cow<'_, str>, &RawValue)], extra: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.iter().map(|(_, v)| v.get().len() + 16).sum::<usize>() + 256);
    out.push(b'{');
    let mut first = true;
    let mut put = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key).expect("a string serialises");
        out.push(b':');
        out.extend_from_slice(value);
    };
    for (k, v) in fields {
        put(&mut out, k, &serde_json::to_vec(v).expect("a JSON value serialises"));
    }
    for (k, v) in raw.iter().filter(|(k, _)| !fields.contains_key(k.as_ref())) {
        put(&mut out, k, v.get().as_bytes());
    }
    if !extra.is_empty() {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(extra);
    }
    out.push(b'}');
    out
}

/// A normalised request and the bytes to forward.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) norm: Normalized,
    pub(crate) forward: Bytes,
    /// The body's `user` (a string), for the fair queue.
    pub(crate) user: Option<String>,
    /// The body's `priority` (an integer), for the queue under SCHEDULING_POLICY=priority.
    pub(crate) priority: Option<i64>,
    /// The most output tokens it asks for (its key's quota reserves them).
    pub(crate) output_limit: Option<u64>,
    /// Anthropic's `metadata.user_id`: the session it names, for routing.
    pub(crate) session: Option<String>,
}

/// Parses and normalises `bytes`. What normalisation left as it was is forwarded as the client
/// sent it — the same bytes, not a copy; a body it changed (or with a repeated key) is written
/// anew.
pub(crate) fn prepare_now(
    models: &Catalog,
    (release, fallback): (VllmRelease, ModelId),
    api: Api,
    bytes: &Bytes,
) -> Result<Prepared, GatewayError> {
    // A byte-order mark or UTF-16/32 is read as vLLM reads it; an unchanged body is forwarded
    // as sent, a changed one as UTF-8.
    let text = json_text(bytes)?;
    let Split {
        fields,
        raw,
        repeated,
        user,
        priority,
        prompts,
        resume_blocked,
        greedy,
        output_limit,
        session,
    } = split(&text, api)?;
    // `messages` stays raw here, so the dispatch reads the raw fields.
    let has_messages = fields.keys().any(|k| k == "messages") || raw.iter().any(|(k, _)| k == "messages");
    let api = api.for_body(has_messages);
    // A batch's fields hold its conversations: too large to keep a second copy of to compare.
    let before = (api != Api::Batch && !repeated).then(|| fields.clone());
    let mut norm = models.normalize(api, release, fields, prompts, fallback)?;
    let blocked = if matches!(api, Api::Messages | Api::Responses) {
        !greedy
    } else {
        resume_blocked
    };
    norm.resume = resume_spec(models.resume_streams(), api, &norm, prompts, blocked);
    // Asked of vLLM for a continuation, as text: appended to a body sent as it came, written
    // last into a rewritten one (a repeated key's last value is the one vLLM reads).
    let ask_ids: &[u8] = match norm.resume {
        Some(ResumeSpec {
            kind: crate::api::resume::Resumable::Tokens(_),
            client_ids: false,
        }) => br#""return_token_ids":true"#,
        _ => b"",
    };
    let as_sent = matches!(text, Cow::Borrowed(_));
    let forward = match before {
        // Compared in order, without hashing: normalisation edits in place or appends, so an
        // unchanged body keeps its order (and a reordered one is rewritten, which is harmless).
        Some(before) if before.iter().eq(norm.body.iter()) && (ask_ids.is_empty() || as_sent) => {
            with_field(bytes, ask_ids)
        }
        _ => Bytes::from(join(&norm.body, &raw, ask_ids)),
    };
    // The forwarded bytes are what stays alive while the request waits in the queue.
    norm.body = Map::new();
    Ok(Prepared {
        norm,
        forward,
        user,
        priority,
        output_limit,
        session,
    })
}

/// How a stream of this request can be continued: a single chat or completions sequence with
/// nothing a continuation cannot honour (`resume::blocks`), or a temperature-0 Messages or
/// Responses stream (replayed), when RESUME_TIMEOUT is set.
fn resume_spec(
    resume_streams: bool,
    api: Api,
    norm: &Normalized,
    prompts: Option<u32>,
    blocked: bool,
) -> Option<ResumeSpec> {
    use crate::api::resume::{ReplayApi, Resumable, TokenApi};
    if !resume_streams || !norm.stream || blocked || norm.sequences.total() != 1 {
        return None;
    }
    let kind = match api {
        Api::Chat => Resumable::Tokens(TokenApi::Chat),
        Api::Completions if prompts == Some(1) => Resumable::Tokens(TokenApi::Completions),
        Api::Messages => Resumable::Replay(ReplayApi::Messages),
        Api::Responses => Resumable::Replay(ReplayApi::Responses),
        _ => return None,
    };
    use crate::api::normalize::Fields as _;
    let client_ids = norm.body.field("return_token_ids").and_then(crate::api::lax::lax_bool) == Some(true);
    Some(ResumeSpec { kind, client_ids })
}

/// `body` (a JSON object's text) with `field` (`"key":value`, if any) added as its last member.
fn with_field(body: &Bytes, field: &[u8]) -> Bytes {
    if field.is_empty() {
        return body.clone();
    }
    let end = body.iter().rposition(|b| *b == b'}').unwrap_or(body.len());
    let empty = body[..end].iter().rev().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let mut out = Vec::with_capacity(body.len() + field.len() + 1);
    out.extend_from_slice(&body[..end]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(field);
    out.extend_from_slice(&body[end..]);
    Bytes::from(out)
}

/// Parses, normalises and re-serialises `bytes` (off the reactor thread when large).
pub(crate) async fn prepare(
    models: &std::sync::Arc<Catalog>,
    how: (VllmRelease, ModelId),
    api: Api,
    bytes: Bytes,
) -> Result<Prepared, GatewayError> {
    if bytes.len() <= OFF_THREAD {
        return prepare_now(models, how, api, &bytes);
    }
    let models = models.clone();
    tokio::task::spawn_blocking(move || prepare_now(&models, how, api, &bytes))
        .await
        .unwrap_or_else(|e| Err(GatewayError::InvalidJson(format!("the body could not be parsed: {e}"))))
}

#[cfg(test)]
mod tests;
