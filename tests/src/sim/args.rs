//! `vllm serve` command-line parsing with argparse's behaviour: the flags our launch plans use
//! (and the common rest), `--flag=value` and `--flag value`, underscores accepted as dashes,
//! `--no-` forms of boolean flags, and argparse-style errors with exit status 2.

use serde_json::{Map, Value};

pub use super::flags::ArgError;
use super::flags::Kind::{self, *};
use super::flags::SpecConfig;
use super::flags::{check_value, human_int, spec_config, usage_error, FLAGS, SHORT};

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
    /// `--long-prefill-token-threshold`: one prompt's share of a step at most, while another
    /// request runs or waits (0: none).
    pub long_prefill_token_threshold: u64,
    pub max_model_len: u64,
    pub speculative: Option<SpecConfig>,
    pub api_keys: Vec<String>,
    pub reasoning_parser: Option<String>,
    pub tool_call_parser: Option<String>,
    pub enable_auto_tool_choice: bool,
    /// `--enable-scale-out`: serve the render, tokens-in generate and derender routes.
    pub enable_scale_out: bool,
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

/// Parses `serve MODEL [flags]` (the arguments after the program name): the subcommand, then
/// every argument as given, then the settings read from them.
pub fn parse(argv: &[String]) -> Result<ServeArgs, ArgError> {
    Given::scan(subcommand(argv)?)?.serve_args()
}

/// The arguments after `serve`, the only subcommand.
fn subcommand(argv: &[String]) -> Result<&[String], ArgError> {
    match argv.split_first() {
        Some((serve, rest)) if serve == "serve" => Ok(rest),
        Some((other, _)) => Err(usage_error(format!(
            "argument subparser: invalid choice: '{other}' (choose from 'serve')"
        ))),
        None => Err(usage_error("the following arguments are required: subparser")),
    }
}

/// What a `-…` argument names.
enum Named {
    /// A flag of FLAGS (`negated` for the `--no-` form of a boolean one), with its `=value`.
    Flag {
        name: String,
        kind: Kind,
        negated: bool,
        inline: Option<String>,
    },
    /// A single-dash word that is no short form: unrecognized, the words after it are not.
    UnknownShort,
    /// A `--` flag vLLM does not have: unrecognized, and so are the values after it.
    UnknownLong,
}

impl Named {
    fn of(arg: &str) -> Named {
        let (raw_name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (arg, None),
        };
        let name = match SHORT.iter().find(|(s, _)| *s == raw_name) {
            Some((_, long)) => (*long).to_owned(),
            None => match raw_name.strip_prefix("--") {
                Some(n) => n.replace('_', "-"),
                None => return Named::UnknownShort,
            },
        };
        if let Some((_, kind)) = FLAGS.iter().find(|(f, _)| *f == name) {
            return Named::Flag {
                name,
                kind: *kind,
                negated: false,
                inline,
            };
        }
        match name
            .strip_prefix("no-")
            .filter(|n| FLAGS.iter().any(|(f, k)| f == n && *k == Bool))
        {
            Some(base) => Named::Flag {
                name: base.to_owned(),
                kind: Bool,
                negated: true,
                inline,
            },
            None => Named::UnknownLong,
        }
    }
}

type Args<'a> = std::iter::Peekable<std::slice::Iter<'a, String>>;

/// The values of flag `name` of `kind`: its `=value` (`inline`) or the arguments after it.
fn values(
    name: &str,
    kind: Kind,
    negated: bool,
    inline: Option<String>,
    it: &mut Args,
) -> Result<Vec<String>, ArgError> {
    match kind {
        Bool => match inline {
            Some(v) => Err(usage_error(format!(
                "argument --{name}: ignored explicit argument '{v}'"
            ))),
            None => Ok(vec![(!negated).to_string()]),
        },
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
            Ok(vals)
        }
        _ => match inline.or_else(|| it.next().cloned()) {
            Some(v) => Ok(vec![v]),
            None => Err(usage_error(format!("argument --{name}: expected one argument"))),
        },
    }
}

