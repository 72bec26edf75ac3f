//! The `vllm serve` settings, the speculation modes, and the profiles' hard constraints on them.

use std::path::PathBuf;

use super::Builder;
use crate::config::{AutoSpec, DflashDraft, HostNccl, Serving, Speculation};
use crate::profile::ProfileId;
use crate::spec::{self, SpecMethod};

/// `vllm serve` flags sparkgate derives from its own variables; EXTRA_ARGS may not set them.
const OWNED_FLAGS: [&str; 13] = [
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "-tp",
    "-pp",
    "--host",
    "--port",
    "--served-model-name",
    "--node-rank",
    "--headless",
    "--nnodes",
    "--master-addr",
    "--master-port",
    "--scheduling-policy",
];

impl Builder<'_> {
    pub(super) fn serving(&mut self) -> Serving {
        let max_num_batched_tokens = self.num("MAX_NUM_BATCHED_TOKENS");
        let long_prefill_token_threshold = self.opt_num("LONG_PREFILL_TOKEN_THRESHOLD");
        if let Some(t) = long_prefill_token_threshold {
            self.warn_long_prefill(t, max_num_batched_tokens);
        }
        let tp: u32 = self.num("TP");
        let pp: u32 = self.num("PP");
        let nnodes: u32 = self.num("NNODES");
        if pp == 1 && tp % nnodes.max(1) != 0 {
            self.fail("TP", format!("must be a multiple of NNODES ({nnodes})"));
        } else if (tp * pp) % nnodes.max(1) != 0 {
            self.fail(
                "TP",
                format!("× PP ({}) must be a multiple of NNODES ({nnodes})", tp * pp),
            );
        }
        let extra_args = self.words("EXTRA_ARGS");
        for owned in OWNED_FLAGS {
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
        let host_nccl = self.flag("USE_HOST_NCCL").then(|| HostNccl {
            head_dir: self.text("NCCL_HOST_DIR"),
            worker_dir: self.text("WORKER_NCCL_HOST_DIR"),
            so_name: self.text("NCCL_SO_NAME"),
        });
        Serving {
            served_model_name: self.text("SERVED_MODEL_NAME"),
            image: self.text("IMAGE"),
            tp,
            pp,
            nnodes,
            quantization: self.opt_text("QUANTIZATION").filter(|q| q != "none"),
            max_model_len: self.num("MAX_MODEL_LEN"),
            gpu_mem_util: self.text("GPU_MEM_UTIL"),
            max_num_batched_tokens,
            long_prefill_token_threshold,
            kv_cache_dtype: self.opt_text("KV_CACHE_DTYPE"),
            kv_block_size: self.used("KV_BLOCK_SIZE").then(|| self.num("KV_BLOCK_SIZE")),
            kv_cache_memory_bytes: self
                .used("KV_CACHE_MEMORY_BYTES")
                .then(|| self.opt_num("KV_CACHE_MEMORY_BYTES"))
                .flatten(),
            enforce_eager: self.flag("ENFORCE_EAGER"),
            scheduling_policy: self.choice("SCHEDULING_POLICY"),
            extra_args,
            language_model_only: self.flag("LANGUAGE_MODEL_ONLY"),
            skip_mm_profiling: self.flag("SKIP_MM_PROFILING"),
            limit_mm: self.text("LIMIT_MM"),
            chat_template_host: self.opt_text("CHAT_TEMPLATE_HOST").map(PathBuf::from),
            default_reasoning_effort: self
                .used("GLM53_DEFAULT_REASONING_EFFORT")
                .then(|| self.opt_text("GLM53_DEFAULT_REASONING_EFFORT"))
                .flatten(),
            cg_estimate: self.flag("CG_ESTIMATE"),
            host_nccl,
        }
    }

    /// Launcher guidance, not a vLLM rule: leave room in each step for running decodes.
    fn warn_long_prefill(&mut self, threshold: u32, max_num_batched_tokens: u32) {
        if threshold.saturating_add(256) > max_num_batched_tokens {
            self.warnings.push(format!(
                "LONG_PREFILL_TOKEN_THRESHOLD={threshold} leaves fewer than 256 of \
                 MAX_NUM_BATCHED_TOKENS={max_num_batched_tokens} for decodes; the launchers advise \
                 MAX_NUM_BATCHED_TOKENS - LONG_PREFILL_TOKEN_THRESHOLD >= 256"
            ));
        }
    }

    pub(super) fn speculation(&mut self, serving: &Serving) -> Speculation {
        let defs = spec::mode_defs(self.r.profile);
        let active: SpecMethod = self.choice("SPEC_METHOD");
        let max_num_seqs = self.num("MAX_NUM_SEQS");
        let modes = defs
            .iter()
            .map(|def| {
                let tokens = def.tokens_knob.map_or(0, |knob| self.num(knob));
                let seqs = if def.method == active {
                    max_num_seqs
                } else {
                    def.max_num_seqs
                };
                def.build(tokens, seqs)
            })
            .collect();
        let dflash = self.used("DFLASH_MODEL").then(|| DflashDraft {
            repo: self.text("DFLASH_MODEL"),
            model_dir: self.text("DFLASH_MODEL_DIR"),
            draft_tensor_parallel_size: self.opt_num("DFLASH_DRAFT_TP"),
        });
        if let Some(draft_tp) = dflash.as_ref().and_then(|d| d.draft_tensor_parallel_size) {
            if draft_tp > serving.tp {
                self.fail(
                    "DFLASH_DRAFT_TP",
                    format!("must be an integer between 1 and {} (TP)", serving.tp),
                );
            }
        }
        Speculation {
            active,
            modes,
            dflash,
            policy: self.choice("SPEC_POLICY"),
            auto: AutoSpec {
                restart_s: self.float("SPEC_RESTART_S"),
                min_dwell_s: self.float("SPEC_MIN_DWELL_S"),
                hold_s: self.float("SPEC_HOLD_S"),
                margin: self.float("SPEC_MARGIN"),
                rate_tau_s: self.float("SPEC_RATE_TAU_S"),
            },
        }
    }

    /// The guides' hard constraints that are not a single knob's rule.
    pub(super) fn profile_constraints(&mut self, serving: &Serving, speculation: &Speculation) {
        let args = &serving.extra_args;
        let has_pair = |flag: &str, value: &str| {
            args.windows(2).any(|w| w[0] == flag && w[1] == value)
                || args.iter().any(|a| *a == format!("{flag}={value}"))
        };
        let mut broken: Vec<(&str, &str)> = Vec::new();
        match self.r.profile {
            ProfileId::Glm53Flash => {
                if serving.kv_cache_dtype.as_deref() != Some("fp8") {
                    broken.push((
                        "KV_CACHE_DTYPE",
                        "must be fp8 for glm: its sparse-MLA kernels take only packed fp8_ds_mla",
                    ));
                }
                if has_pair("--moe-backend", "marlin") {
                    broken.push((
                        "EXTRA_ARGS",
                        "must not pass --moe-backend marlin: glm uses EXL3 packed experts",
                    ));
                }
                if speculation.active == SpecMethod::Dflash && args.iter().any(|a| a.contains("TRITON_ATTN")) {
                    broken.push((
                        "EXTRA_ARGS",
                        "must not pin TRITON_ATTN with DFlash2: it makes draft attention causal and acceptance collapses",
                    ));
                }
            }
            ProfileId::DeepSeekV41Flash => {
                if serving.kv_cache_dtype.is_some() {
                    broken.push((
                        "KV_CACHE_DTYPE",
                        "must stay empty for deepseek: vLLM picks fp8_ds_mla itself",
                    ));
                }
                if args
                    .iter()
                    .any(|a| a == "--kv-cache-dtype" || a.starts_with("--kv-cache-dtype="))
                {
                    broken.push((
                        "EXTRA_ARGS",
                        "must not pass --kv-cache-dtype for deepseek: vLLM picks fp8_ds_mla itself",
                    ));
                }
            }
        }
        for (name, rule) in broken {
            self.fail(name, rule);
        }
    }
}
