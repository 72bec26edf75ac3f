//! The table of every configuration variable: name, group, per-profile default, documentation.
//!
//! The reference launchers' variable names are kept so a seed `.env` is a drop-in. Defaults are
//! the launcher's effective value (its script default, or its `.env.example` value where the
//! launcher copies that file into place on first start), except where a seed guide states a newer
//! value; those choices are marked "guide:" in the documentation string and listed in docs/configuration.md.

use Def::{Derived as D, Unused as NA, Value as V};

use crate::config::{
    Gpus, GroupRouting, ImageShip, KnownHosts, LogFormat, QueuePolicy, Runtime, SchedulingPolicy, SpecPolicy,
    WeightSync,
};
use crate::profile::ProfileId;
use crate::rule::Rule::{self, *};
use crate::secret::REDACTED;
use crate::section::Group::{self, *};
use crate::swap::SwapPolicy;
use crate::tenancy::{FairCharge, OtlpProtocol, QuotaMode};

/// A knob's default in one profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Def {
    /// The profile does not use this variable.
    Unused,
    /// A literal; `${NAME}` refers to another variable's resolved value (or HOME / USER).
    Value(&'static str),
    /// Computed by the resolver from other values; the text says how.
    Derived(&'static str),
}

/// One configuration variable.
#[derive(Debug)]
pub(crate) struct Knob {
    pub(crate) name: &'static str,
    pub(crate) group: Group,
    /// Older names accepted for the same variable (the launchers' model-prefixed spellings).
    pub(crate) aliases: &'static [&'static str],
    pub(crate) deepseek: Def,
    pub(crate) glm: Def,
    /// Held as a [`crate::Secret`]; never printed.
    pub(crate) secret: bool,
    /// Passed verbatim into both rank containers' environment.
    pub(crate) rank_env: bool,
    /// What a value must be; validation and the reference's "Accepts" column read it.
    pub(crate) rule: Rule,
    /// GLM's own rule, where it differs.
    pub(crate) glm_rule: Option<Rule>,
    pub(crate) doc: &'static str,
}

/// A knob with one default for both profiles (`.glm(…)` gives GLM its own where it differs).
const fn k(name: &'static str, group: Group, default: Def, doc: &'static str) -> Knob {
    Knob {
        name,
        group,
        aliases: &[],
        deepseek: default,
        glm: default,
        secret: false,
        rank_env: false,
        rule: Text,
        glm_rule: None,
        doc,
    }
}

/// A knob only the DeepSeek profile uses.
const fn ds(name: &'static str, group: Group, default: Def, doc: &'static str) -> Knob {
    k(name, group, default, doc).glm(NA)
}

/// A knob only the GLM profile uses.
const fn glm(name: &'static str, group: Group, default: Def, doc: &'static str) -> Knob {
    k(name, group, NA, doc).glm(default)
}

/// A rank-environment variable with the same default in both profiles.
const fn env(name: &'static str, value: &'static str, doc: &'static str) -> Knob {
    k(name, Group::Runtime, V(value), doc).rank_env()
}

impl Knob {
    /// GLM's own default.
    const fn glm(mut self, default: Def) -> Self {
        self.glm = default;
        self
    }
    /// What the knob accepts (default: any text).
    const fn rule(mut self, rule: Rule) -> Self {
        self.rule = rule;
        self
    }
    /// GLM's own rule.
    const fn glm_rule(mut self, rule: Rule) -> Self {
        self.glm_rule = Some(rule);
        self
    }
    /// The rule the knob follows in `profile`.
    pub(crate) fn rule_for(&self, profile: ProfileId) -> Rule {
        match (profile, self.glm_rule) {
            (ProfileId::Glm53Flash, Some(rule)) => rule,
            _ => self.rule,
        }
    }
    const fn rank_env(mut self) -> Self {
        self.rank_env = true;
        self
    }
    const fn secret(mut self) -> Self {
        self.secret = true;
        self
    }
    const fn aliases(mut self, aliases: &'static [&'static str]) -> Self {
        self.aliases = aliases;
        self
    }
}

/// Variable name prefixes whose unknown members still pass into the rank containers, as the
/// launchers passed every model-specific knob through.
pub(crate) const PASSTHROUGH_PREFIXES: [&str; 4] = ["DSV41_", "GLM53_", "EXL3_", "NCCL_"];

/// Per-rank variables the plan derives from the CX7 pins; a generic value in the environment
/// does not override them (the launchers' `.env.example` says so).
pub(crate) const PER_RANK_ENV: [&str; 5] = [
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "VLLM_HOST_IP",
];

