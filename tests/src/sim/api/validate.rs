//! `SamplingParams` verification (vLLM 0.33's sampling_params.py `_verify_args`), which runs
//! after the schema, the model check and rendering.

use serde_json::{Map, Value};

use super::pydantic;
use super::{bad_request, ApiError, App};

fn number(req: &Map<String, Value>, name: &str) -> Option<f64> {
    req.get(name).and_then(Value::as_f64)
}

/// Python's rendering of a float field's value (`2.0`, `-1.0`).
fn float_str(v: f64) -> String {
    pydantic::py_str(&Value::from(v))
}

/// `SamplingParams` verification, in vLLM's order, for the given max-tokens field names.
pub(crate) fn sampling(app: &App, req: &Map<String, Value>, max_names: &[&str]) -> Result<(), ApiError> {
    if let Some(n) = req.get("n").and_then(Value::as_i64) {
        if n < 1 {
            return Err(bad_request(&format!("n must be at least 1, got {n}."), None, None));
        }
    }
    if let Some(t) = number(req, "temperature") {
        let v = float_str(t);
        if t < 0.0 {
            return Err(bad_request(
                &format!("temperature must be non-negative, got {v}."),
                Some("temperature"),
                Some(&v),
            ));
        }
        if t > 2.0 {
            return Err(bad_request(
                &format!("temperature must be in [0, 2], got {v}."),
                Some("temperature"),
                Some(&v),
            ));
        }
    }
    if let Some(p) = number(req, "top_p") {
        if !(p > 0.0 && p <= 1.0) {
            let v = float_str(p);
            return Err(bad_request(
                &format!("top_p must be in (0, 1], got {v}."),
                Some("top_p"),
                Some(&v),
            ));
        }
    }
    let max = max_names
        .iter()
        .find_map(|n| req.get(*n).and_then(Value::as_i64).map(|v| (*n, v)));
    if let Some((_, m)) = max {
        if m < 1 {
            return Err(bad_request(
                &format!("max_tokens must be at least 1, got {m}."),
                Some("max_tokens"),
                Some(&m.to_string()),
            ));
        }
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
    Ok(())
}
