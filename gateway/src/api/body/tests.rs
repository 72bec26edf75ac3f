//! The body stage held to vLLM's reading: raw fields pass, normalised ones win, what can be
//! continued is marked.

use super::*;
use serde_json::json;

const OLD: (VllmRelease, ModelId) = (VllmRelease::OLDEST, ModelId(0));

fn one(n: crate::api::normalize::Normalizer) -> Catalog {
    Catalog::new(vec![n])
}

#[test]
fn greedy_messages_and_responses_streams_are_replayed_and_others_not() {
    use crate::api::resume::{ReplayApi, Resumable};
    let mut n = crate::api::normalize::Normalizer::new(sparkgate_config::ProfileId::DeepSeekV41Flash, "DS", &[], &[]);
    n.resume_streams = true;
    let n = one(n);
    let kind = |api, body: Value| {
        let p = prepare_now(&n, OLD, api, &Bytes::from(body.to_string())).unwrap();
        assert!(!String::from_utf8_lossy(&p.forward).contains("return_token_ids"));
        p.norm.resume.map(|r| r.kind)
    };
    let messages = json!({"model": "DS", "max_tokens": 9, "stream": true, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        kind(Api::Messages, messages.clone()),
        Some(Resumable::Replay(ReplayApi::Messages))
    );
    let responses = json!({"model": "DS", "stream": true, "temperature": 0.0, "input": "hi"});
    assert_eq!(
        kind(Api::Responses, responses.clone()),
        Some(Resumable::Replay(ReplayApi::Responses))
    );
    let mut sampled = responses.clone();
    sampled["temperature"] = json!(0.7);
    assert_eq!(kind(Api::Responses, sampled), None, "a sampled answer is not repeated");
    let mut unset = messages;
    unset.as_object_mut().unwrap().remove("temperature");
    assert_eq!(kind(Api::Messages, unset), None, "the default temperature samples");
}

#[test]
fn raw_fields_pass_unchanged_and_normalised_ones_win() {
    let n = one(crate::api::normalize::Normalizer::new(
        sparkgate_config::ProfileId::DeepSeekV41Flash,
        "DS",
        &[],
        &[],
    ));
    let body = br#"{"messages":[{"role":"user","content":"hi \u00e9"}],"model":null,"extra_body":{"messages":[],"top_k":3},"top_k":1}"#;
    let p = prepare_now(&n, OLD, Api::Chat, &Bytes::from_static(body)).unwrap();
    let out: Value = serde_json::from_slice(&p.forward).unwrap();
    assert_eq!(out["model"], "DS");
    assert_eq!(out["messages"], json!([]), "extra_body's key wins over the raw one");
    assert_eq!(out["top_k"], 3);
    assert!(out.get("extra_body").is_none());
    let plain = prepare_now(
        &n,
        OLD,
        Api::Chat,
        &Bytes::from_static(br#"{"messages":[{"role":"user","content":"hi \u00e9"}]}"#),
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
    let n = one(crate::api::normalize::Normalizer::new(
        sparkgate_config::ProfileId::DeepSeekV41Flash,
        "DS",
        &[],
        &[],
    ));
    for bad in [&b"[1]"[..], b"{\"a\":", b"\"x\""] {
        assert!(matches!(
            prepare_now(&n, OLD, Api::Chat, &Bytes::from_static(bad)),
            Err(GatewayError::InvalidJson(_))
        ));
    }
    let batch = prepare_now(
        &n,
        OLD,
        Api::Batch,
        &Bytes::from_static(br#"{"messages":[[{"role":"user","content":"a"}],[]]}"#),
    )
    .unwrap();
    assert_eq!(batch.norm.sequences.total(), 2);
    let chat_like = br#"{"messages":[],"chat_template_kwargs":{"chat_template":"x"}}"#;
    let e = prepare_now(&n, OLD, Api::Invocations, &Bytes::from_static(chat_like)).unwrap_err();
    assert_eq!(
        e.param(),
        Some("chat_template_kwargs"),
        "an /invocations chat body gets chat's rules"
    );
}

#[test]
fn a_body_normalisation_leaves_as_it_was_is_forwarded_as_sent_without_a_copy() {
    let n = one(crate::api::normalize::Normalizer::new(
        sparkgate_config::ProfileId::DeepSeekV41Flash,
        "DS",
        &[],
        &[],
    ));
    let sent = Bytes::from_static(
        br#"{"model":"DS", "messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"x\u0079":1}"#,
    );
    let p = prepare_now(&n, OLD, Api::Chat, &sent).unwrap();
    assert_eq!(p.forward, sent);
    assert_eq!(p.forward.as_ptr(), sent.as_ptr(), "the same bytes, not a copy");
    // A change anywhere is a rewrite, in the body's own key order.
    let aliased = Bytes::from_static(br#"{"stream":false,"model":null,"messages":[],"top_k":2}"#);
    let p = prepare_now(&n, OLD, Api::Chat, &aliased).unwrap();
    let text = std::str::from_utf8(&p.forward).unwrap();
    assert!(text.ends_with(r#""messages":[],"top_k":2}"#), "{text}");
    assert_eq!(serde_json::from_slice::<Value>(&p.forward).unwrap()["model"], "DS");
}

#[test]
fn a_repeated_key_is_forwarded_once_with_its_last_value() {
    let n = one(crate::api::normalize::Normalizer::new(
        sparkgate_config::ProfileId::DeepSeekV41Flash,
        "DS",
        &[],
        &[],
    ));
    let body = Bytes::from_static(br#"{"model":"DS","top_k":1,"messages":[],"top_k":5,"model":"DS"}"#);
    let p = prepare_now(&n, OLD, Api::Chat, &body).unwrap();
    let text = std::str::from_utf8(&p.forward).unwrap();
    assert_eq!(text.matches("top_k").count(), 1, "{text}");
    assert_eq!(text.matches("model").count(), 1, "{text}");
    let out: Value = serde_json::from_slice(&p.forward).unwrap();
    assert_eq!((out["top_k"].clone(), out["model"].clone()), (json!(5), json!("DS")));
    // As vLLM reads it: the last `stream` decides whether the answer streams.
    let twice = Bytes::from_static(br#"{"messages":[],"stream":true,"stream":false}"#);
    assert!(!prepare_now(&n, OLD, Api::Chat, &twice).unwrap().norm.stream);
}

#[test]
fn a_completions_prompt_counts_its_prompts_as_vllm_reads_them() {
    let count = |text: &str| prompt_count(&serde_json::from_str::<Box<RawValue>>(text).unwrap());
    assert_eq!(count(r#""one prompt""#), 1);
    assert_eq!(count("[1, 2, 3]"), 1, "a list of token ids is one prompt");
    assert_eq!(count(r#"["a", "b", "c"]"#), 3);
    assert_eq!(count("[[1, 2], [3], [4, 5, 6], [7]]"), 4);
    assert_eq!(count(r#"["a", [1, 2]]"#), 2);
    // What vLLM refuses counts as one: vLLM answers it.
    for refused in ["[]", "3", "null", "{}", "[1.5]", "[true]"] {
        assert_eq!(count(refused), 1, "{refused}");
    }
    let n = one(crate::api::normalize::Normalizer::new(
        sparkgate_config::ProfileId::DeepSeekV41Flash,
        "DS",
        &[],
        &[],
    ));
    let body = Bytes::from_static(br#"{"prompt":["a","b","c","d"],"n":2}"#);
    let p = prepare_now(&n, OLD, Api::Completions, &body).unwrap();
    assert_eq!(p.norm.sequences.total(), 8);
    let p = prepare_now(&n, OLD, Api::Invocations, &body).unwrap();
    assert_eq!(p.norm.sequences.total(), 8, "a completions-shaped /invocations");
    let chat = Bytes::from_static(br#"{"messages":[],"prompt":["a","b"],"n":2}"#);
    assert_eq!(
        prepare_now(&n, OLD, Api::Invocations, &chat)
            .unwrap()
            .norm
            .sequences
            .total(),
        2
    );
}
