//! `vllm serve` command-line parsing with argparse's behaviour: the flags our launch plans use
//! (and the common rest), `--flag=value` and `--flag value`, underscores accepted as dashes,
//! `--no-` forms of boolean flags, and argparse-style errors with exit status 2.

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
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

use Kind::*;

/// Every flag the simulator accepts: the ones sparkgate's plans generate for both profiles plus
/// the common `vllm serve` options a user might add through EXTRA_ARGS.
const FLAGS: &[(&str, Kind)] = &[
    ("model", Str),
    ("served-model-name", Many),
    ("host", Str),
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

const SHORT: &[(&str, &str)] = &[
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

fn usage_error(msg: impl Into<String>) -> ArgError {
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

/// What the simulator uses from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeArgs {
    pub model: String,
    pub served_model_names: Vec<String>,
    pub host: String,
    pub port: u16,
    pub tensor_parallel_size: u32,
    pub nnodes: u32,
    pub node_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub headless: bool,
    pub max_num_seqs: u32,
    /// Prompt tokens one engine step prefills at most (vLLM's chunked prefill).
    pub max_num_batched_tokens: u64,
    pub max_model_len: u64,
    pub speculative: Option<SpecConfig>,
    pub api_keys: Vec<String>,
    pub reasoning_parser: Option<String>,
    pub tool_call_parser: Option<String>,
    pub enable_auto_tool_choice: bool,
    pub default_chat_template_kwargs: Map<String, Value>,
    pub trust_request_chat_template: bool,
    pub enable_request_id_headers: bool,
    pub enable_force_include_usage: bool,
    pub enable_prompt_tokens_details: bool,
    pub max_num_queued_reqs: Option<u64>,
    /// `--block-size`: tokens per KV cache block (vLLM's default 16).
    pub block_size: usize,
    /// Automatic prefix caching, on unless `--no-enable-prefix-caching`.
    pub prefix_caching: bool,
    /// `--num-gpu-blocks-override`: the KV cache's size in blocks (the prefix cache's bound).
    pub gpu_blocks: Option<usize>,
    /// Every flag as given (canonical name → raw values), for the "non-default args" log line.
    pub given: Vec<(String, Vec<String>)>,
}

impl ServeArgs {
    pub fn served_name(&self) -> &str {
        &self.served_model_names[0]
    }
}

fn human_int(s: &str) -> Option<u64> {
    let lower = s.to_ascii_lowercase();
    let (digits, mult) = match lower.chars().last()? {
        'k' => (&lower[..lower.len() - 1], 1_000),
        'm' => (&lower[..lower.len() - 1], 1_000_000),
        'g' => (&lower[..lower.len() - 1], 1_000_000_000),
        _ => (lower.as_str(), 1),
    };
    digits.parse::<u64>().ok().map(|v| v * mult)
}

fn check_value(flag: &str, kind: Kind, value: &str) -> Result<(), ArgError> {
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

/// Parses `serve MODEL [flags]` (the arguments after the program name).
pub fn parse(argv: &[String]) -> Result<ServeArgs, ArgError> {
    let mut it = argv.iter().peekable();
    match it.next().map(String::as_str) {
        Some("serve") => {}
        Some(other) => {
            return Err(usage_error(format!(
                "argument subparser: invalid choice: '{other}' (choose from 'serve')"
            )))
        }
        None => return Err(usage_error("the following arguments are required: subparser")),
    }
    let mut positional: Vec<String> = Vec::new();
    let mut given: Vec<(String, Vec<String>)> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    while let Some(arg) = it.next() {
        if !arg.starts_with('-') || arg == "-" {
            positional.push(arg.clone());
            continue;
        }
        let (raw_name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        let name = match SHORT.iter().find(|(s, _)| *s == raw_name) {
            Some((_, long)) => (*long).to_owned(),
            None => match raw_name.strip_prefix("--") {
                Some(n) => n.replace('_', "-"),
                None => {
                    unknown.push(arg.clone());
                    continue;
                }
            },
        };
        let (name, negated) = match FLAGS.iter().find(|(f, _)| *f == name) {
            Some(_) => (name, false),
            None => match name
                .strip_prefix("no-")
                .filter(|n| FLAGS.iter().any(|(f, k)| f == n && *k == Bool))
            {
                Some(base) => (base.to_owned(), true),
                None => {
                    unknown.push(arg.clone());
                    // Skip this unknown flag's values so they are not taken as positionals.
                    while it.peek().is_some_and(|n| !n.starts_with('-')) {
                        unknown.push(it.next().expect("peeked").clone());
                    }
                    continue;
                }
            },
        };
        let kind = FLAGS
            .iter()
            .find(|(f, _)| *f == name)
            .map(|(_, k)| *k)
            .expect("known flag");
        let values: Vec<String> = match kind {
            Bool => {
                if inline.is_some() {
                    return Err(usage_error(format!(
                        "argument --{name}: ignored explicit argument '{}'",
                        inline.unwrap_or_default()
                    )));
                }
                vec![(!negated).to_string()]
            }
            Many | ManyInt => {
                let mut vals: Vec<String> = inline.into_iter().collect();
                while it.peek().is_some_and(|n| !n.starts_with("--")) {
                    vals.push(it.next().expect("peeked").clone());
                }
                if vals.is_empty() {
                    return Err(usage_error(format!(
                        "argument --{name}: expected at least one argument"
                    )));
                }
                vals
            }
            _ => match inline.or_else(|| it.next().cloned()) {
                Some(v) => vec![v],
                None => return Err(usage_error(format!("argument --{name}: expected one argument"))),
            },
        };
        for v in &values {
            check_value(&name, kind, v)?;
        }
        given.retain(|(n, _)| *n != name);
        given.push((name, values));
    }
    if !unknown.is_empty() {
        return Err(usage_error(format!("unrecognized arguments: {}", unknown.join(" "))));
    }
    let get = |n: &str| given.iter().find(|(g, _)| g == n).map(|(_, v)| v.clone());
    let one = |n: &str| get(n).map(|v| v[0].clone());
    let flag = |n: &str| one(n).as_deref() == Some("true");
    let int = |n: &str, d: i64| one(n).and_then(|v| v.parse::<i64>().ok()).unwrap_or(d);
    let model = match (positional.as_slice(), one("model")) {
        ([m], _) => m.clone(),
        ([], Some(m)) => m,
        ([], None) => "facebook/opt-125m".to_owned(),
        (more, _) => return Err(usage_error(format!("unrecognized arguments: {}", more[1..].join(" ")))),
    };
    let port = int("port", 8000);
    let master_port = int("master-port", 29501);
    let u16_of = |n: &str, v: i64| {
        u16::try_from(v).map_err(|_| ArgError {
            message: format!("ValueError: --{n} must be between 0 and 65535, got {v}"),
            status: 1,
        })
    };
    let speculative = one("speculative-config").map(|raw| spec_config(&raw)).transpose()?;
    let default_chat_template_kwargs =
        match one("default-chat-template-kwargs").map(|r| serde_json::from_str::<Value>(&r)) {
            Some(Ok(Value::Object(m))) => m,
            Some(_) => {
                return Err(usage_error(
                    "argument --default-chat-template-kwargs: invalid loads value (expected a JSON object)",
                ))
            }
            None => Map::new(),
        };
    let nnodes = int("nnodes", 1);
    let node_rank = int("node-rank", 0);
    if node_rank < 0 || node_rank >= nnodes.max(1) {
        return Err(ArgError {
            message: format!("ValueError: node_rank ({node_rank}) must be in [0, nnodes={nnodes})"),
            status: 1,
        });
    }
    let headless = flag("headless");
    if headless && get("api-server-count").is_some_and(|v| v[0] != "0") {
        return Err(ArgError {
            message: "ValueError: --api-server-count cannot be used with --headless".into(),
            status: 1,
        });
    }
    let max_num_seqs = int("max-num-seqs", 256);
    if max_num_seqs < 1 {
        return Err(ArgError {
            message: format!("ValueError: max_num_seqs ({max_num_seqs}) must be at least 1"),
            status: 1,
        });
    }
    let mut api_keys = get("api-key").unwrap_or_default();
    if api_keys.is_empty() {
        if let Ok(k) = std::env::var("VLLM_API_KEY") {
            if !k.is_empty() {
                api_keys.push(k);
            }
        }
    }
    Ok(ServeArgs {
        served_model_names: get("served-model-name").unwrap_or_else(|| vec![model.clone()]),
        model,
        host: one("host").unwrap_or_else(|| "0.0.0.0".into()),
        port: u16_of("port", port)?,
        tensor_parallel_size: int("tensor-parallel-size", 1).max(1) as u32,
        nnodes: nnodes.max(1) as u32,
        node_rank: node_rank as u32,
        master_addr: one("master-addr").unwrap_or_else(|| "127.0.0.1".into()),
        master_port: u16_of("master-port", master_port)?,
        headless,
        max_num_seqs: max_num_seqs as u32,
        max_num_batched_tokens: one("max-num-batched-tokens")
            .and_then(|v| human_int(&v))
            .unwrap_or(8192)
            .max(1),
        max_model_len: one("max-model-len").and_then(|v| human_int(&v)).unwrap_or(131_072),
        speculative,
        api_keys,
        reasoning_parser: one("reasoning-parser"),
        tool_call_parser: one("tool-call-parser"),
        enable_auto_tool_choice: flag("enable-auto-tool-choice"),
        default_chat_template_kwargs,
        trust_request_chat_template: flag("trust-request-chat-template"),
        enable_request_id_headers: flag("enable-request-id-headers"),
        enable_force_include_usage: flag("enable-force-include-usage"),
        enable_prompt_tokens_details: flag("enable-prompt-tokens-details"),
        max_num_queued_reqs: one("max-num-queued-reqs").and_then(|v| v.parse().ok()),
        block_size: int("block-size", 16).clamp(1, 1024) as usize,
        prefix_caching: one("enable-prefix-caching").as_deref() != Some("false"),
        gpu_blocks: one("num-gpu-blocks-override")
            .and_then(|v| v.parse().ok())
            .filter(|&b: &usize| b > 0),
        given,
    })
}

/// Validates `--speculative-config` as vLLM's `SpeculativeConfig` would at startup.
fn spec_config(raw: &str) -> Result<SpecConfig, ArgError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_the_plan_shape() {
        let a = parse(&argv(
            r#"serve /model --served-model-name M --host 127.0.0.1 --port 0 --tensor-parallel-size 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29521 --distributed-executor-backend mp --headless --no-enable-flashinfer-autotune --max-num-seqs 2 --max-model-len 600000 --speculative-config {"method":"dspark","num_speculative_tokens":3} --cudagraph-capture-sizes 1 2 3 --language-model-only"#,
        ))
        .unwrap();
        assert_eq!(a.model, "/model");
        assert_eq!(a.served_name(), "M");
        assert_eq!((a.nnodes, a.node_rank, a.headless), (2, 1, true));
        assert_eq!(a.gpu_blocks, None);
        assert_eq!(
            a.speculative,
            Some(SpecConfig {
                method: "dspark".into(),
                num_speculative_tokens: 3
            })
        );
        assert_eq!(a.max_num_seqs, 2);
        assert_eq!(
            parse(&argv("serve m --max_num_seqs=7")).unwrap().max_num_seqs,
            7,
            "underscores and = work"
        );
        assert_eq!(
            parse(&argv("serve m --max-model-len 1m")).unwrap().max_model_len,
            1_000_000
        );
    }

    #[test]
    fn refuses_like_argparse() {
        let e = parse(&argv("serve m --max-num-seqs 2 --frobnicate 3")).unwrap_err();
        assert_eq!(e.status, 2);
        assert!(
            e.message
                .ends_with("vllm serve: error: unrecognized arguments: --frobnicate 3"),
            "{}",
            e.message
        );
        let e = parse(&argv("serve m --max-num-seqs two")).unwrap_err();
        assert!(e.message.contains("argument --max-num-seqs: invalid int value: 'two'"));
        let e = parse(&argv("serve m --kv-cache-dtype fp4")).unwrap_err();
        assert!(e.message.contains("invalid choice: 'fp4'"));
        let e = parse(&argv("serve m --port")).unwrap_err();
        assert!(e.message.contains("argument --port: expected one argument"));
        let e = parse(&argv(
            r#"serve m --speculative-config {"method":"dspark","disable_by_batch_size":4}"#,
        ))
        .unwrap_err();
        assert_eq!(e.status, 1);
        assert!(
            e.message
                .contains("disable_by_batch_size\n  Extra inputs are not permitted"),
            "{}",
            e.message
        );
        let e = parse(&argv("serve m --speculative-config {bad")).unwrap_err();
        assert!(e.message.contains("invalid loads value"));
    }
}
