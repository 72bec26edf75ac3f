//! `SamplingParams` verification (vLLM 0.33's sampling_params.py `_verify_args`, then
//! `verify` against the speculative config), which runs after the schema, the model check and
//! rendering. The range rules are one table, in `_verify_args`' order.

use serde_json::{Map, Value};

use super::pydantic;
use super::request::streaming;
use super::{bad_request, ApiError, App};

/// A request number as Python holds it after pydantic: JSON numbers, booleans, and the
/// `"nan"`/`"inf"` strings a float field accepts.
fn number(req: &Map<String, Value>, name: &str) -> Option<f64> {
    match req.get(name)? {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::String(s) => s
            .trim()
            .to_ascii_lowercase()
            .trim_start_matches('+')
            .parse::<f64>()
            .ok(),
        _ => None,
    }
}

/// Python's `repr` of a float (`2.0`, `-1.0`, `1e+16`, `nan`, `inf`).
fn float_str(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v.abs() >= 1e16 {
        let s = format!("{v:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        format!("{mantissa}e{}{exp:02}", if exp < 0 { "-" } else { "+" }).replace("e+-", "e-")
    } else {
        pydantic::py_str(&Value::from(v))
    }
}

/// One range rule: the field, when its value is refused, the message's words, and whether
/// vLLM names the parameter (and its value) in the error.
struct Rule {
    field: &'static str,
    refused: fn(f64) -> bool,
    words: &'static str,
    named: bool,
}

/// `_verify_args`' float rules, in its order (NaN fails every range, as in Python).
const RULES: &[Rule] = &[
    Rule {
        field: "presence_penalty",
        refused: |x| !(-2.0..=2.0).contains(&x),
        words: "presence_penalty must be in [-2, 2], got",
        named: false,
    },
    Rule {
        field: "frequency_penalty",
        refused: |x| !(-2.0..=2.0).contains(&x),
        words: "frequency_penalty must be in [-2, 2], got",
        named: false,
    },
    Rule {
        field: "repetition_penalty",
        refused: |x| !x.is_finite(),
        words: "repetition_penalty must be a finite number, got",
        named: false,
    },
    Rule {
        field: "repetition_penalty",
        refused: |x| x <= 0.0,
        words: "repetition_penalty must be greater than zero, got",
        named: false,
    },
    Rule {
        field: "temperature",
        refused: |x| !x.is_finite(),
        words: "temperature must be a finite number, got",
        named: true,
    },
    Rule {
        field: "temperature",
        refused: |x| x < 0.0,
        words: "temperature must be non-negative, got",
        named: true,
    },
    Rule {
        field: "temperature",
        refused: |x| x > 2.0,
        words: "temperature must be in [0, 2], got",
        named: true,
    },
    Rule {
        field: "top_p",
        refused: |x| !(x > 0.0 && x <= 1.0),
        words: "top_p must be in (0, 1], got",
        named: true,
    },
    Rule {
        field: "top_k",
        refused: |x| x < -1.0,
        words: "top_k must be 0 (disable), or at least 1, got",
        named: false,
    },
    Rule {
        field: "min_p",
        refused: |x| !(0.0..=1.0).contains(&x),
        words: "min_p must be in [0, 1], got",
        named: false,
    },
];

/// The float fields of `RULES` (an integer field's value is shown without `.0`).
const FLOATS: &[&str] = &[
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "min_p",
];

/// The first of `rules` the request's values break.
fn first_refusal<'a>(req: &Map<String, Value>, rules: impl IntoIterator<Item = &'a Rule>) -> Result<(), ApiError> {
    for rule in rules {
        if let Some(x) = number(req, rule.field) {
            if (rule.refused)(x) {
                return Err(refuse(rule, x));
            }
        }
    }
    Ok(())
}

fn refuse(rule: &Rule, x: f64) -> ApiError {
    let shown = if FLOATS.contains(&rule.field) {
        float_str(x)
    } else {
        format!("{}", x as i64)
    };
    let message = format!("{} {shown}.", rule.words);
    if rule.named {
        bad_request(&message, Some(rule.field), Some(&shown))
    } else {
        bad_request(&message, None, None)
    }
}

