//! What `vllm serve` accepts, as tables and checks: every flag with the kind of its values,
//! the short forms, argparse's refusals of a bad value, and the speculative config's
//! validation as pydantic does it at startup.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// `--x` / `--no-x`.
    Bool,
    Str,
    Int,
    /// An integer that may carry a k/m/g suffix (vLLM's human-readable ints).
    HumanInt,
    Float,
    Json,
    Choice(&'static [&'static str]),
    /// One or more strings (`nargs='+'`).
    Many,
    ManyInt,
}

pub(super) use Kind::*;

/// Every flag the simulator accepts: the ones sparkgate's plans generate for both profiles plus
/// the common `vllm serve` options a user might add through EXTRA_ARGS.
pub(super) const FLAGS: &[(&str, Kind)] = &[
    ("model", Str),
    ("served-model-name", Many),
    ("host", Str),
    // Tracing (vLLM exports its request spans there; the simulator parses it and exports none).
    ("otlp-traces-endpoint", Str),
    ("port", Int),
    ("uds", Str),
    ("api-key", Many),
    ("tensor-parallel-size", Int),
    ("pipeline-parallel-size", Int),
    ("data-parallel-size", Int),
    ("nnodes", Int),
    ("node-rank", Int),
    ("master-addr", Str),
    ("master-port", Int),
    ("headless", Bool),
    (
        "distributed-executor-backend",
        Choice(&["mp", "ray", "uni", "external_launcher"]),
    ),
    ("distributed-timeout-seconds", Int),
    ("api-server-count", Int),
    ("tokenizer", Str),
    ("tokenizer-mode", Str),
    ("trust-remote-code", Bool),
    ("dtype", Str),
    ("seed", Int),
    ("revision", Str),
    ("download-dir", Str),
    ("load-format", Str),
    ("max-model-len", HumanInt),
    ("gpu-memory-utilization", Float),
    ("kv-cache-memory-bytes", HumanInt),
    (
        "kv-cache-dtype",
        Choice(&[
            "auto",
            "bfloat16",
            "fp8",
            "fp8_ds_mla",
            "fp8_e4m3",
            "fp8_e5m2",
            "fp8_inc",
            "nvfp4",
        ]),
    ),
    ("block-size", Int),
    ("num-gpu-blocks-override", Int),
    ("enable-prefix-caching", Bool),
    ("enable-chunked-prefill", Bool),
    ("max-num-seqs", Int),
    ("max-num-batched-tokens", HumanInt),
    ("long-prefill-token-threshold", Int),
    ("max-num-partial-prefills", Int),
    ("enforce-eager", Bool),
    ("quantization", Str),
    ("speculative-config", Json),
    ("compilation-config", Json),
    ("cudagraph-capture-sizes", ManyInt),
    ("hf-overrides", Json),
    ("kv-transfer-config", Json),
    ("chat-template", Str),
    ("chat-template-content-format", Choice(&["auto", "string", "openai"])),
    ("default-chat-template-kwargs", Json),
    ("trust-request-chat-template", Bool),
    ("tool-call-parser", Str),
    ("enable-auto-tool-choice", Bool),
    ("enable-scale-out", Bool),
    ("reasoning-parser", Str),
    ("language-model-only", Bool),
    ("limit-mm-per-prompt", Json),
    ("mm-encoder-tp-mode", Choice(&["data", "weights"])),
    ("skip-mm-profiling", Bool),
    ("enable-prompt-tokens-details", Bool),
    ("enable-flashinfer-autotune", Bool),
    ("enable-request-id-headers", Bool),
    ("enable-force-include-usage", Bool),
    ("enable-server-load-tracking", Bool),
    ("enable-log-requests", Bool),
    ("disable-log-stats", Bool),
    ("sse-keep-alive-interval", Float),
    ("max-num-queued-reqs", Int),
    ("max-num-queued-tokens", HumanInt),
    ("scheduling-policy", Choice(&["fcfs", "priority"])),
    ("generation-config", Str),
    ("max-logprobs", Int),
    ("root-path", Str),
    (
        "uvicorn-log-level",
        Choice(&["debug", "info", "warning", "error", "critical", "trace"]),
    ),
    ("disable-fastapi-docs", Bool),
];

pub(super) const SHORT: &[(&str, &str)] = &[
    ("-tp", "tensor-parallel-size"),
    ("-pp", "pipeline-parallel-size"),
    ("-dp", "data-parallel-size"),
    ("-n", "nnodes"),
    ("-r", "node-rank"),
    ("-q", "quantization"),
];