pub(crate) static KNOBS: &[Knob] = &[
    // === General ===
    k("PROFILE", General, V("deepseek-v4.1-flash"), "Deployment profile; selects every other default.").rule(OneOf(ProfileId::WORDS)),
    k("DEPLOY_DIR", General, D("the env file's directory, else the working directory"), "Directory relative paths and `files/` resolve against (a launcher checkout works as-is)."),
    // === Nodes ===
    k("HEAD_IP", Nodes, V("10.0.0.1"), "Head node address (rank 0, master address).").rule(Ip),
    k("WORKERS", Nodes, V(""), "Every worker, in rank order (rank 1 first), for groups over more than two nodes: `[user@]address[:ssh-port]` each, the user defaulting to WORKER_USER and the port to WORKER_SSH_PORT. The other WORKER_* settings (key, Docker socket, CX7 pins, directories) apply to every worker; directories under WORKER_HOME follow each worker's home. Empty: the one worker of WORKER_IP (when NNODES is 2).").rule(Workers),
    k("WORKER_IP", Nodes, V("10.0.0.2"), "Worker node address (rank 1) when WORKERS is empty.").rule(Ip),
    k("WORKER_USER", Nodes, V("${USER}"), "SSH user on the worker.").rule(NonEmpty),
    k("WORKER_HOME", Nodes, D("$HOME when WORKER_USER is the local user, else /home/$WORKER_USER"), "Home directory of WORKER_USER on the worker.").rule(NonEmpty),
    k("WORKER_SSH", Nodes, V("${WORKER_USER}@${WORKER_IP}"), "SSH destination of the worker when WORKERS is empty.").rule(NonEmpty),
    k("WORKER_SSH_PORT", Nodes, V("22"), "SSH port of the worker.").rule(Int(1, 65535)),
    k("WORKER_SSH_KEY", Nodes, V(""), "Private key for the worker (empty: ssh's defaults and agent)."),
    k("SSH_KNOWN_HOSTS", Nodes, V("accept-new"), "Host key policy for the worker's SSH (`accept`: any key).").rule(OneOf(KnownHosts::WORDS)),
    k("SSH_KNOWN_HOSTS_FILE", Nodes, V(""), "known_hosts file for the worker (empty: ~/.ssh/known_hosts)."),
    k("SSH_CONNECT_TIMEOUT", Nodes, V("10"), "Seconds to wait for the worker's SSH.").rule(Int(1, 604_800)),
    k("SSH_CONTROL_DIR", Nodes, V("/tmp/sparkgate-ssh"), "Short directory for the SSH control socket (unix paths are limited to 108 bytes).").rule(NonEmpty),
    k("WORKER_DOCKER_SOCKET", Nodes, V("/var/run/docker.sock"), "The worker's Docker socket, forwarded over SSH.").rule(NonEmpty),
    k("HEAD_CX7_IF", Nodes, V("enp1s0f1np1"), "Head CX7 interface; NCCL cannot use the 10.0.0.x aliases.").rule(NonEmpty),
    k("WORKER_CX7_IF", Nodes, V("enp1s0f0np0"), "Worker CX7 interface.").rule(NonEmpty),
    k("HEAD_CX7_IB", Nodes, V("rocep1s0f1"), "Head RoCE HCA (NCCL_IB_HCA of rank 0).").rule(NonEmpty),
    k("WORKER_CX7_IB", Nodes, V("rocep1s0f0"), "Worker RoCE HCA (NCCL_IB_HCA of every worker rank).").rule(NonEmpty),
    k("NCCL_IB_GID_INDEX", Nodes, V("3"), "RoCEv2 GID index; default of HEAD_GID and WORKER_GID.").rule(Int(0, 255)),
    k("HEAD_GID", Nodes, V("${NCCL_IB_GID_INDEX}"), "GID index of rank 0's HCA.").rule(Int(0, 255)),
    k("WORKER_GID", Nodes, V("${NCCL_IB_GID_INDEX}"), "GID index of every worker rank's HCA.").rule(Int(0, 255)),
    // === NCCL ===
    k("NCCL_IB_DISABLE", Nccl, V("0"), "").rank_env(),
    k("NCCL_IB_ROCE_VERSION_NUM", Nccl, V("2"), "").rank_env(),
    k("NCCL_NET", Nccl, V("IB"), "").rank_env(),
    k("NCCL_NET_PLUGIN", Nccl, V("none"), "").rank_env(),
    k("NCCL_NVLS_ENABLE", Nccl, V("0"), "").rank_env(),
    k("NCCL_CUMEM_ENABLE", Nccl, V("0"), "").rank_env(),
    k("NCCL_IB_MERGE_NICS", Nccl, V("0"), "").rank_env(),
    k("NCCL_CROSS_NIC", Nccl, V("0"), "").rank_env(),
    k("NCCL_IGNORE_CPU_AFFINITY", Nccl, V("1"), "").rank_env(),
    k("NCCL_DEBUG", Nccl, V("WARN"), "").rank_env(),
    ds("NCCL_DEBUG_SUBSYS", Nccl, V(""), "").rank_env(),
    ds("NCCL_BUFFSIZE", Nccl, V("1048576"), "").rank_env(),
    ds("NCCL_LL128_BUFFSIZE", Nccl, V("262144"), "").rank_env(),
    ds("NCCL_PROTO", Nccl, V("^LL128"), "").rank_env(),
    ds("NCCL_MAX_NCHANNELS", Nccl, V("8"), "Shrinks NCCL pinned buffers on UMA (4.7 GiB to ~0.14 GiB).").rank_env(),
    k("USE_HOST_NCCL", Nccl, V("0"), "1: mount NCCL_HOST_DIR at /nccl and LD_PRELOAD the host NCCL.").rule(Flag),
    k("NCCL_HOST_DIR", Nccl, V("${HOME}/nccl-2.30.7"), "Host NCCL build on the head (USE_HOST_NCCL=1)."),
    k("WORKER_NCCL_HOST_DIR", Nccl, V("${WORKER_HOME}/nccl-2.30.7"), "Host NCCL build on the worker."),
    k("NCCL_SO_NAME", Nccl, V("libnccl.so.2.30.7"), "Library preloaded from /nccl."),
    // === Serving ===
    k("IMAGE", Serving, V("ghcr.io/miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks:2.9bpw"), "Rank container image.").glm(V("ghcr.io/miaai-lab/glm-5.3-flash-2x-dgx-sparks:exl3")).rule(NonEmpty),
    k("SERVED_MODEL_NAME", Serving, V("DeepSeek-v4.1-Flash-EXL3"), "Model id clients send and `/v1/models` lists.").glm(V("GLM-5.3-Flash-EXL3")).rule(Word),
    k("PORT", Serving, V("8888"), "Public port; the gateway owns it (0: any free port, logged).").rule(Int(0, 65535)),
    k("VLLM_PORT", Serving, V("18888"), "Rank 0's own HTTP port, bound to 127.0.0.1 (sparkgate addition: the launchers let vLLM own PORT).").rule(Int(1, 65535)),
    k("MASTER_PORT", Serving, V("29521"), "torch.distributed rendezvous port on HEAD_IP.").rule(Int(1, 65535)),
    k("TP", Serving, V("${NNODES}"), "Tensor-parallel size; TP × PP must be a multiple of NNODES (one GPU per Spark: TP × PP = NNODES).").rule(Int(1, 64)),
    k("PP", Serving, V("1"), "Pipeline-parallel size (`--pipeline-parallel-size`, passed when above 1).").rule(Int(1, 64)),
    k("NNODES", Serving, D("1 + the number of WORKERS; without WORKERS 2 (the worker of WORKER_IP)"), "Number of nodes, one rank each: 1 serves on the head alone; more than 2 needs WORKERS.").rule(Int(1, 64)),
    k("QUANTIZATION", Serving, V("exl3"), "`--quantization`; `none` omits the flag."),
    k("MAX_MODEL_LEN", Serving, V("600000"), "Context limit. glm guide: 900000 (launcher 1000000).").glm(V("900000")).rule(Int(1, 1_048_576)).glm_rule(Int(1, 1_000_000)),
    k("GPU_MEM_UTIL", Serving, V("0.88"), "`--gpu-memory-utilization`.").glm(V("0.87")).rule(Float(0.0, 1.0)),
    k("MAX_NUM_SEQS", Serving, D("the active speculation mode's limit: deepseek dspark 2, none 4; glm 4"), "Concurrent sequences; the gateway admits this many generations. deepseek guide: 2 with dspark.").rule(Int(1, 65_536)),
    k("SCHEDULING_POLICY", Serving, V("fcfs"), "`priority`: vLLM runs `--scheduling-policy priority` and the gateway's queue admits by a request's priority first (lower sooner; the body's `priority` or the `X-Vllm-Priority` header, which wins, as vLLM reads them), each priority by the fair queue (a header that is not an integer is ignored, as vLLM does). `fcfs`: priorities are ignored, as vLLM does.").rule(OneOf(SchedulingPolicy::WORDS)),
    k("MAX_NUM_BATCHED_TOKENS", Serving, V("1024"), "Prefill chunk. guide (both): 1024 (launchers 1536 / 2048); glm must stay below 8192 (indexer smem).").rule(Int(1, 8_388_608)).glm_rule(Because(&Int(1, 8191), "glm guide: 8192 oversubscribes the indexer's shared memory")),
    k("LONG_PREFILL_TOKEN_THRESHOLD", Serving, V(""), "Empty = off; keep MAX_NUM_BATCHED_TOKENS - this >= 256 (warned otherwise).").rule(Optional(&Int(1, 8_388_608))),
    k("KV_CACHE_DTYPE", Serving, V(""), "deepseek: keep empty (vLLM picks fp8_ds_mla); glm: must be fp8.").glm(V("fp8")),
    ds("KV_BLOCK_SIZE", Serving, V("64"), "`--block-size`.").rule(Int(1, 1024)),
    ds("KV_CACHE_MEMORY_BYTES", Serving, V("2684354560"), "KV pool bytes; empty omits the flag. deepseek guide: 2.5 GiB.").rule(Optional(&Int(1, i64::MAX))),
    k("ENFORCE_EAGER", Serving, V("0"), "1: `--enforce-eager` (no CUDA graphs, no capture sizes).").rule(Flag),
    k("EXTRA_ARGS", Serving, V(""), "Extra `vllm serve` arguments (shell words), appended last.").rule(ShellWords),
    k("LANGUAGE_MODEL_ONLY", Serving, V("1"), "1: `--language-model-only`; 0: multimodal flags.").glm(V("0")).rule(Flag),
    k("SKIP_MM_PROFILING", Serving, V("1"), "1: `--skip-mm-profiling` when multimodal.").rule(Flag),
    k("LIMIT_MM", Serving, V(r#"{"image":100}"#), "`--limit-mm-per-prompt` JSON when multimodal.").glm(V(r#"{"image":4,"video":1}"#)).rule(JsonObject),
    k("CHAT_TEMPLATE_HOST", Serving, V("${DEPLOY_DIR}/files/chat_template.jinja"), "Chat template on the head, mounted read-only for both ranks; empty: the model's own template."),
    glm("GLM53_DEFAULT_REASONING_EFFORT", Serving, V(""), "`--default-chat-template-kwargs` effort on both ranks (the template renders anything else as max).").rule(OneOf(&["", "low", "high", "max"])),
    // === Speculation ===
    k("SPEC_METHOD", Speculation, V("dspark"), "The speculation mode the group starts in.").glm(V("dflash")).rule(SpecMode),
    ds("DSPARK_TOKENS", Speculation, V("3"), "DSpark draft tokens (the drafter's block size is 5). guide: 3 (launcher script 5).").rule(Int(1, 5)),
    glm("DFLASH_TOKENS", Speculation, V("7"), "DFlash2 draft tokens.").rule(Int(1, 16)),
    glm("DFLASH_MODEL", Speculation, V("incoai/GLM-5.3-Flash-DFlash2"), "DFlash2 draft model repository.").rule(NonEmpty),
    glm("DFLASH_REVISION", Speculation, V("main"), "Snapshot directory of the draft model in the HF cache."),
    glm("DFLASH_MODEL_DIR", Speculation, D("the draft model's snapshot in the container's HF cache"), "In-container draft model path.").rule(NonEmpty),
    glm("DFLASH_DRAFT_TP", Speculation, V("1"), "`draft_tensor_parallel_size`; empty inherits TP. guide: 1 (launcher 2).").rule(Optional(&Int(1, 64))),
    glm("MTP_TOKENS", Speculation, V("2"), "MTP draft tokens; 0 runs without a speculative config.").rule(Int(0, 8)),
    k("SPEC_POLICY", Speculation, V("fixed"), "fixed: keep SPEC_METHOD; auto: restart into the mode whose throughput table serves the demand width best, when the expected gain outweighs the restart (see docs/configuration.md).").rule(OneOf(SpecPolicy::WORDS)),
    k("SPEC_RESTART_S", Speculation, V("300"), "Seconds a mode switch costs (drain + reload + ready) as the auto policy prices it.").rule(Float(0.0, 86_400.0)),
    k("SPEC_MIN_DWELL_S", Speculation, V("600"), "Minimum seconds between two automatic switches.").rule(Float(0.0, 86_400.0)),
    k("SPEC_HOLD_S", Speculation, V("60"), "Seconds another mode must stay best before auto considers switching to it.").rule(Float(0.0, 86_400.0)),
    k("SPEC_MARGIN", Speculation, V("1.0"), "How many times the restart's cost the expected gain must reach (1 = break-even under the expected duration).").rule(Float(0.0, 1000.0)),
    k("SPEC_RATE_TAU_S", Speculation, V("300"), "Time constant (s) of the per-mode rate averages over sampled demand width.").rule(Float(0.0, 86_400.0)),
    // === Runtime (rank environment) ===
    env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", ""),
    env("TORCH_CUDA_ARCH_LIST", "12.1a", ""),
    env("FLASHINFER_CUDA_ARCH_LIST", "12.1a", ""),
    env("FLASHINFER_DISABLE_VERSION_CHECK", "1", ""),
    env("HF_HUB_OFFLINE", "1", ""),
    env("TRANSFORMERS_OFFLINE", "1", ""),
    env("VLLM_NO_USAGE_STATS", "1", "py-cpuinfo JSON-parses empty output on Grace/aarch64."),
    env("DO_NOT_TRACK", "1", ""),
    env("VLLM_CACHE_ROOT", "/root/.cache/vllm", ""),
    env("TRITON_CACHE_DIR", "/root/.triton/cache", ""),
    env("TILELANG_CACHE_DIR", "/root/.tilelang/cache", ""),
    env("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800", "How long rank 0 waits on a lost rank before failing."),
    k("CG_ESTIMATE", Runtime, V("1"), "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS in the ranks.").rule(Flag),
    ds("VLLM_DISABLE_SHARED_EXPERTS_STREAM", Runtime, V("1"), "").rank_env(),
    ds("CUDA_LAUNCH_BLOCKING", Runtime, V("0"), "").rank_env(),
    ds("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", Runtime, V("256"), "").rank_env(),
    k("EXL3_FUSED_MOE", Runtime, V("1"), "").rank_env(),
    k("EXL3_MOE_ROW_TILE", Runtime, V("0"), "").rank_env(),
    k("EXL3_TEMP_ROWS_FUSED", Runtime, V("16"), "").glm(V("128")).rank_env(),
    ds("EXL3_FAT_GROUPED", Runtime, V("1"), "").rank_env(),
    ds("EXL3_FAT_KERNEL", Runtime, V("0"), "").rank_env(),
    ds("EXL3_FAT_SORTED", Runtime, V("0"), "").rank_env(),
    ds("EXL3_FAT_BATCHED", Runtime, V("0"), "").rank_env(),
    ds("DSV41_EXL3_SERIAL_STREAMS", Runtime, V("1"), "").rank_env(),
    ds("DSV41_ENGRAM_DISABLE", Runtime, V("0"), "").rank_env(),
    ds("DSV41_INDEXER_PREFILL_FACTOR", Runtime, V("1"), "").rank_env(),
    ds("DSV41_PREFILL_EMPTY_CACHE_TOKENS", Runtime, V("8192"), "").rank_env(),
    ds("DSV41_PREFILL_EMPTY_CACHE_MEMAVAIL_GIB", Runtime, V("2.5"), "").rank_env(),
    ds("DSV41_PREFILL_END_EMPTY_CACHE", Runtime, V("0"), "").rank_env(),
    ds("DSV41_CACHE_GIB", Runtime, V("0"), "").rank_env(),
    ds("DSV41_RESIDENT_SCALES", Runtime, V("0"), "").rank_env(),
    ds("DSV41_IO_THREADS", Runtime, V("32"), "").rank_env(),
    ds("DSV41_CACHE_WAYS", Runtime, V("4"), "").rank_env(),
    ds("DSV41_STATS_SECONDS", Runtime, V("60"), "").rank_env(),
    ds("DSV41_SKIP_MIXED_WARMUP", Runtime, V("0"), "").rank_env(),
    ds("DSV41_DROP_PAGE_CACHE", Runtime, V("1"), "Drop the page cache after load (needs root).").rank_env().rule(Flag),
    ds("DSV41_EXL3_K_MAP", Runtime, V("/opt/dsv41/exl3_k_map.json"), "").rank_env(),
    ds("DSV41_SOURCE", Runtime, V("/engram-src"), "").rank_env(),
    k("GLM53_SUPPRESS_STOPS_IN_REASONING", Runtime, V("1"), "").rank_env(),
    k("GLM53_MIXED_PREFILL_CHUNK", Runtime, V("0"), "0 = stock chunked prefill (the multi-agent setting).").rank_env(),
    k("GLM53_INDEXER_WORKSPACE", Runtime, V("stock"), "").rank_env().rule(OneOf(&["stock", "rightsize"])),
    k("GLM53_SPINWAIT_MS", Runtime, V("stock"), "").rank_env().rule(WordOrInt("stock", 1, 1000)),
    ds("GLM53_DENSE_FP8", Runtime, V("off"), "").rank_env(),
    // === Containers ===
    k("CONTAINER_HEAD", Containers, V("dsv41-exl3-head"), "Rank 0 container name.").glm(V("glm53-exl3-head")).rule(DockerName),
    k("CONTAINER_WORKER", Containers, V("dsv41-exl3-worker"), "Rank 1's container name; rank r > 1 runs as `<name>-r`.").glm(V("glm53-exl3-worker")).rule(DockerName),
    k("RANK_GPUS", Containers, V("all"), "`all` requests every GPU (`--gpus all`); `none` for machines without GPUs.").rule(OneOf(Gpus::WORDS)),
    k("RANK_MEMLOCK_UNLIMITED", Containers, V("1"), "1: `--ulimit memlock=-1` (needs CAP_SYS_RESOURCE on the host).").rule(Flag),
    k("RANK_DEVICES", Containers, V("/dev/infiniband"), "Comma-separated host devices passed to the ranks."),
    k("RANK_ENV", Containers, V(""), "Extra NAME=value pairs (comma-separated) for both ranks' environment.").rule(EnvPairs),
    k("OOM_SCORE_ADJ", Containers, V("1000"), "`--oom-score-adj` of the ranks; empty: unset.").glm(V("")).rule(Optional(&Int(-1000, 1000))),
    // === Storage ===
    ds("MODEL_HOST", Storage, V("${DEPLOY_DIR}/model"), "EXL3 weights on the head, mounted at /model.").rule(NonEmpty),
    ds("ENGRAM_DIR", Storage, V("${DEPLOY_DIR}/engram-src"), "Original Engram shards (47, 48 + index) on the head.").rule(NonEmpty),
    k("CACHE_ROOT", Storage, V("${HOME}/.cache/vllm-dsv41-flash-exl3"), "vLLM/Triton/TileLang caches on the head.").glm(V("${HOME}/.cache/vllm-glm53-flash")).rule(NonEmpty),
    ds("ENGRAM_SRC", Storage, V("${CACHE_ROOT}/engram-src"), "Slim Engram directory mounted at /engram-src.").rule(NonEmpty),
    k("TRITON_HOST_CACHE", Storage, V("${CACHE_ROOT}/triton"), "").rule(NonEmpty),
    k("TILELANG_HOST_CACHE", Storage, V("${CACHE_ROOT}/tilelang"), "").rule(NonEmpty),
    k("WORKER_VLLM_CACHE", Storage, V("${WORKER_HOME}/.cache/vllm-dsv41-flash-exl3"), "Caches on the worker.").glm(V("${WORKER_HOME}/.cache/vllm-glm53-flash")).rule(NonEmpty),
    k("WEIGHT_SYNC", Storage, V("nfs"), "How the worker gets the weights.").glm(V("rsync")).rule(OneOf(WeightSync::WORDS)),
    ds("NFS_VOLUME_MODEL", Storage, V("dsv41-exl3-weights"), "Worker Docker volume for /model (WEIGHT_SYNC=nfs).").rule(NonEmpty),
    ds("NFS_VOLUME_ENGRAM", Storage, V("dsv41-exl3-engram"), "Worker Docker volume for /engram-src (WEIGHT_SYNC=nfs).").rule(NonEmpty),
    ds("WORKER_MODEL_DIR", Storage, V("${WORKER_HOME}/.cache/dsv41-flash-exl3/model"), "Worker weights (WEIGHT_SYNC other than nfs).").rule(NonEmpty),
    ds("WORKER_ENGRAM_DIR", Storage, V("${WORKER_HOME}/.cache/dsv41-flash-exl3/engram-src"), "").rule(NonEmpty),
    glm("HF_HOME", Storage, V("${HOME}/.cache/huggingface"), "HF cache on the head, mounted at /root/.cache/huggingface.").rule(NonEmpty),
    glm("WORKER_HF_HOME", Storage, V("${WORKER_HOME}/.cache/huggingface"), "HF cache on the worker.").rule(NonEmpty),
    ds("HF_MODEL_REPO", Storage, V("Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw"), "Weights repository.").rule(NonEmpty),
    ds("HF_ENGRAM_REPO", Storage, V("deepseek-ai/DeepSeek-V4.1-Flash"), "Engram shards repository.").rule(NonEmpty),
    glm("MODEL", Storage, V("Mia-AiLab/GLM-5.3-Flash-EXL3-TR3-4bpw"), "Weights repository.").rule(NonEmpty),
    glm("MODEL_REVISION", Storage, V("25a44fdbf16862a46b7cc9921142c6c81350af2f"), "Pinned weights revision.").rule(NonEmpty),
    glm("MODEL_CACHE_NAME", Storage, D("models--<org>--<name> of MODEL"), "HF cache directory name of MODEL.").rule(NonEmpty),
    k("FORCE_SYNC", Storage, V("0"), "1: `sparkgate sync` copies even when the worker's marker says its copy is current.").rule(Flag),
    k("AUTO_DOWNLOAD", Storage, V("1"), "1: `sparkgate download` fetches missing weights; 0: it only reports what is missing.").rule(Flag),
    k("HF_BIN", Storage, V(""), "Hugging Face CLI to download with; empty: `hf` or `huggingface-cli` on PATH, ~/.local/bin, the guides' venvs, else `python3 -m huggingface_hub`."),
    k("EXPECTED_SHARDS", Storage, V("39"), "Weight shards a complete download has.").glm(V("120")).rule(Int(1, 100_000)),
    // === Preparation ===
    k("PULL", Preparation, V("0"), "1: pull IMAGE from its registry even when the head has it.").rule(Flag),
    k("BUILD", Preparation, V("0"), "1: build IMAGE from BUILD_CONTEXT instead of pulling; rebuilt only when the recipe stamp differs.").rule(Flag),
    k("GHCR_REGISTRY", Preparation, V("ghcr.io"), "The registry host GHCR_USER/GHCR_TOKEN are sent to when pulling (IMAGE's registry must be this host).").rule(NonEmpty),
    k("SKIP_PULL", Preparation, V("0"), "1: never pull (a missing image is built, or the start stops).").rule(Flag),
    k("SKIP_BUILD", Preparation, V("0"), "1: never build.").rule(Flag),
    k("SKIP_SHIP", Preparation, V("0"), "1: never ship the image to the worker (a missing image there stops the start).").rule(Flag),
    k("BUILD_CONTEXT", Preparation, V("${DEPLOY_DIR}"), "Build context directory (BUILD=1); the recipe stamp hashes every file in it.").rule(NonEmpty),
    k("DOCKERFILE", Preparation, V("Dockerfile"), "Dockerfile inside BUILD_CONTEXT.").rule(NonEmpty),
    k("IMAGE_SHIP", Preparation, V("auto"), "How a worker that lacks the image gets it: stream (head export piped into the worker daemon, no scratch space, restarts from zero if cut), staged (tar on the head, resumable rsync, docker load; needs tar×2 + 5 GiB free on the worker) or auto (staged, stream when the worker lacks the space).").rule(OneOf(ImageShip::WORDS)),
    k("IMAGE_SHIP_DIR", Preparation, V("${CACHE_ROOT}/image-ship"), "Where staged shipping writes the image tar on the head.").rule(NonEmpty),
    k("WORKER_IMAGE_SHIP_DIR", Preparation, V("/tmp"), "Where staged shipping puts the tar on the worker (resumes from what is there).").rule(AbsolutePath),
    k("IMAGE_SHIP_KEEP", Preparation, V("0"), "1: keep the staged tars after loading.").rule(Flag),
    k("IMAGE_SHIP_BWLIMIT", Preparation, V("0"), "Staged transfer rate limit in KiB/s (rsync --bwlimit); 0: unlimited.").rule(Int(0, 100_000_000)),
    k("SKIP_DOWNLOAD", Preparation, V("0"), "1: `serve` neither checks nor fetches the head's weights before the first start.").rule(Flag),
    k("SKIP_SYNC", Preparation, V("0"), "1: `serve` does not sync the weights to the worker (WEIGHT_SYNC) before the first start.").rule(Flag),
    ds("NFS_SERVER_IP", Preparation, V(""), "WEIGHT_SYNC=nfs: the head address the worker mounts from; empty: HEAD_IP.").rule(Optional(&Ip)),
    ds("NFS_EXPORT_MODEL", Preparation, V("dsv41-exl3"), "NFSv4 export name of MODEL_HOST.").rule(NonEmpty),
    ds("NFS_EXPORT_ENGRAM", Preparation, V("dsv41-engram"), "NFSv4 export name of ENGRAM_SRC.").rule(NonEmpty),
    ds("NFS_CLIENTS", Preparation, V(""), "Export ACL; empty: WORKER_IP."),
    ds("ZFS_HEAD_MODEL_DS", Preparation, V("models/dsv41-exl3"), "WEIGHT_SYNC=zfs: the head's dataset of the weights (commands are printed, not run).").rule(NonEmpty),
    ds("ZFS_WORKER_MODEL_DS", Preparation, V("models/dsv41-exl3"), "WEIGHT_SYNC=zfs: the worker's dataset.").rule(NonEmpty),
    ds("HEAD_PACKED_DIR", Preparation, V("${HOME}/dsv41-engram"), "Packed Engram files on the head (`sparkgate pack`), mounted at /engram-packed when present.").rule(NonEmpty),
    ds("WORKER_PACKED_DIR", Preparation, V("${WORKER_HOME}/dsv41-engram"), "Packed Engram files on the worker.").rule(NonEmpty),
    ds("PACK_CMD", Preparation, V("python3 /opt/dsv41/pack_engram.py"), "The image's Engram packer; `sparkgate pack` appends --model /models --rank R --tp TP --out /engram.").rule(Command),
    // === Supervision ===
    k("READY_TIMEOUT", Supervision, V("1500"), "Seconds rank 0 may take to become ready (also VLLM_ENGINE_READY_TIMEOUT_S).").glm(V("3600")).rule(Int(1, 604_800)),
    k("SELF_CHECK_CMD", Supervision, V("bash -c \"python3 /opt/dsv41/test_exl3_overlay.py && python3 /opt/dsv41/test_engram_dequant.py\""), "Command run in a throwaway container of IMAGE on the head before the first start (RUNTIME=docker; the guides' GPU/overlay self-check, with EXL3_SELFCHECK_GPU=1); its output goes to LOG_DIR/overlay-verify.log and a failure stops the start. Empty: none.").glm(V("python3 /opt/glm53/test_exl3_overlay.py")).rule(Optional(&Command)),
    k("SKIP_OVERLAY_VERIFY", Supervision, V("0"), "1: skip SELF_CHECK_CMD.").rule(Flag),
    k("BOOT_SHAPE_WARMUP", Supervision, V("1"), "1: after ready and before admission opens, warm-up requests at every concurrency 1..MAX_NUM_SEQS with the mode's draft length (the guides' boot-shape warm-up; failures only warn).").rule(Flag),
    k("READY_GENERATE_PROBE", Supervision, V("1"), "1: rank 0 is ready only once a one-token completion succeeds (after /health and /v1/models), which proves the whole group can generate.").rule(Flag),
    k("HANG_SECONDS", Supervision, V("420"), "Seconds without a rank-0 log line (shm_broadcast lines excluded) before a start counts as hung.")
        .aliases(&["DSV41_HANG_SECONDS"]).rule(Int(1, 604_800)),
    k("RUNTIME", Supervision, V("docker"), "How ranks run: docker (containers) or process (the plan's argv as child processes, e.g. a virtualenv vLLM or the demo).").rule(OneOf(Runtime::WORDS)),
    k("DOCKER_SOCKET", Supervision, V("/var/run/docker.sock"), "The head's Docker daemon socket (RUNTIME=docker).").rule(NonEmpty),
    k("VLLM_BIN", Supervision, V("vllm"), "The vllm executable for RUNTIME=process (on the worker too, when it is reached over SSH).").rule(NonEmpty),
    k("LOG_DIR", Supervision, V("${DEPLOY_DIR}/logs"), "Where rank logs and diagnostics are written, per epoch.").rule(NonEmpty),
    k("RESTART_BACKOFF_INITIAL", Supervision, V("10"), "Seconds before the first group restart; doubles per failure.").rule(Float(0.0, 86_400.0)),
    k("RESTART_BACKOFF_MAX", Supervision, V("300"), "Upper bound of the restart delay, seconds.").rule(Float(0.0, 86_400.0)),
    k("RESTART_HEALTHY_RESET", Supervision, V("600"), "Seconds of health after which the backoff and budget reset.").rule(Float(0.0, 86_400.0)),
    k("RESTART_BUDGET", Supervision, V("5"), "Failed starts or crashes in a row before the state is Failed.").rule(Int(1, 1000)),
    k("STALL_TIMEOUT", Supervision, V("30"), "Seconds with requests running or waiting and no engine step (rank 0's vllm:iteration_tokens_total; prefill chunks count) before the group counts as hung and is restarted. Long enough for a JIT compile mid-serve.").rule(Float(1.0, 86_400.0)),
    k("PROGRESS_TIMEOUT", Supervision, V("180"), "Backstop: seconds without a generated token while requests run before rank 0 counts as hung.").rule(Float(0.0, 86_400.0)),
    k("STOP_RANKS_ON_EXIT", Supervision, V("0"), "1: stop the rank containers when the gateway exits; 0: leave them for the next gateway to adopt.").rule(Flag),
    k("MEM_GUARD", Supervision, V("0"), "1: kill a node's rank when MemAvailable stays under MEM_GUARD_GIB.").aliases(&["DSV41_MEM_GUARD"]).rule(Flag),
    k("MEM_GUARD_GIB", Supervision, V("1.5"), "The line under which a node's MemAvailable must not go: admission holds prefills that would cross it (PREFILL_BYTES_PER_TOKEN), memguard (MEM_GUARD=1) restarts the group when it is crossed.").aliases(&["DSV41_MEM_GUARD_GIB"]).rule(Float(0.0, 1024.0)),
    k("WEIGHTS_GIB_PER_RANK", Supervision, V("99.5"), "Weights each rank loads (GiB); with BOOT_MARGIN_GIB, what MemAvailable must show before a start. Empty: no check.").glm(V("")).rule(Optional(&Float(0.0, 4096.0))),
    k("MEMINFO_PATH", Supervision, V("/proc/meminfo"), "Where MemAvailable is read (memguard, preflight).").rule(NonEmpty),
    k("NODE_ROOT", Supervision, V("/"), "Where sparkgate reads each node's /proc and /sys and looks for its commands first (in bin/) — the doctor and the GPU watch; `{node}` is replaced by the node's name (head, worker). `/` on a real node.").rule(NonEmpty),
    k("DOCTOR_VERSIONS_CMD", Supervision, V("python3 -c \"import vllm, torch; print('vllm=' + vllm.__version__, 'torch=' + torch.__version__, 'nccl=' + '.'.join(map(str, torch.cuda.nccl.version())), 'cuda=' + str(torch.version.cuda))\""), "Command `sparkgate doctor` runs in a throwaway container of IMAGE on every node; its last line with `nccl=` (vLLM, torch, NCCL and CUDA versions) must be the same everywhere.").rule(Command),
    k("DOCTOR_MAX_SKEW", Supervision, V("0.5"), "Seconds of clock skew between the head and a worker `sparkgate doctor` accepts (beyond the SSH round trip's bound).").rule(Float(0.0, 3_600.0)),
    k("BOOT_MARGIN_GIB", Supervision, V("12"), "Free memory beyond the weights each node needs to boot; empty: no check.").glm(V(""))
        .aliases(&["DSV41_BOOT_MARGIN_GIB"]).rule(Optional(&Float(0.0, 1024.0))),
    k("LOG_KEEP_EPOCHS", Supervision, V("500"), "Epoch directories (rank logs, diagnostics) kept in LOG_DIR: before a start the oldest go, never the epoch starting (three weeks of a restart an hour); 0: all.").rule(Int(0, 1_000_000)),
    k("LOG_KEEP_BYTES", Supervision, V("21474836480"), "Bytes of older epochs' directories kept in LOG_DIR (20 GiB), the oldest removed first past it; 0: no limit.").rule(Int(0, 1_099_511_627_776)),
    k("MIN_FREE_DISK_GIB", Supervision, V("2"), "Free space LOG_DIR's filesystem must have before a start (rank logs and diagnostics grow per epoch); empty: no check.").rule(Optional(&Float(0.0, 1_000_000.0))),
    // === Gateway ===
    k("BIND_ADDR", Gateway, V("0.0.0.0"), "Address the gateway listens on (with PORT).").rule(Ip),
    k("GROUPS_FILE", Gateway, V(""), "Several rank groups behind this gateway: a file of `[name]` sections, each holding env lines (HEAD_IP, WORKERS, VLLM_PORT, MASTER_PORT, SPEC_METHOD, …) that override the rest of the configuration for that group (docs/operations.md, Groups). Relative to DEPLOY_DIR. Empty: one group."),
    k("GROUP_ROUTING", Gateway, V("affinity"), "How a generation picks a group when several have room: `affinity` (the group that served the same conversation prefix — model, system prompt, first user turn — within the last 10 minutes, else the least loaded), `least-loaded`, or `round-robin` (for comparison).").rule(OneOf(GroupRouting::WORDS)),
    k("AFFINITY_WAIT_MS", Gateway, V("2000"), "Milliseconds a queued generation may wait for its conversation's group (GROUP_ROUTING=affinity) when that group is full and another has room, before it takes the other: a conversation's history is in its group's prefix cache, so a short wait usually costs less than prefilling it elsewhere. 0: take any group with room at once.").rule(Int(0, 3_600_000)),
    k("MODELS", Gateway, V(""), "Several models served from the same nodes, one loaded at a time: profiles, comma-separated (`deepseek-v4.1-flash,glm-5.3-flash`); the first is loaded at start and is the default. Each keeps its own plan, image, weights, MAX_NUM_SEQS, speculation, aliases and effort rules (its profile's defaults, overridden by its MODELS_FILE section); a request naming another model swaps it in (SWAP_POLICY). Empty: PROFILE alone (docs/operations.md, Models).").rule(Profiles),
    k("MODELS_FILE", Gateway, V(""), "Per-model settings with MODELS: a file of `[profile]` sections, each holding env lines (IMAGE, SERVED_MODEL_NAME, MODEL_ALIASES, SPEC_METHOD, MAX_NUM_SEQS, …) for that model only, over every other layer. Relative to DEPLOY_DIR. A setting whose default differs between the profiles (IMAGE, SERVED_MODEL_NAME, SPEC_METHOD, …) must be set here, not for every model at once."),
    k("SWAP_POLICY", Gateway, V("on_demand"), "With MODELS: `on_demand` queues a request for the model not loaded and swaps it in (the loaded model drains, its ranks stop, the other's start); `manual` answers it 503 with Retry-After, naming `sparkgate model NAME`.").rule(OneOf(SwapPolicy::WORDS)),
    k("SWAP_DRAIN_S", Gateway, V("120"), "Seconds a swap lets the loaded model's admitted requests finish before its ranks stop; streams still running are then continued after the swap, like any cut stream (RESUME_TIMEOUT).").rule(Int(0, 86_400)),
    k("SWAP_MIN_DWELL_S", Gateway, V("600"), "Seconds a model stays loaded while it has work before another model's waiting requests swap it out; swaps never start more often than once in this many seconds (no thrash). Requests for the loaded model that arrive while a swap waits are served first only while it lasts.").rule(Int(0, 86_400)),
    k("IDLE_UNLOAD_S", Gateway, V("0"), "With MODELS: seconds without a request running or waiting after which the loaded model's ranks stop, freeing the pair's memory; the next request loads its model. 0: never.").rule(Int(0, 604_800)),
    k("SWAP_MEMORY_MARGIN_GIB", Gateway, V("4"), "A swap starts the next model only once every node's MemAvailable is back within this many GiB of what it was before the unloaded model was loaded (its ranks' memory released); past SWAP_RELEASE_TIMEOUT_S the old model is started again.").rule(Float(0.0, 1024.0)),
    k("SWAP_RELEASE_TIMEOUT_S", Gateway, V("120"), "Seconds a swap waits for the unloaded model's memory to come back (SWAP_MEMORY_MARGIN_GIB).").rule(Int(1, 86_400)),
    k("UPSTREAM_URL", Gateway, V("http://127.0.0.1:${VLLM_PORT}"), "vLLM rank 0's base URL; `sparkgate serve --upstream URL` fronts an already running vLLM.").rule(HttpUrl),
    k("MODEL_ALIASES", Gateway, V(""), "Comma-separated extra model names accepted and rewritten to SERVED_MODEL_NAME; one `*` matches any run of characters (`claude-*` for Claude Code)."),
    k("REASONING_EFFORT_MAP", Gateway, V("minimal=low,medium=high,xhigh=max"), "How OpenAI effort names the template lacks are mapped (from=to, comma-separated).").rule(EffortMap),
    k("QUEUE_DEPTH", Gateway, V("256"), "Generation requests that may wait for a MAX_NUM_SEQS slot; more get 429.").rule(Int(0, 1_000_000)),
    k("PREFILL_BYTES_PER_TOKEN", Gateway, V("3600"), "Transient memory a prefill takes per prompt token (bytes), for the admission's memory guard: a prompt whose estimate (body bytes / 4) times this would take a node's MemAvailable under MEM_GUARD_GIB waits in the queue while shorter ones go ahead. guide: a 601 000-token prefill took the head's headroom from about 4.1 to 2.1 GiB (DeepSeek; no GLM figure is published, so GLM uses it too). 0: no guard.").rule(Int(0, 1_073_741_824)),
    k("QUEUE_TIMEOUT", Gateway, V("600"), "Seconds a request may wait for a slot before 503.").rule(Int(0, 86_400)),
    k("QUEUE_POLICY", Gateway, V("fair"), "How waiting generation requests are ordered: `fair` is a weighted fair queue over clients (each client's requests in their order; a client's burst does not hold another client's request behind it), `fifo` one line for everyone. A client is its validated API key, else the `x-sparkgate-client` header, else the body's `user`, else its address.").rule(OneOf(QueuePolicy::WORDS)),
    k("CLIENT_WEIGHTS", Gateway, V(""), "Shares of the fair queue (QUEUE_POLICY=fair): client=weight pairs, the client as the queue names it (an API key, an `x-sparkgate-client` value, a body `user` or an address); a client of weight 4 is served four requests for one of a weight-1 client while both wait. Unlisted clients weigh 1.").secret().rule(ClientWeights),
    k("QUEUE_MAX_BYTES", Gateway, V("268435456"), "Bytes of request bodies the queue may hold (256 MiB: several 600k-token prompts); more get 429 with Retry-After.").rule(Int(0, 68_719_476_736)),
    k("FIRST_TOKEN_TIMEOUT", Gateway, V("900"), "Seconds a stream may wait for its first event (long prefills take minutes).").rule(Int(1, 604_800)),
    k("STREAM_IDLE_TIMEOUT", Gateway, V("120"), "Seconds without an upstream event before a stream ends with an error.").rule(Int(1, 604_800)),
    k("RESUME_TIMEOUT", Gateway, V("1200"), "Seconds a stream cut by its rank group's loss (a rank's exit, a hang, memguard, a restart) is held open (an SSE comment every 15 s) for the group to be Ready again and continued exactly where it stopped (docs/resume.md); 0 ends such streams with the error event at once.").rule(Int(0, 86_400)),
    k("WARM_REPLAY_BYTES", Gateway, V("0"), "Bytes of recent conversations' last requests kept to warm a restarted rank group's prefix cache: once it is Ready again, the most recent ones are sent with at most one token to generate, at the lowest priority and only while the group is idle, so the next turn of a long conversation finds its prefix cached (docs/resume.md); 0 keeps none.").rule(Int(0, 17_179_869_184)),
    k("CONSOLE_SESSION_S", Gateway, V("28800"), "Seconds a sign-in to the web console (`/console`) lasts; its cookie expires then and the session is forgotten. Signing out ends it sooner; a gateway restart signs everyone out.").rule(Int(1, 2_592_000)),
    k("STORE_URL", Gateway, V("${DEPLOY_DIR}/state/responses.sqlite"), "Where stored Responses live (docs/store.md): a SQLite file (a path, or sqlite:PATH; created with its directory) or a PostgreSQL URL (postgres://user:password@host/db) that several gateways share; shown redacted.").secret(),
    k("STORE_TTL", Gateway, V("2592000"), "Seconds a stored response is kept (30 days); 0 keeps them until the size cap or a delete removes them.").rule(Int(0, 3_153_600_000)),
    k("STORE_MAX_BYTES", Gateway, V("1073741824"), "Bytes of stored responses kept (1 GiB), the oldest evicted first past it; 0: no cap.").rule(Int(0, 1_099_511_627_776)),
    k("KEY_TOKENS_PER_MINUTE", Gateway, V("0"), "Tokens (prompt + completion) each API key may use in any 60 seconds (a sliding window), unless its API_KEYS_FILE line says otherwise; a request over it is answered 429 with Retry-After (when enough of the window has slid out) before it takes a slot (docs/keys.md). 0: no limit.").rule(Int(0, 1_000_000_000_000)),
    k("KEY_TOKENS_PER_DAY", Gateway, V("0"), "Tokens each API key may use in any 24 hours (a sliding window, rebuilt from the store at a start), unless its API_KEYS_FILE line says otherwise; 0: no limit.").rule(Int(0, 1_000_000_000_000)),
    k("KEY_MAX_SEQUENCES", Gateway, V("0"), "Sequences each API key may have running or queued at once, unless its API_KEYS_FILE line says otherwise; 0: no limit.").rule(Int(0, 1_000_000)),
    k("QUOTA_MODE", Gateway, V("enforce"), "`enforce` answers a request over its key's quota 429; `shadow` serves it and only counts and logs the refusal it would have been.").rule(OneOf(QuotaMode::WORDS)),
    k("INTERACTIVE_RESERVE", Gateway, V("1"), "Slots of MAX_NUM_SEQS held back from long requests (a prompt estimate above LONG_PROMPT_TOKENS, or a key with `class=batch`) while another client has been active in the last INTERACTIVE_ACTIVE_S, so a chat never waits for a whole long prefill (docs/keys.md); at most MAX_NUM_SEQS - 1 (none with one slot). Long requests take every slot when nobody else is around. 0: off.").rule(Int(0, 1_000_000)),
    k("LONG_PROMPT_TOKENS", Gateway, V("32768"), "A prompt estimated above this many tokens is a long request for INTERACTIVE_RESERVE (a key's `class=` overrides).").rule(Int(1, 1_000_000_000)),
    k("INTERACTIVE_ACTIVE_S", Gateway, V("10"), "Seconds after its last request that a client counts as active: while one is, long requests leave INTERACTIVE_RESERVE slots free.").rule(Int(1, 86_400)),
    k("LONG_MAX_WAIT_S", Gateway, V("15"), "Seconds a long request waits at most for the reserve: then it takes a reserved slot (nothing starves).").rule(Int(0, 86_400)),
    k("QUARANTINE_TTL", Gateway, V("3600"), "Seconds a body refused as poisonous (two requests under it quarantined for losing the engine) stays refused after its last verdict, across restarts and on every gateway sharing the store; `sparkgate quarantine release ID` ends it sooner.").rule(Int(60, 31_536_000)),
    k("FAIR_CHARGE", Gateway, V("tokens"), "What the fair queue charges a client: `tokens` (its prompt at admission, its output as it streams, settled with the real usage at the end, divided by its weight), or `sequences` (one per sequence, whatever its size).").rule(OneOf(FairCharge::WORDS)),
    k("SESSION_HEADER", Gateway, V("x-session-id"), "Request header naming a conversation: requests with the same value (or the same Anthropic `metadata.user_id`) go to the same rank group while it has room; empty: none.").rule(Text),
    k("OTEL_EXPORTER_OTLP_ENDPOINT", Gateway, V(""), "OpenTelemetry collector (OTLP over HTTP, e.g. http://127.0.0.1:4318): each generation is traced (a span per stage, docs/observability.md), an incoming `traceparent` continued and forwarded to rank 0, which is given `--otlp-traces-endpoint` so vLLM's spans join the trace. Empty: no tracing.").rule(Optional(&HttpUrl)),
    k("OTEL_EXPORTER_OTLP_PROTOCOL", Gateway, V("http/protobuf"), "OTLP encoding: `http/protobuf` or `http/json`.").rule(OneOf(OtlpProtocol::WORDS)),
    k("OTEL_SERVICE_NAME", Gateway, V("sparkgate"), "The service name traces carry.").rule(NonEmpty),
    k("REQUEST_TIMEOUT", Gateway, V("3600"), "Seconds a non-streaming generation may take upstream.").rule(Int(1, 604_800)),
    k("RATE_LIMIT_RPM", Gateway, V("0"), "Requests per minute per API key (or client IP) on /v1/*; 0 = off.").rule(Int(0, 1_000_000)),
    k("RATE_LIMIT_BURST", Gateway, V(""), "Burst of the rate limit; empty = RATE_LIMIT_RPM.").rule(Optional(&Int(1, 1_000_000))),
    k("METRICS_PUBLIC", Gateway, V("0"), "1 = `/metrics` answers without an API key when API_KEYS is set (for a Prometheus without credentials).").rule(Flag),
    k("MAX_BODY_BYTES", Gateway, V("33554432"), "Largest request body accepted (413 beyond).").rule(Int(1024, 1_073_741_824)),
    k("HEADER_READ_TIMEOUT", Gateway, V("30"), "Seconds a client may take to send request headers.").rule(Int(1, 604_800)),
    k("BODY_TIMEOUT", Gateway, V("30"), "Seconds a client may take to send a request body; past them the request is answered 408 and its connection closed, unless the body has kept arriving at BODY_MIN_RATE on average (a large prompt on a slow link).").rule(Int(1, 604_800)),
    k("BODY_MIN_RATE", Gateway, V("65536"), "Bytes per second a request body must average to be given longer than BODY_TIMEOUT; 0: BODY_TIMEOUT is the limit for every body.").rule(Int(0, 1_073_741_824)),
    k("MAX_CONNECTIONS", Gateway, V("10000"), "Open client connections the gateway serves; one more is answered 503 and closed (keep it under the file-descriptor limit).").rule(Int(1, 1_000_000)),
    k("DRAIN_TIMEOUT", Gateway, V("60"), "Seconds in-flight requests may finish on shutdown or before a restart.").rule(Int(0, 86_400)),
    k("WORKER_THREADS", Gateway, V("1"), "Threads serving HTTP and supervising: 1 runs everything on one thread (tokio's current-thread scheduler, the least added latency and CPU per request, BENCHMARKS.md); N > 1 is a multi-threaded runtime of N workers, 0 one per CPU core. Raise it only for more throughput than one core gives.").rule(Int(0, 1024)),
    k("LOG_FORMAT", Gateway, V("text"), "Access and event log format.").rule(OneOf(LogFormat::WORDS)),
    k("TLS_CERT", Gateway, V(""), "A PEM certificate chain (the server's certificate first): with TLS_KEY, the gateway serves HTTPS on PORT (rustls; HTTP/1.1 and h2 by ALPN) instead of plain HTTP; relative to DEPLOY_DIR. Read again on SIGHUP and when it changes, without dropping a connection; one that does not load keeps the previous one (docs/operations.md). Empty: plain HTTP."),
    k("TLS_KEY", Gateway, V(""), "The PEM private key (PKCS#8, PKCS#1 or SEC1) of TLS_CERT's certificate; relative to DEPLOY_DIR."),
    k("TLS_CLIENT_CA", Gateway, V(""), "PEM certificates of the authorities whose client certificates the gateway accepts (mutual TLS): a client without one is refused in the handshake. Needs TLS_CERT. Empty: no client certificate asked for."),
    // === Secrets ===
    k("HF_TOKEN", Secrets, V(""), "Hugging Face token for downloads.").secret(),
    k("GHCR_USER", Secrets, V("MiaAI-Lab"), "GHCR user for image pulls."),
    k("GHCR_TOKEN", Secrets, V(""), "GHCR token for image pulls.").secret(),
    k("VLLM_API_KEY", Secrets, V(""), "API key the ranks require (the gateway sends it upstream).").secret().rank_env(),
    k("API_KEYS", Secrets, V(""), "Comma-separated API keys the gateway accepts (Bearer or x-api-key) on every route that reaches the model or its tokenizer, and on /metrics unless METRICS_PUBLIC=1; `name=key` names a key (a bare key is named `key-` and 8 hex digits of its SHA-256); logs, metrics, usage and traces show names, never keys (docs/keys.md). Empty (and no API_KEYS_FILE): open.").secret(),
    k("API_KEYS_FILE", Secrets, V(""), "A file of named keys with their own settings, one per line: `name key [weight=N] [priority=N] [tokens_per_minute=N] [tokens_per_day=N] [max_sequences=N]`, the key in plain text or as `sha256:<hex>` (docs/keys.md); relative to DEPLOY_DIR; read with API_KEYS at start, and again on SIGHUP and when it changes, without dropping a connection."),
    k("ADMIN_TOKEN", Secrets, V(""), "Bearer token for /admin/*; empty: loopback peers only.").secret(),
];

pub(crate) fn knob(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}

/// The knob `name` refers to, by its name or one of its aliases.
pub(crate) fn knob_by_any_name(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name || k.aliases.contains(&name))
}

/// `value` as it may be shown: the redaction marker for a secret knob's non-empty value.
pub(crate) fn redact(name: &str, value: &str) -> String {
    let secret = knob(name).is_some_and(|k| k.secret);
    if secret && !value.is_empty() {
        REDACTED.to_owned()
    } else {
        value.to_owned()
    }
}