/// `SamplingParams` verification, in vLLM's order, for the given max-tokens field names.
pub(crate) fn sampling(app: &App, req: &Map<String, Value>, max_names: &[&str]) -> Result<(), ApiError> {
    if let Some(n) = req.get("n").and_then(Value::as_i64) {
        if n < 1 {
            return Err(bad_request(&format!("n must be at least 1, got {n}."), None, None));
        }
    }
    first_refusal(req, RULES)?;
    let max = max_names.iter().find_map(|n| req.get(*n).and_then(Value::as_i64));
    if let Some(m) = max {
        if m < 1 {
            return Err(bad_request(
                &format!("max_tokens must be at least 1, got {m}."),
                Some("max_tokens"),
                Some(&m.to_string()),
            ));
        }
    }
    if let Some(min) = req.get("min_tokens").and_then(Value::as_i64) {
        if min < 0 {
            let msg = format!("min_tokens must be greater than or equal to 0, got {min}.");
            return Err(bad_request(&msg, None, None));
        }
        if let Some(m) = max.filter(|m| min > *m) {
            let msg = format!("min_tokens must be less than or equal to max_tokens={m}, got {min}.");
            return Err(bad_request(&msg, None, None));
        }
    }
    let stops = match req.get("stop") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if stops.iter().any(|s| s.is_empty()) {
        return Err(bad_request("stop cannot contain an empty string.", None, None));
    }
    // `_validate_allowed_token_ids`.
    if req.get("allowed_token_ids") == Some(&Value::Array(Vec::new())) {
        // Checked as the engine adds the request: inside a stream that has begun.
        return Err(bad_request(
            "allowed_token_ids is not None and empty!",
            Some("allowed_token_ids"),
            Some("[]"),
        )
        .in_stream_if(streaming(req)));
    }
    if let Some(m) = max {
        let limit = app.args.max_model_len as i64;
        if m > limit {
            return Err(bad_request(
                &format!(
                    "max_tokens={m} cannot be greater than max_model_len={limit}. Please request fewer output tokens."
                ),
                Some("max_tokens"),
                Some(&m.to_string()),
            ));
        }
    }
    // `_verify_greedy_sampling`.
    let n = req.get("n").and_then(Value::as_i64).unwrap_or(1);
    if n > 1 && number(req, "temperature").is_some_and(|t| t < 1e-5) {
        return Err(bad_request(
            &format!("n must be 1 when using greedy sampling, got {n}."),
            None,
            None,
        ));
    }
    Ok(())
}

/// The engine's check as it adds the request, after the logprob counts: inside a stream that
/// has begun.
pub(crate) fn speculation(app: &App, req: &Map<String, Value>) -> Result<(), ApiError> {
    speculative(app, req).map_err(|e| e.in_stream_if(streaming(req)))
}

/// vLLM's default `--max-logprobs`.
const MAX_LOGPROBS: i64 = 20;

/// `SamplingParams._validate_logprobs`: at most `--max-logprobs` alternatives a token; -1 asks
/// for the whole vocabulary.
pub(crate) fn sample_logprobs(requested: Option<i64>, prompt: Option<i64>) -> Result<(), ApiError> {
    for (asked, kind, field) in [(requested, "sample", "logprobs"), (prompt, "prompt", "prompt_logprobs")] {
        let wanted = match asked {
            None | Some(0) => continue,
            Some(-1) => crate::sim::vocab::WORDS.len() as i64 + 256,
            Some(n) => n,
        };
        if wanted > MAX_LOGPROBS {
            return Err(bad_request(
                &format!("Requested {kind} logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}"),
                Some(field),
                Some(&wanted.to_string()),
            ));
        }
    }
    Ok(())
}

/// The beam-search path's checks: a stream is refused on completions, and the temperature
/// rules are the only ones `BeamSearchParams` runs.
pub(crate) fn beam_search(req: &Map<String, Value>, completions: bool) -> Result<(), ApiError> {
    if completions && streaming(req) {
        return Err(bad_request(
            "Streaming is not currently supported with beam search",
            None,
            None,
        ));
    }
    if let Some(n) = req.get("n").and_then(Value::as_i64).filter(|n| *n < 1) {
        return Err(bad_request(&format!("n must be at least 1, got {n}."), None, None));
    }
    // Chat's beam search checks them as it runs: inside a stream that has begun.
    let temperature: Vec<&Rule> = RULES.iter().filter(|r| r.field == "temperature").collect();
    first_refusal(req, temperature).map_err(|e| e.in_stream_if(!completions && streaming(req)))
}

/// `SamplingParams.verify` with a speculative config: min_p and logit_bias are refused.
fn speculative(app: &App, req: &Map<String, Value>) -> Result<(), ApiError> {
    if app.args.speculative.is_none() {
        return Ok(());
    }
    // Greedy sampling resets min_p to 0 (`SamplingParams.__post_init__`), so it passes here.
    let greedy = number(req, "temperature").is_some_and(|t| t < 1e-5);
    let min_p = if greedy {
        0.0
    } else {
        number(req, "min_p").unwrap_or(0.0)
    };
    let bias = req
        .get("logit_bias")
        .and_then(Value::as_object)
        .is_some_and(|b| !b.is_empty());
    if min_p > 1e-5 || bias {
        return Err(bad_request(
            "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding.",
            None,
            None,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_render_as_python_does() {
        assert_eq!(float_str(1e9), "1000000000.0");
        assert_eq!(float_str(1e16), "1e+16");
        assert_eq!(float_str(f64::NAN), "nan");
        assert_eq!(float_str(-0.5), "-0.5");
    }
}