/// The command line as given: positionals, and every flag (canonical name → raw values) where
/// a later occurrence replaces an earlier one, in the order last given.
struct Given {
    positional: Vec<String>,
    flags: Vec<(String, Vec<String>)>,
}

impl Given {
    /// Reads `args`, checking each value against its flag's kind; unrecognized arguments are
    /// refused together at the end, as argparse does.
    fn scan(args: &[String]) -> Result<Given, ArgError> {
        let mut it = args.iter().peekable();
        let (mut positional, mut flags, mut unknown) = (Vec::new(), Vec::<(String, Vec<String>)>::new(), Vec::new());
        while let Some(arg) = it.next() {
            if !arg.starts_with('-') || arg == "-" {
                positional.push(arg.clone());
                continue;
            }
            let (name, kind, negated, inline) = match Named::of(arg) {
                Named::Flag {
                    name,
                    kind,
                    negated,
                    inline,
                } => (name, kind, negated, inline),
                Named::UnknownShort => {
                    unknown.push(arg.clone());
                    continue;
                }
                Named::UnknownLong => {
                    unknown.push(arg.clone());
                    // Skip this unknown flag's values so they are not taken as positionals.
                    while it.peek().is_some_and(|n| !n.starts_with('-')) {
                        unknown.push(it.next().expect("peeked").clone());
                    }
                    continue;
                }
            };
            let values = values(&name, kind, negated, inline, &mut it)?;
            for v in &values {
                check_value(&name, kind, v)?;
            }
            flags.retain(|(n, _)| *n != name);
            flags.push((name, values));
        }
        if !unknown.is_empty() {
            return Err(usage_error(format!("unrecognized arguments: {}", unknown.join(" "))));
        }
        Ok(Given { positional, flags })
    }

    fn get(&self, name: &str) -> Option<Vec<String>> {
        self.flags.iter().find(|(g, _)| g == name).map(|(_, v)| v.clone())
    }

    fn one(&self, name: &str) -> Option<String> {
        self.get(name).map(|v| v[0].clone())
    }

    fn flag(&self, name: &str) -> bool {
        self.one(name).as_deref() == Some("true")
    }

    fn int(&self, name: &str, default: i64) -> i64 {
        self.one(name).and_then(|v| v.parse::<i64>().ok()).unwrap_or(default)
    }

    /// The model: the positional tag, else `--model`, else vLLM's default.
    fn model(&self) -> Result<String, ArgError> {
        match (self.positional.as_slice(), self.one("model")) {
            ([m], _) => Ok(m.clone()),
            ([], Some(m)) => Ok(m),
            ([], None) => Ok("facebook/opt-125m".to_owned()),
            (more, _) => Err(usage_error(format!("unrecognized arguments: {}", more[1..].join(" ")))),
        }
    }

    fn port(&self, name: &str, default: i64) -> Result<u16, ArgError> {
        let v = self.int(name, default);
        u16::try_from(v).map_err(|_| ArgError {
            message: format!("ValueError: --{name} must be between 0 and 65535, got {v}"),
            status: 1,
        })
    }

    fn default_chat_template_kwargs(&self) -> Result<Map<String, Value>, ArgError> {
        match self
            .one("default-chat-template-kwargs")
            .map(|r| serde_json::from_str::<Value>(&r))
        {
            Some(Ok(Value::Object(m))) => Ok(m),
            Some(_) => Err(usage_error(
                "argument --default-chat-template-kwargs: invalid loads value (expected a JSON object)",
            )),
            None => Ok(Map::new()),
        }
    }

