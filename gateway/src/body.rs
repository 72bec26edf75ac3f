//! A request body read only as far as normalisation needs: the top-level object is split into
//! the few fields the normaliser reads or rewrites (parsed into JSON values) and everything else
//! (messages, prompts, tools… kept as raw text, never expanded into a value tree), then written
//! back as one object. A 32 MB prompt of small numbers thus costs about its own size instead of
//! the ~30× a `serde_json::Value` tree takes, and bodies over OFF_THREAD bytes are handled on a
//! blocking thread so `/health` and running streams are not held up by a parse.

use std::borrow::Cow;
use std::collections::BTreeMap;

use axum::http::{header, HeaderMap};
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::normalize::{Api, Normalized, Normalizer};

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
];

/// Bodies larger than this are parsed and re-serialised off the reactor thread.
const OFF_THREAD: usize = 256 * 1024;

/// vLLM's content-type rule: JSON bodies only.
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), GatewayError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.split(';').next().map(str::trim) == Some("application/json") {
        Ok(())
    } else {
        Err(GatewayError::UnsupportedMediaType)
    }
}

/// The body split into normalised fields and raw ones (borrowed from the request's bytes: the
/// raw text is never copied before it is written out).
struct Split<'a> {
    fields: Map<String, Value>,
    raw: BTreeMap<Cow<'a, str>, &'a RawValue>,
}

fn split(bytes: &[u8], api: Api) -> Result<Split<'_>, GatewayError> {
    let mut raw: BTreeMap<Cow<'_, str>, &RawValue> = match serde_json::from_slice(bytes) {
        Ok(m) => m,
        Err(e) if e.is_data() => return Err(GatewayError::InvalidJson("the body must be a JSON object".into())),
        Err(e) => return Err(GatewayError::InvalidJson(e.to_string())),
    };
    let mut fields = Map::new();
    // A batch's permits are its conversations: the normaliser counts `messages` there.
    let extra: &[&str] = if api == Api::Batch { &["messages"] } else { &[] };
    for key in TOUCHED.iter().chain(extra) {
        if let Some(v) = raw.remove(*key) {
            let value = serde_json::from_str(v.get()).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
            fields.insert((*key).to_owned(), value);
        }
    }
    Ok(Split { fields, raw })
}

/// The normalised fields and the raw ones as one JSON object (a normalised field wins over a
/// raw one of the same name: `extra_body` may set any key).
fn join(fields: &Map<String, Value>, raw: &BTreeMap<Cow<'_, str>, &RawValue>) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.values().map(|v| v.get().len() + 16).sum::<usize>() + 256);
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
    out.push(b'}');
    out
}

/// A normalised request and the bytes to forward.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) norm: Normalized,
    pub(crate) forward: Bytes,
}

pub(crate) fn prepare_now(normalizer: &Normalizer, api: Api, bytes: &[u8]) -> Result<Prepared, GatewayError> {
    let Split { fields, raw } = split(bytes, api)?;
    // `messages` stays raw here, so the dispatch reads the raw fields.
    let api = api.for_body(raw.contains_key("messages"));
    let mut norm = normalizer.normalize(api, fields)?;
    let forward = Bytes::from(join(&norm.body, &raw));
    // The forwarded bytes are what stays alive while the request waits in the queue.
    norm.body = Map::new();
    Ok(Prepared { norm, forward })
}

/// Parses, normalises and re-serialises `bytes` (off the reactor thread when large).
pub(crate) async fn prepare(
    normalizer: &std::sync::Arc<Normalizer>,
    api: Api,
    bytes: Bytes,
) -> Result<Prepared, GatewayError> {
    if bytes.len() <= OFF_THREAD {
        return prepare_now(normalizer, api, &bytes);
    }
    let normalizer = normalizer.clone();
    tokio::task::spawn_blocking(move || prepare_now(&normalizer, api, &bytes))
        .await
        .unwrap_or_else(|e| Err(GatewayError::InvalidJson(format!("the body could not be parsed: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn raw_fields_pass_unchanged_and_normalised_ones_win() {
        let n = Normalizer::new(sparkgate_config::ProfileId::DeepSeekV41Flash, "DS", &[], &[]);
        let body = br#"{"messages":[{"role":"user","content":"hi \u00e9"}],"model":null,"extra_body":{"messages":[],"top_k":3},"top_k":1}"#;
        let p = prepare_now(&n, Api::Chat, body).unwrap();
        let out: Value = serde_json::from_slice(&p.forward).unwrap();
        assert_eq!(out["model"], "DS");
        assert_eq!(out["messages"], json!([]), "extra_body's key wins over the raw one");
        assert_eq!(out["top_k"], 3);
        assert!(out.get("extra_body").is_none());
        let plain = prepare_now(
            &n,
            Api::Chat,
            br#"{"messages":[{"role":"user","content":"hi \u00e9"}]}"#,
        )
        .unwrap();
        assert!(
            std::str::from_utf8(&plain.forward)
                .unwrap()
                .contains(r#""content":"hi \u00e9""#),
            "raw text is forwarded byte for byte"
        );
    }

    #[test]
    fn bad_bodies_are_refused_and_batches_count_conversations() {
        let n = Normalizer::new(sparkgate_config::ProfileId::DeepSeekV41Flash, "DS", &[], &[]);
        for bad in [&b"[1]"[..], b"{\"a\":", b"\"x\""] {
            assert!(matches!(
                prepare_now(&n, Api::Chat, bad),
                Err(GatewayError::InvalidJson(_))
            ));
        }
        let batch = prepare_now(&n, Api::Batch, br#"{"messages":[[{"role":"user","content":"a"}],[]]}"#).unwrap();
        assert_eq!(batch.norm.n, 2);
        let chat_like = br#"{"messages":[],"chat_template_kwargs":{"chat_template":"x"}}"#;
        let e = prepare_now(&n, Api::Invocations, chat_like).unwrap_err();
        assert_eq!(
            e.param(),
            Some("chat_template_kwargs"),
            "an /invocations chat body gets chat's rules"
        );
    }
}
