//! Turns resolved strings into the typed `Config`, collecting every rule a value breaks.

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::config::*;
use crate::error::{ConfigError, InvalidValue};
use crate::profile::ProfileId;
use crate::resolve::{Layers, Resolver};
use crate::secret::Secret;
use crate::spec::{self, SpecMethod};

mod gateway;
mod prepare;
mod words;

use words::shell_words;

pub(crate) fn build(layers: Layers<'_>, env_file: Option<PathBuf>) -> Result<Config, ConfigError> {
    // PROFILE has the same default in every profile, so any resolver can read it.
    let probe = Resolver::new(layers, ProfileId::DeepSeekV41Flash);
    let chosen = probe.get("PROFILE");
    let profile = ProfileId::from_str(&chosen.value).map_err(|rule| {
        ConfigError::Invalid(vec![InvalidValue {
            name: "PROFILE".into(),
            value: chosen.value.clone(),
            source: chosen.source.clone(),
            rule,
        }])
    })?;
    let b = Builder {
        r: Resolver::new(probe.layers, profile),
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    b.finish(env_file)
}

struct Builder<'a> {
    r: Resolver<'a>,
    errors: Vec<InvalidValue>,
    warnings: Vec<String>,
}

impl Builder<'_> {
    fn fail(&mut self, name: &str, rule: impl Into<String>) {
        let resolved = self.r.get(name);
        let display_name = match resolved.alias {
            Some(alias) => format!("{name} (set as {alias})"),
            None => name.to_owned(),
        };
        self.errors.push(InvalidValue {
            name: display_name,
            value: Config::redact(name, &resolved.value),
            source: resolved.source,
            rule: rule.into(),
        });
    }

    fn string(&self, name: &str) -> String {
        self.r.value(name)
    }

    fn non_empty(&mut self, name: &str) -> String {
        let v = self.string(name);
        if v.trim().is_empty() {
            self.fail(name, "must not be empty");
        }
        v
    }

    fn optional(&self, name: &str) -> Option<String> {
        Some(self.string(name)).filter(|v| !v.is_empty())
    }

    fn int<T>(&mut self, name: &str, range: RangeInclusive<T>) -> T
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        let raw = self.string(name);
        self.parse_int(name, &raw, &range).unwrap_or(*range.start())
    }

    fn opt_int<T>(&mut self, name: &str, range: RangeInclusive<T>) -> Option<T>
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        let raw = self.string(name);
        if raw.is_empty() {
            return None;
        }
        self.parse_int(name, &raw, &range)
    }

    /// Base-10 integers only, as the launchers' validators accept; leading zeros are fine.
    fn parse_int<T>(&mut self, name: &str, raw: &str, range: &RangeInclusive<T>) -> Option<T>
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        let digits = raw.strip_prefix('-').unwrap_or(raw);
        let parsed = (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| raw.parse::<T>().ok())
            .flatten();
        match parsed {
            Some(v) if range.contains(&v) => Some(v),
            _ => {
                self.fail(
                    name,
                    format!("must be an integer between {} and {}", range.start(), range.end()),
                );
                None
            }
        }
    }

    fn float(&mut self, name: &str, min_exclusive: f64, max: f64) -> f64 {
        let raw = self.string(name);
        let ok =
            !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit() || b == b'.') && raw.matches('.').count() <= 1;
        match raw.parse::<f64>() {
            Ok(v) if ok && v > min_exclusive && v <= max => v,
            _ => {
                self.fail(name, format!("must be a decimal number in ({min_exclusive}, {max}]"));
                max
            }
        }
    }

    fn flag(&mut self, name: &str) -> bool {
        match self.string(name).as_str() {
            "1" => true,
            "0" => false,
            _ => {
                self.fail(name, "must be 0 or 1");
                false
            }
        }
    }

    fn one_of<'v>(&mut self, name: &str, allowed: &[&'v str]) -> &'v str {
        let v = self.string(name);
        match allowed.iter().find(|a| **a == v) {
            Some(a) => a,
            None => {
                let shown: Vec<String> = allowed
                    .iter()
                    .map(|a| {
                        if a.is_empty() {
                            "(empty)".to_owned()
                        } else {
                            (*a).to_owned()
                        }
                    })
                    .collect();
                self.fail(name, format!("must be one of: {}", shown.join(", ")));
                allowed[0]
            }
        }
    }

    fn ip(&mut self, name: &str) -> IpAddr {
        let v = self.string(name);
        v.parse().unwrap_or_else(|_| {
            self.fail(name, "must be an IPv4 or IPv6 address");
            IpAddr::from([127, 0, 0, 1])
        })
    }

    fn secret(&self, name: &str) -> Option<Secret> {
        self.optional(name).map(Secret::new)
    }

    fn seconds(&mut self, name: &str) -> Duration {
        Duration::from_secs(self.int(name, 1..=604_800u64))
    }

    fn finish(mut self, env_file: Option<PathBuf>) -> Result<Config, ConfigError> {
        let profile = self.r.profile;
        let is_glm = profile == ProfileId::Glm53Flash;

        let nodes = Nodes {
            head_ip: self.ip("HEAD_IP"),
            worker_ip: self.ip("WORKER_IP"),
            worker_user: self.non_empty("WORKER_USER"),
            worker_home: self.non_empty("WORKER_HOME"),
            worker_ssh: self.non_empty("WORKER_SSH"),
            ssh: SshSettings {
                port: self.int("WORKER_SSH_PORT", 1..=65535),
                keyfile: self.optional("WORKER_SSH_KEY").map(PathBuf::from),
                known_hosts: self
                    .one_of("SSH_KNOWN_HOSTS", &["accept-new", "strict", "accept"])
                    .to_owned(),
                known_hosts_file: self.optional("SSH_KNOWN_HOSTS_FILE").map(PathBuf::from),
                connect_timeout: self.seconds("SSH_CONNECT_TIMEOUT"),
                control_dir: PathBuf::from(self.non_empty("SSH_CONTROL_DIR")),
                worker_docker_socket: self.non_empty("WORKER_DOCKER_SOCKET"),
            },
            head_nic: Nic {
                ifname: self.non_empty("HEAD_CX7_IF"),
                hca: self.non_empty("HEAD_CX7_IB"),
                gid_index: self.int("HEAD_GID", 0..=255),
            },
            worker_nic: Nic {
                ifname: self.non_empty("WORKER_CX7_IF"),
                hca: self.non_empty("WORKER_CX7_IB"),
                gid_index: self.int("WORKER_GID", 0..=255),
            },
        };
        self.int("NCCL_IB_GID_INDEX", 0..=255u32);

        let ports = Ports {
            public: self.int("PORT", 0..=65535),
            vllm: self.int("VLLM_PORT", 1..=65535),
            master: self.int("MASTER_PORT", 1..=65535),
        };
        // vLLM's own port matters only when the gateway fronts the local rank 0 (not when it
        // fronts another vLLM given by UPSTREAM_URL).
        let local_rank = self.string("UPSTREAM_URL").trim_end_matches('/')
            == format!("http://127.0.0.1:{}", self.string("VLLM_PORT"));
        for (a, b) in [
            ("PORT", "VLLM_PORT"),
            ("PORT", "MASTER_PORT"),
            ("VLLM_PORT", "MASTER_PORT"),
        ] {
            if b == "VLLM_PORT" && !local_rank {
                continue;
            }
            if self.string(a) == self.string(b) {
                self.fail(b, format!("must differ from {a}"));
            }
        }

        let serving = self.serving(is_glm);
        let speculation = self.speculation(&serving);
        self.profile_constraints(is_glm, &serving, &speculation);

        let containers = self.containers();
        let storage = self.storage(is_glm);
        let supervision = Supervision {
            runtime: if self.one_of("RUNTIME", &["docker", "process"]) == "process" {
                Runtime::Process
            } else {
                Runtime::Docker
            },
            docker_socket: self.non_empty("DOCKER_SOCKET"),
            vllm_bin: self.non_empty("VLLM_BIN"),
            log_dir: PathBuf::from(self.non_empty("LOG_DIR")),
            min_free_disk_gib: self
                .optional("MIN_FREE_DISK_GIB")
                .map(|_| self.float("MIN_FREE_DISK_GIB", 0.0, 1_000_000.0)),
            backoff_initial: Duration::from_secs_f64(self.float("RESTART_BACKOFF_INITIAL", 0.0, 86_400.0)),
            backoff_max: Duration::from_secs_f64(self.float("RESTART_BACKOFF_MAX", 0.0, 86_400.0)),
            healthy_reset: Duration::from_secs_f64(self.float("RESTART_HEALTHY_RESET", 0.0, 86_400.0)),
            restart_budget: self.int("RESTART_BUDGET", 1..=1000),
            stop_ranks_on_exit: self.flag("STOP_RANKS_ON_EXIT"),
            progress_timeout: Duration::from_secs_f64(self.float("PROGRESS_TIMEOUT", 0.0, 86_400.0)),
            stall_timeout: Duration::from_secs_f64(self.float("STALL_TIMEOUT", 1.0, 86_400.0)),
            ready_timeout: self.seconds("READY_TIMEOUT"),
            hang: self.seconds("HANG_SECONDS"),
            mem_guard: self.flag("MEM_GUARD"),
            ready_generate_probe: self.flag("READY_GENERATE_PROBE"),
            boot_shape_warmup: self.flag("BOOT_SHAPE_WARMUP"),
            self_check: {
                let skip = self.flag("SKIP_OVERLAY_VERIFY");
                let cmd = self.string("SELF_CHECK_CMD");
                if skip {
                    Vec::new()
                } else {
                    match shell_words(&cmd) {
                        Some(words) => words,
                        None => {
                            self.fail("SELF_CHECK_CMD", "has an unterminated quote".to_owned());
                            Vec::new()
                        }
                    }
                }
            },
            mem_guard_gib: self.float("MEM_GUARD_GIB", 0.0, 1024.0),
            boot_margin_gib: self
                .optional("BOOT_MARGIN_GIB")
                .map(|_| self.float("BOOT_MARGIN_GIB", 0.0, 1024.0)),
            weights_gib_per_rank: self
                .optional("WEIGHTS_GIB_PER_RANK")
                .map(|_| self.float("WEIGHTS_GIB_PER_RANK", 0.0, 4096.0)),
            meminfo_path: PathBuf::from(self.non_empty("MEMINFO_PATH")),
        };
        let gateway = self.gateway(profile);
        let preparation = self.preparation(profile, &nodes);
        let secrets = Secrets {
            hf_token: self.secret("HF_TOKEN"),
            ghcr_user: self.string("GHCR_USER"),
            ghcr_token: self.secret("GHCR_TOKEN"),
            vllm_api_key: self.secret("VLLM_API_KEY"),
            api_keys: self
                .string("API_KEYS")
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(Secret::new)
                .collect(),
            admin_token: self.secret("ADMIN_TOKEN"),
        };
        self.one_of("GLM53_INDEXER_WORKSPACE", &["stock", "rightsize"]);
        if self.string("GLM53_SPINWAIT_MS") != "stock" {
            let raw = self.string("GLM53_SPINWAIT_MS");
            if self.parse_int("GLM53_SPINWAIT_MS", &raw, &(1..=1000u32)).is_none() {
                // The integer rule was reported; say that `stock` is the other choice.
                if let Some(last) = self.errors.last_mut() {
                    last.rule = "must be `stock` or an integer between 1 and 1000".into();
                }
            }
        }

        for pair in self
            .string("RANK_ENV")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            if !pair
                .split_once('=')
                .is_some_and(|(k, _)| crate::dotenv::is_identifier(k.trim()))
            {
                self.fail("RANK_ENV", format!("`{pair}` must be NAME=value"));
            }
        }
        let (rank_env, mut warnings) = crate::passthrough::rank_env_and_warnings(&self.r);
        warnings.append(&mut self.warnings);
        let settings = crate::config::resolver_settings(&self.r);
        if !self.errors.is_empty() {
            return Err(ConfigError::Invalid(self.errors));
        }
        Ok(Config {
            profile,
            deploy_dir: PathBuf::from(self.r.layers.deploy_dir.clone()),
            env_file,
            nodes,
            ports,
            serving,
            speculation,
            containers,
            storage,
            preparation,
            supervision,
            gateway,
            secrets,
            rank_env,
            settings,
            warnings,
        })
    }

    fn serving(&mut self, is_glm: bool) -> Serving {
        let max_len_limit = if is_glm { 1_000_000 } else { 1_048_576 };
        // The glm guide: the indexer top-k path oversubscribes shared memory at 8192.
        let mnbt_limit = if is_glm { 8191 } else { 8_388_608 };
        let max_num_batched_tokens = self.int("MAX_NUM_BATCHED_TOKENS", 1..=mnbt_limit);
        if is_glm && self.errors.last().is_some_and(|e| e.name == "MAX_NUM_BATCHED_TOKENS") {
            self.errors.last_mut().expect("checked").rule =
                "must be an integer between 1 and 8191 (glm guide: 8192 oversubscribes the indexer's shared memory)"
                    .into();
        }
        let long_prefill_token_threshold = self.opt_int("LONG_PREFILL_TOKEN_THRESHOLD", 1..=8_388_608u32);
        if let Some(t) = long_prefill_token_threshold {
            // Launcher guidance, not a vLLM rule: leave room in each step for running decodes.
            if t.saturating_add(256) > max_num_batched_tokens {
                self.warnings.push(format!(
                    "LONG_PREFILL_TOKEN_THRESHOLD={t} leaves fewer than 256 of MAX_NUM_BATCHED_TOKENS={max_num_batched_tokens} \
                     for decodes; the launchers advise MAX_NUM_BATCHED_TOKENS - LONG_PREFILL_TOKEN_THRESHOLD >= 256"
                ));
            }
        }
        let gpu_mem_util = self.string("GPU_MEM_UTIL");
        self.float("GPU_MEM_UTIL", 0.0, 1.0);
        let tp = self.int("TP", 1..=64u32);
        let nnodes = self.int("NNODES", 1..=2u32);
        if tp % nnodes != 0 {
            self.fail("TP", format!("must be a multiple of NNODES ({nnodes})"));
        }
        let extra_args = match shlex::split(&self.string("EXTRA_ARGS")) {
            Some(words) => words,
            None => {
                self.fail("EXTRA_ARGS", "must be shell words with balanced quotes");
                Vec::new()
            }
        };
        for owned in [
            "--host",
            "--port",
            "--served-model-name",
            "--node-rank",
            "--headless",
            "--nnodes",
            "--master-addr",
            "--master-port",
        ] {
            if extra_args
                .iter()
                .any(|a| a == owned || a.starts_with(&format!("{owned}=")))
            {
                self.fail(
                    "EXTRA_ARGS",
                    format!("must not set {owned}: sparkgate derives it from its own variables"),
                );
            }
        }
        let limit_mm = self.string("LIMIT_MM");
        if !matches!(
            serde_json::from_str::<serde_json::Value>(&limit_mm),
            Ok(serde_json::Value::Object(_))
        ) {
            self.fail(
                "LIMIT_MM",
                "must be a JSON object such as {\"image\":4}; in an env file single-quote it (LIMIT_MM='{\"image\":4}'), \
                 as bash drops unquoted double quotes",
            );
        }
        let default_reasoning_effort = if is_glm {
            let v = self.one_of("GLM53_DEFAULT_REASONING_EFFORT", &["", "low", "high", "max"]);
            Some(v.to_owned()).filter(|v| !v.is_empty())
        } else {
            None
        };
        let served_model_name = self.non_empty("SERVED_MODEL_NAME");
        if served_model_name.chars().any(char::is_whitespace) {
            self.fail("SERVED_MODEL_NAME", "must not contain whitespace");
        }
        let host_nccl = self.flag("USE_HOST_NCCL").then(|| HostNccl {
            head_dir: self.string("NCCL_HOST_DIR"),
            worker_dir: self.string("WORKER_NCCL_HOST_DIR"),
            so_name: self.string("NCCL_SO_NAME"),
        });
        Serving {
            served_model_name,
            image: self.non_empty("IMAGE"),
            tp,
            nnodes,
            quantization: self.optional("QUANTIZATION").filter(|q| q != "none"),
            max_model_len: self.int("MAX_MODEL_LEN", 1..=max_len_limit),
            gpu_mem_util,
            max_num_batched_tokens,
            long_prefill_token_threshold,
            kv_cache_dtype: self.optional("KV_CACHE_DTYPE"),
            kv_block_size: if is_glm {
                None
            } else {
                Some(self.int("KV_BLOCK_SIZE", 1..=1024))
            },
            kv_cache_memory_bytes: if is_glm {
                None
            } else {
                self.opt_int("KV_CACHE_MEMORY_BYTES", 1..=u64::MAX)
            },
            enforce_eager: self.flag("ENFORCE_EAGER"),
            extra_args,
            language_model_only: self.flag("LANGUAGE_MODEL_ONLY"),
            skip_mm_profiling: self.flag("SKIP_MM_PROFILING"),
            limit_mm,
            chat_template_host: self.optional("CHAT_TEMPLATE_HOST").map(PathBuf::from),
            default_reasoning_effort,
            cg_estimate: self.flag("CG_ESTIMATE"),
            host_nccl,
        }
    }

    fn speculation(&mut self, serving: &Serving) -> Speculation {
        let profile = self.r.profile;
        let defs = spec::mode_defs(profile);
        let names: Vec<&str> = defs.iter().map(|d| d.method.as_str()).collect();
        let active = self
            .one_of("SPEC_METHOD", &names)
            .parse::<SpecMethod>()
            .expect("profile modes parse");
        let max_num_seqs = self.int("MAX_NUM_SEQS", 1..=65_536u32);
        let modes = defs
            .iter()
            .map(|def| {
                let tokens = match def.tokens_knob {
                    Some(knob) => {
                        let range = match def.method {
                            SpecMethod::Dspark => 1..=5,
                            SpecMethod::Mtp => 0..=8,
                            _ => 1..=16,
                        };
                        self.int(knob, range)
                    }
                    None => 0,
                };
                let seqs = if def.method == active {
                    max_num_seqs
                } else {
                    def.max_num_seqs
                };
                def.build(tokens, seqs)
            })
            .collect();
        let dflash = (profile == ProfileId::Glm53Flash).then(|| DflashDraft {
            repo: self.non_empty("DFLASH_MODEL"),
            model_dir: self.non_empty("DFLASH_MODEL_DIR"),
            draft_tensor_parallel_size: self.opt_int("DFLASH_DRAFT_TP", 1..=serving.tp.max(1)),
        });
        let policy_auto = self.one_of("SPEC_POLICY", &["fixed", "auto"]) == "auto";
        let auto = AutoSpec {
            restart_s: self.float("SPEC_RESTART_S", 0.0, 86_400.0),
            min_dwell_s: self.float("SPEC_MIN_DWELL_S", 0.0, 86_400.0),
            hold_s: self.float("SPEC_HOLD_S", 0.0, 86_400.0),
            margin: self.float("SPEC_MARGIN", 0.0, 1000.0),
            rate_tau_s: self.float("SPEC_RATE_TAU_S", 0.0, 86_400.0),
        };
        Speculation {
            active,
            modes,
            dflash,
            policy_auto,
            auto,
        }
    }

    /// The guides' hard constraints that are not plain ranges.
    fn profile_constraints(&mut self, is_glm: bool, serving: &Serving, speculation: &Speculation) {
        let args = &serving.extra_args;
        let has_pair = |flag: &str, value: &str| {
            args.windows(2).any(|w| w[0] == flag && w[1] == value)
                || args.iter().any(|a| *a == format!("{flag}={value}"))
        };
        if is_glm {
            if serving.kv_cache_dtype.as_deref() != Some("fp8") {
                self.fail(
                    "KV_CACHE_DTYPE",
                    "must be fp8 for glm: its sparse-MLA kernels take only packed fp8_ds_mla",
                );
            }
            if has_pair("--moe-backend", "marlin") {
                self.fail(
                    "EXTRA_ARGS",
                    "must not pass --moe-backend marlin: glm uses EXL3 packed experts",
                );
            }
            if speculation.active == SpecMethod::Dflash && args.iter().any(|a| a.contains("TRITON_ATTN")) {
                self.fail(
                    "EXTRA_ARGS",
                    "must not pin TRITON_ATTN with DFlash2: it makes draft attention causal and acceptance collapses",
                );
            }
        } else {
            if serving.kv_cache_dtype.is_some() {
                self.fail(
                    "KV_CACHE_DTYPE",
                    "must stay empty for deepseek: vLLM picks fp8_ds_mla itself",
                );
            }
            if args
                .iter()
                .any(|a| a == "--kv-cache-dtype" || a.starts_with("--kv-cache-dtype="))
            {
                self.fail(
                    "EXTRA_ARGS",
                    "must not pass --kv-cache-dtype for deepseek: vLLM picks fp8_ds_mla itself",
                );
            }
        }
    }

    fn containers(&mut self) -> Containers {
        let head_name = self.docker_name("CONTAINER_HEAD");
        let worker_name = self.docker_name("CONTAINER_WORKER");
        if head_name == worker_name {
            self.fail("CONTAINER_WORKER", "must differ from CONTAINER_HEAD");
        }
        Containers {
            head_name,
            worker_name,
            gpus_all: self.one_of("RANK_GPUS", &["all", "none"]) == "all",
            memlock_unlimited: self.flag("RANK_MEMLOCK_UNLIMITED"),
            devices: self
                .string("RANK_DEVICES")
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(String::from)
                .collect(),
            oom_score_adj: self.opt_int("OOM_SCORE_ADJ", -1000..=1000),
        }
    }

    fn docker_name(&mut self, name: &str) -> String {
        let v = self.string(name);
        let valid = v.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && v.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !valid {
            self.fail(name, "must be a Docker container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)");
        }
        v
    }

    fn storage(&mut self, is_glm: bool) -> Storage {
        let weight_sync = match self.one_of("WEIGHT_SYNC", &["nfs", "rsync", "zfs", "none"]) {
            "nfs" => WeightSync::Nfs,
            "rsync" => WeightSync::Rsync,
            "zfs" => WeightSync::Zfs,
            _ => WeightSync::None,
        };
        let weights = if is_glm {
            Weights::Glm {
                hf_home: self.non_empty("HF_HOME"),
                worker_hf_home: self.non_empty("WORKER_HF_HOME"),
                model: self.non_empty("MODEL"),
                revision: self.non_empty("MODEL_REVISION"),
                cache_name: self.non_empty("MODEL_CACHE_NAME"),
            }
        } else {
            Weights::DeepSeek {
                model_host: self.non_empty("MODEL_HOST"),
                engram_dir: self.non_empty("ENGRAM_DIR"),
                engram_src: self.non_empty("ENGRAM_SRC"),
                nfs_volume_model: self.non_empty("NFS_VOLUME_MODEL"),
                nfs_volume_engram: self.non_empty("NFS_VOLUME_ENGRAM"),
                worker_model_dir: self.non_empty("WORKER_MODEL_DIR"),
                worker_engram_dir: self.non_empty("WORKER_ENGRAM_DIR"),
                hf_model_repo: self.non_empty("HF_MODEL_REPO"),
                hf_engram_repo: self.non_empty("HF_ENGRAM_REPO"),
            }
        };
        Storage {
            weight_sync,
            cache_root: self.non_empty("CACHE_ROOT"),
            triton_host_cache: self.non_empty("TRITON_HOST_CACHE"),
            tilelang_host_cache: self.non_empty("TILELANG_HOST_CACHE"),
            worker_vllm_cache: self.non_empty("WORKER_VLLM_CACHE"),
            expected_shards: self.int("EXPECTED_SHARDS", 1..=100_000),
            weights,
            auto_download: self.flag("AUTO_DOWNLOAD"),
            force_sync: self.flag("FORCE_SYNC"),
            hf_bin: self.string("HF_BIN"),
        }
    }
}