    /// The node's place in the group and its scheduler's width, refused as vLLM's config
    /// checks refuse them: (nnodes, node_rank, headless, max_num_seqs).
    fn topology(&self) -> Result<(i64, i64, bool, i64), ArgError> {
        let refuse = |message: String| Err(ArgError { message, status: 1 });
        let (nnodes, node_rank) = (self.int("nnodes", 1), self.int("node-rank", 0));
        if node_rank < 0 || node_rank >= nnodes.max(1) {
            return refuse(format!(
                "ValueError: node_rank ({node_rank}) must be in [0, nnodes={nnodes})"
            ));
        }
        let headless = self.flag("headless");
        if headless && self.get("api-server-count").is_some_and(|v| v[0] != "0") {
            return refuse("ValueError: --api-server-count cannot be used with --headless".into());
        }
        let max_num_seqs = self.int("max-num-seqs", 256);
        if max_num_seqs < 1 {
            return refuse(format!("ValueError: max_num_seqs ({max_num_seqs}) must be at least 1"));
        }
        Ok((nnodes, node_rank, headless, max_num_seqs))
    }

    /// `--api-key`, else VLLM_API_KEY when set and not empty.
    fn api_keys(&self) -> Vec<String> {
        let mut api_keys = self.get("api-key").unwrap_or_default();
        if api_keys.is_empty() {
            if let Ok(k) = std::env::var("VLLM_API_KEY") {
                if !k.is_empty() {
                    api_keys.push(k);
                }
            }
        }
        api_keys
    }

    /// The settings the simulator uses, with vLLM's defaults for what was not given.
    fn serve_args(self) -> Result<ServeArgs, ArgError> {
        let model = self.model()?;
        let (port, master_port) = (self.port("port", 8000), self.port("master-port", 29501));
        let speculative = self
            .one("speculative-config")
            .map(|raw| spec_config(&raw))
            .transpose()?;
        let default_chat_template_kwargs = self.default_chat_template_kwargs()?;
        let (nnodes, node_rank, headless, max_num_seqs) = self.topology()?;
        Ok(ServeArgs {
            served_model_names: self.get("served-model-name").unwrap_or_else(|| vec![model.clone()]),
            model,
            host: self.one("host").unwrap_or_else(|| "0.0.0.0".into()),
            port: port?,
            tensor_parallel_size: self.int("tensor-parallel-size", 1).max(1) as u32,
            nnodes: nnodes.max(1) as u32,
            node_rank: node_rank as u32,
            master_addr: self.one("master-addr").unwrap_or_else(|| "127.0.0.1".into()),
            master_port: master_port?,
            headless,
            max_num_seqs: max_num_seqs as u32,
            max_num_batched_tokens: self
                .one("max-num-batched-tokens")
                .and_then(|v| human_int(&v))
                .unwrap_or(8192)
                .max(1),
            long_prefill_token_threshold: self
                .one("long-prefill-token-threshold")
                .and_then(|v| human_int(&v))
                .unwrap_or(0),
            max_model_len: self.one("max-model-len").and_then(|v| human_int(&v)).unwrap_or(131_072),
            speculative,
            api_keys: self.api_keys(),
            reasoning_parser: self.one("reasoning-parser"),
            tool_call_parser: self.one("tool-call-parser"),
            enable_auto_tool_choice: self.flag("enable-auto-tool-choice"),
            enable_scale_out: self.flag("enable-scale-out"),
            default_chat_template_kwargs,
            trust_request_chat_template: self.flag("trust-request-chat-template"),
            enable_request_id_headers: self.flag("enable-request-id-headers"),
            enable_force_include_usage: self.flag("enable-force-include-usage"),
            enable_prompt_tokens_details: self.flag("enable-prompt-tokens-details"),
            max_num_queued_reqs: self.one("max-num-queued-reqs").and_then(|v| v.parse().ok()),
            block_size: self.int("block-size", 16).clamp(1, 1024) as usize,
            prefix_caching: self.one("enable-prefix-caching").as_deref() != Some("false"),
            gpu_blocks: self
                .one("num-gpu-blocks-override")
                .and_then(|v| v.parse().ok())
                .filter(|&b: &usize| b > 0),
            given: self.flags,
        })
    }
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
