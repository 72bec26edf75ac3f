//! Made-up log probabilities in vLLM's two shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and completions' `{text_offset, token_logprobs, tokens, top_logprobs}`.
//! The sampled token comes first with -0.125, alternatives follow at -1, -2, … (as the fixture's
//! fake engine reports them).

use serde_json::{json, Map, Value};

const ALTERNATIVES: &[&str] = &[" the", " a", ",", ".", " and", " of", " to", " in"];

fn alternatives(token: &str, n: usize) -> impl Iterator<Item = (String, f64)> + '_ {
    ALTERNATIVES
        .iter()
        .filter(move |a| **a != token)
        .take(n)
        .enumerate()
        .map(|(i, a)| ((*a).to_owned(), -1.0 - i as f64))
}

fn entry(token: &str, logprob: f64) -> Value {
    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
}

/// Chat logprobs for `tokens`, each with `top` alternatives (the sampled token included).
pub(crate) fn chat(tokens: &[String], top: usize) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut tops = Vec::new();
            if top > 0 {
                tops.push(entry(t, -0.125));
                tops.extend(alternatives(t, top - 1).map(|(a, lp)| entry(&a, lp)));
            }
            let mut e = entry(t, -0.125);
            e["top_logprobs"] = Value::Array(tops);
            e
        })
        .collect();
    json!({"content": content})
}

/// Completions logprobs for `tokens` with `k` alternatives per position.
pub(crate) fn completion(tokens: &[String], k: usize) -> Value {
    let mut offset = 0;
    let mut offsets = Vec::new();
    let mut tops = Vec::new();
    for t in tokens {
        offsets.push(offset);
        offset += t.chars().count();
        let mut m = Map::new();
        m.insert(t.clone(), json!(-0.125));
        for (a, lp) in alternatives(t, k) {
            m.insert(a, json!(lp));
        }
        tops.push(Value::Object(m));
    }
    json!({"text_offset": offsets, "token_logprobs": vec![-0.125; tokens.len()], "tokens": tokens, "top_logprobs": tops})
}