/// Keys `SpeculativeConfig` accepts (pydantic `extra="forbid"`, vLLM 0.33 §8.1).
const SPEC_KEYS: &[&str] = &[
    "method",
    "num_speculative_tokens",
    "model",
    "draft_tensor_parallel_size",
    "quantization",
    "max_model_len",
    "revision",
    "code_revision",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "parallel_drafting",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "draft_sample_method",
    "enable_adaptive_verification",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "attention_backend",
    "kv_cache_dtype",
    "moe_backend",
    "disable_padded_drafter_batch",
    "num_speculative_tokens_per_batch_size",
];

const SPEC_METHODS: &[&str] = &[
    "ngram",
    "ngram_gpu",
    "draft_model",
    "suffix",
    "custom_class",
    "eagle",
    "eagle3",
    "mtp",
    "dflash",
    "dspark",
    "extract_hidden_states",
];

/// A refusal to start: the message and the exit status vLLM would use.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgError {
    pub message: String,
    pub status: i32,
}

const USAGE: &str = "usage: vllm serve [model_tag] [options]";

pub(super) fn usage_error(msg: impl Into<String>) -> ArgError {
    ArgError {
        message: format!("{USAGE}\nvllm serve: error: {}", msg.into()),
        status: 2,
    }
}

/// The parsed `--speculative-config`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    pub method: String,
    pub num_speculative_tokens: u32,
}

pub(super) fn human_int(s: &str) -> Option<u64> {
    let lower = s.to_ascii_lowercase();
    let (digits, mult) = match lower.chars().last()? {
        'k' => (&lower[..lower.len() - 1], 1_000),
        'm' => (&lower[..lower.len() - 1], 1_000_000),
        'g' => (&lower[..lower.len() - 1], 1_000_000_000),
        _ => (lower.as_str(), 1),
    };
    digits.parse::<u64>().ok().map(|v| v * mult)
}

pub(super) fn check_value(flag: &str, kind: Kind, value: &str) -> Result<(), ArgError> {
    let invalid = |what: &str| usage_error(format!("argument --{flag}: invalid {what} value: '{value}'"));
    match kind {
        Int | ManyInt => value.parse::<i64>().map(|_| ()).map_err(|_| invalid("int")),
        HumanInt => human_int(value)
            .map(|_| ())
            .ok_or_else(|| invalid("human_readable_int")),
        Float => value.parse::<f64>().map(|_| ()).map_err(|_| invalid("float")),
        Json => serde_json::from_str::<Value>(value)
            .map(|_| ())
            .map_err(|_| invalid("loads")),
        Choice(options) if !options.contains(&value) => Err(usage_error(format!(
            "argument --{flag}: invalid choice: '{value}' (choose from {})",
            options.iter().map(|o| format!("'{o}'")).collect::<Vec<_>>().join(", ")
        ))),
        _ => Ok(()),
    }
}

/// Validates `--speculative-config` as vLLM's `SpeculativeConfig` would at startup.
pub(super) fn spec_config(raw: &str) -> Result<SpecConfig, ArgError> {
    let fail = |field: &str, msg: &str, input: &Value| {
        ArgError {
        message: format!(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n{field}\n  {msg} [input_value={input}]"
        ),
        status: 1,
    }
    };
    let value: Value = serde_json::from_str(raw).expect("checked as JSON");
    let Value::Object(map) = &value else {
        return Err(fail("", "Input should be a valid dictionary", &value));
    };
    for key in map.keys() {
        if !SPEC_KEYS.contains(&key.as_str()) {
            return Err(fail(
                key,
                "Extra inputs are not permitted [type=extra_forbidden]",
                &map[key],
            ));
        }
    }
    let method = match map.get("method") {
        Some(Value::String(m)) if SPEC_METHODS.contains(&m.as_str()) || m.ends_with("_mtp") => m.clone(),
        Some(other) => return Err(fail("method", "Input should be a supported speculative method", other)),
        None => return Err(fail("method", "Field required [type=missing]", &value)),
    };
    let k = match map.get("num_speculative_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|k| k > 0) => n.as_u64().unwrap_or(1) as u32,
        Some(other) => return Err(fail("num_speculative_tokens", "Input should be greater than 0", other)),
        None => 1,
    };
    Ok(SpecConfig {
        method,
        num_speculative_tokens: k,
    })
}
