//! The typed `Config`: every value parsed and validated once, before anything starts. Loading
//! it (layers, knobs, rules) is the `load` module's; this one declares what a loaded one holds.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::choice::choice;
use crate::profile::ProfileId;
use crate::secret::Secret;
use crate::section::Group;
use crate::source::Source;
use crate::spec::{SpecMethod, SpecMode};
use crate::tenancy::{Tenancy, Tracing};

/// What to load: the inputs of [`Config::load`], so tests can pass their own environment.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// An env file to read; it must exist. `None`: `.env` in `working_dir` when present.
    pub env_file: Option<PathBuf>,
    /// `--profile` from the command line (wins over every other layer).
    pub profile: Option<String>,
    /// Other variables set by command-line flags (e.g. `serve --port`), as `NAME → value`.
    pub overrides: BTreeMap<String, String>,
    /// The process environment.
    pub process_env: BTreeMap<String, String>,
    /// The demo's settings (`sparkgate demo`), below the env file: what it runs unless the
    /// environment, the env file or a flag says otherwise.
    pub demo: BTreeMap<String, String>,
    /// Where a default `.env` is looked for and relative paths resolve.
    pub working_dir: PathBuf,
}

impl LoadOptions {
    /// Options from this process: its environment and working directory.
    pub fn from_process(env_file: Option<PathBuf>, profile: Option<String>) -> Self {
        Self {
            env_file,
            profile,
            overrides: BTreeMap::new(),
            demo: BTreeMap::new(),
            process_env: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            working_dir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        }
    }
}

/// The whole validated configuration of one deployment.
#[derive(Debug, Clone)]
pub struct Config {
    pub profile: ProfileId,
    pub deploy_dir: PathBuf,
    pub env_file: Option<PathBuf>,
    pub nodes: Nodes,
    pub ports: Ports,
    pub serving: Serving,
    pub speculation: Speculation,
    pub containers: Containers,
    pub storage: Storage,
    pub preparation: Preparation,
    pub supervision: Supervision,
    pub gateway: Gateway,
    pub secrets: Secrets,
    /// Variables passed verbatim into both rank containers, in table order then by name.
    pub(crate) rank_env: Vec<(String, RankEnvValue)>,
    pub(crate) settings: Vec<Setting>,
    pub(crate) warnings: Vec<String>,
}

/// A rank-environment value; secrets stay typed until the container spec is handed to Docker.
#[derive(Debug, Clone, PartialEq)]
pub enum RankEnvValue {
    Plain(String),
    Secret(Secret),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Nodes {
    pub head_ip: IpAddr,
    pub ssh: SshSettings,
    pub head_nic: Nic,
    /// Rank r ≥ 1 runs on `workers[r - 1]`; empty when NNODES is 1.
    pub workers: Vec<Worker>,
}

/// How every worker is reached over SSH (the port is each worker's own).
#[derive(Debug, Clone, PartialEq)]
pub struct SshSettings {
    pub keyfile: Option<PathBuf>,
    /// `accept-new`, `strict` or `accept`.
    pub known_hosts: KnownHosts,
    pub known_hosts_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub control_dir: PathBuf,
    pub worker_docker_socket: String,
}

/// One worker node: where it is, how SSH reaches it, and its CX7 pins.
#[derive(Debug, Clone, PartialEq)]
pub struct Worker {
    /// The rank it runs (1 for the first worker).
    pub rank: u32,
    pub ip: IpAddr,
    pub user: String,
    /// The user's home there; directories configured under WORKER_HOME move under it.
    pub home: String,
    /// SSH destination, `user@address`.
    pub ssh: String,
    pub ssh_port: u16,
    pub nic: Nic,
    /// How messages name it: `worker` when it is the only one, else `worker <rank>`.
    pub label: String,
    /// WORKER_HOME, the home the worker directory knobs were written against.
    pub(crate) configured_home: String,
}

impl Worker {
    /// The worker is another machine (reached over SSH) unless it has the head's address.
    pub fn is_remote(&self, nodes: &Nodes) -> bool {
        self.ip != nodes.head_ip
    }

    /// A worker directory knob's value on this worker: a path under WORKER_HOME moves under
    /// this worker's home (workers may log in as different users); any other stays as written.
    pub fn path(&self, configured: &str) -> String {
        match configured.strip_prefix(self.configured_home.trim_end_matches('/')) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                format!("{}{rest}", self.home.trim_end_matches('/'))
            }
            _ => configured.to_owned(),
        }
    }
}

impl Nodes {
    /// The worker that runs `rank` (none for rank 0).
    pub fn worker(&self, rank: u32) -> Option<&Worker> {
        self.workers.iter().find(|w| w.rank == rank)
    }

    /// The workers on other machines, reached over SSH.
    pub fn remote_workers(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.workers.iter().filter(|w| w.is_remote(self))
    }
}

/// The CX7 pins of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Nic {
    pub ifname: String,
    pub hca: String,
    pub gid_index: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ports {
    /// The gateway's public port (PORT).
    pub public: u16,
    /// Rank 0's own HTTP port on 127.0.0.1.
    pub vllm: u16,
    /// torch.distributed rendezvous.
    pub master: u16,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    pub served_model_name: String,
    pub image: String,
    pub tp: u32,
    pub pp: u32,
    pub nnodes: u32,
    pub quantization: Option<String>,
    pub max_model_len: u32,
    /// Kept as written: it goes to vLLM verbatim.
    pub gpu_mem_util: String,
    pub max_num_batched_tokens: u32,
    pub long_prefill_token_threshold: Option<u32>,
    pub kv_cache_dtype: Option<String>,
    pub kv_block_size: Option<u32>,
    pub kv_cache_memory_bytes: Option<u64>,
    pub enforce_eager: bool,
    /// SCHEDULING_POLICY: vLLM's `--scheduling-policy`, and the order of the gateway's queue.
    pub scheduling_policy: SchedulingPolicy,
    pub extra_args: Vec<String>,
    pub language_model_only: bool,
    pub skip_mm_profiling: bool,
    pub limit_mm: String,
    pub chat_template_host: Option<PathBuf>,
    pub default_reasoning_effort: Option<String>,
    pub cg_estimate: bool,
    pub host_nccl: Option<HostNccl>,
}

/// A host NCCL build preloaded into the ranks (USE_HOST_NCCL=1).
#[derive(Debug, Clone, PartialEq)]
pub struct HostNccl {
    pub head_dir: String,
    pub worker_dir: String,
    pub so_name: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Speculation {
    pub active: SpecMethod,
    /// Every mode of the profile; the active one carries MAX_NUM_SEQS.
    pub modes: Vec<SpecMode>,
    /// DFlash2 draft model (glm).
    pub dflash: Option<DflashDraft>,
    /// Whether the gateway switches modes by demand width.
    pub policy: SpecPolicy,
    /// The auto policy's settings (also used when an operator turns auto on at run time).
    pub auto: AutoSpec,
}

/// The auto policy's settings (SPEC_RESTART_S, SPEC_MIN_DWELL_S, SPEC_HOLD_S, SPEC_MARGIN,
/// SPEC_RATE_TAU_S).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoSpec {
    pub restart_s: f64,
    pub min_dwell_s: f64,
    pub hold_s: f64,
    pub margin: f64,
    pub rate_tau_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DflashDraft {
    /// The draft model's Hugging Face repository (DFLASH_MODEL).
    pub repo: String,
    pub model_dir: String,
    pub draft_tensor_parallel_size: Option<u32>,
}

impl Speculation {
    pub fn active_mode(&self) -> &SpecMode {
        self.mode(self.active)
            .expect("the active mode is one of the profile's modes")
    }

    pub fn mode(&self, method: SpecMethod) -> Option<&SpecMode> {
        self.modes.iter().find(|m| m.method == method)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Containers {
    pub head_name: String,
    pub worker_name: String,
    pub gpus: Gpus,
    pub memlock_unlimited: bool,
    pub devices: Vec<String>,
    pub oom_score_adj: Option<i32>,
}

choice! {
    /// How the worker gets its weights.
    pub enum WeightSync {
        Nfs = "nfs",
        Rsync = "rsync",
        Zfs = "zfs",
        None = "none",
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Storage {
    pub weight_sync: WeightSync,
    pub cache_root: String,
    pub triton_host_cache: String,
    pub tilelang_host_cache: String,
    pub worker_vllm_cache: String,
    pub expected_shards: u32,
    pub weights: Weights,
    pub auto_download: bool,
    pub force_sync: bool,
    /// HF_BIN: an explicit Hugging Face CLI (empty: search).
    pub hf_bin: String,
}

/// Where each profile's weights live.
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    DeepSeek {
        model_host: String,
        engram_dir: String,
        engram_src: String,
        nfs_volume_model: String,
        nfs_volume_engram: String,
        worker_model_dir: String,
        worker_engram_dir: String,
        hf_model_repo: String,
        hf_engram_repo: String,
    },
    Glm {
        hf_home: String,
        worker_hf_home: String,
        model: String,
        revision: String,
        cache_name: String,
    },
}

choice! {
    /// How a worker that lacks the image gets it.
    pub enum ImageShip {
        Auto = "auto",
        Stream = "stream",
        Staged = "staged",
    }
}

/// Node preparation: the image on both nodes, the weights before the first start, and the
/// DeepSeek-only NFS share, ZFS datasets and Engram pack.
#[derive(Debug, Clone, PartialEq)]
pub struct Preparation {
    pub pull: bool,
    /// The registry host the GHCR credentials belong to.
    pub ghcr_registry: String,
    pub build: bool,
    pub skip_pull: bool,
    pub skip_build: bool,
    pub skip_ship: bool,
    pub build_context: PathBuf,
    pub dockerfile: String,
    pub ship: ImageShip,
    pub ship_dir: PathBuf,
    pub worker_ship_dir: String,
    pub ship_keep: bool,
    /// KiB/s for the staged transfer; 0 = unlimited.
    pub ship_bwlimit_kib: u32,
    pub skip_download: bool,
    pub skip_sync: bool,
    pub nfs: Option<NfsShare>,
    pub zfs: Option<ZfsDatasets>,
    pub pack: Option<EngramPack>,
    /// DSV41_DROP_PAGE_CACHE: drop each node's page cache once the group is ready.
    pub drop_page_cache: bool,
}

/// WEIGHT_SYNC=nfs: what the head exports and the worker's volumes mount.
#[derive(Debug, Clone, PartialEq)]
pub struct NfsShare {
    pub server_ip: IpAddr,
    pub export_model: String,
    pub export_engram: String,
    pub clients: String,
}

/// WEIGHT_SYNC=zfs: the datasets whose snapshots are sent to the worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ZfsDatasets {
    pub head_model: String,
    pub worker_model: String,
}

/// The Engram packer (DeepSeek): where the packed files go on each node and the image's command.
#[derive(Debug, Clone, PartialEq)]
pub struct EngramPack {
    pub head_dir: String,
    pub worker_dir: String,
    pub cmd: Vec<String>,
}

choice! {
    /// How the ranks are run.
    pub enum Runtime {
        Docker = "docker",
        Process = "process",
    }
}

choice! {
    /// SSH_KNOWN_HOSTS: what the worker's SSH does with its host key.
    pub enum KnownHosts {
        /// Record an unknown key, refuse a changed one.
        AcceptNew = "accept-new",
        /// Only keys already in known_hosts.
        Strict = "strict",
        /// Any key.
        Accept = "accept",
    }
}

choice! {
    /// SPEC_POLICY: who picks the speculation mode.
    pub enum SpecPolicy {
        /// The operator (SPEC_METHOD, `sparkgate spec MODE`).
        Fixed = "fixed",
        /// The gateway, by demand width.
        Auto = "auto",
    }
}

choice! {
    /// RANK_GPUS: which GPUs a rank container requests.
    pub enum Gpus {
        All = "all",
        None = "none",
    }
}

choice! {
    /// GROUP_ROUTING: how a generation picks among groups with room.
    pub enum GroupRouting {
        /// The group that served the same conversation prefix recently, else the least loaded.
        Affinity = "affinity",
        LeastLoaded = "least-loaded",
        /// In turn, whatever the load or the prefix (a baseline for measurements).
        RoundRobin = "round-robin",
    }
}

choice! {
    /// SCHEDULING_POLICY: the order vLLM's scheduler and the gateway's queue take requests in.
    pub enum SchedulingPolicy {
        /// In arrival order (the gateway's queue: within each client's fair share).
        Fcfs = "fcfs",
        /// A request's priority first, lower sooner: the body's `priority`, or the
        /// `X-Vllm-Priority` header, which wins, as vLLM reads them.
        Priority = "priority",
    }
}

choice! {
    /// QUEUE_POLICY: the order in which waiting generation requests are admitted.
    pub enum QueuePolicy {
        /// A weighted fair queue over clients; each client's own requests in their order.
        Fair = "fair",
        /// One line for every client.
        Fifo = "fifo",
    }
}

choice! {
    /// LOG_FORMAT: how access and event lines are written.
    pub enum LogFormat {
        Text = "text",
        Json = "json",
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Supervision {
    pub runtime: Runtime,
    pub docker_socket: String,
    pub vllm_bin: String,
    pub log_dir: PathBuf,
    /// Preflight: free space LOG_DIR's filesystem needs; `None` skips the check.
    pub min_free_disk_gib: Option<f64>,
    /// LOG_KEEP_EPOCHS and LOG_KEEP_BYTES; `None`: no limit.
    pub log_keep_epochs: Option<usize>,
    pub log_keep_bytes: Option<u64>,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub healthy_reset: Duration,
    pub restart_budget: u32,
    pub progress_timeout: Duration,
    /// STALL_TIMEOUT: work pending and no engine step this long is a hang.
    pub stall_timeout: Duration,
    pub stop_ranks_on_exit: bool,
    pub ready_timeout: Duration,
    /// After `/health` and `/v1/models`, readiness also needs a one-token generation to succeed.
    pub ready_generate_probe: bool,
    /// BOOT_SHAPE_WARMUP: warm-up requests after ready, before admission opens.
    pub boot_shape_warmup: bool,
    /// SELF_CHECK_CMD as argv (empty when unset or SKIP_OVERLAY_VERIFY=1).
    pub self_check: Vec<String>,
    pub hang: Duration,
    pub mem_guard: bool,
    pub mem_guard_gib: f64,
    pub boot_margin_gib: Option<f64>,
    pub weights_gib_per_rank: Option<f64>,
    pub meminfo_path: PathBuf,
    /// NODE_ROOT: where the doctor reads each node's /proc and /sys (`{node}`: its name).
    pub node_root: String,
    /// DOCTOR_VERSIONS_CMD: what prints an image's versions line.
    pub doctor_versions_cmd: Vec<String>,
    /// DOCTOR_MAX_SKEW: the clock skew the doctor accepts.
    pub doctor_max_skew: Duration,
}

/// The gateway's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Gateway {
    pub bind: IpAddr,
    /// vLLM rank 0's base URL, without a trailing slash (`http://host:port`).
    pub upstream: String,
    pub model_aliases: Vec<String>,
    /// OpenAI effort name → what to send instead (a profile effort name, `none`, or for deepseek
    /// an integer 1..=100 as text).
    pub effort_map: Vec<(String, String)>,
    pub queue_depth: usize,
    /// Body bytes the queue may hold.
    pub queue_max_bytes: usize,
    pub queue_timeout: Duration,
    pub queue_policy: QueuePolicy,
    /// PREFILL_BYTES_PER_TOKEN: a prefill's transient memory per prompt token; 0: no memory guard.
    pub prefill_bytes_per_token: u64,
    /// GROUPS_FILE, resolved against DEPLOY_DIR; `None`: one group.
    pub groups_file: Option<PathBuf>,
    pub group_routing: GroupRouting,
    /// MODELS: the profiles served in turn from the same nodes, the default first; empty: one.
    pub models: Vec<ProfileId>,
    /// MODELS_FILE, resolved against DEPLOY_DIR.
    pub models_file: Option<PathBuf>,
    pub swap: crate::swap::Swap,
    /// How long a queued request waits for its conversation's full group before taking another.
    pub affinity_wait: Duration,
    /// CLIENT_WEIGHTS: a client's share of the fair queue (the client may be an API key, hence
    /// a secret); unlisted clients weigh 1.
    pub client_weights: Vec<(Secret, u32)>,
    pub first_token_timeout: Duration,
    pub stream_idle_timeout: Duration,
    /// How long a cut stream waits to be continued; zero: cut streams end with their error.
    pub resume_timeout: Duration,
    /// WARM_REPLAY_BYTES: recent conversations' requests kept to warm a restarted group; 0: off.
    pub warm_replay_bytes: usize,
    /// CONSOLE_SESSION_S: how long a console sign-in lasts.
    pub console_session: Duration,
    /// STORE_URL: where stored Responses live (a SQLite path or a PostgreSQL URL; a secret,
    /// since a URL may hold a password).
    pub store_url: Secret,
    /// STORE_TTL; zero: no TTL.
    pub store_ttl: Duration,
    /// STORE_MAX_BYTES; zero: no cap.
    pub store_max_bytes: u64,
    pub request_timeout: Duration,
    /// Requests per minute per key; `None` = no rate limit.
    pub rate_limit_rpm: Option<u32>,
    pub rate_limit_burst: u32,
    /// `/metrics` answers without an API key.
    pub metrics_public: bool,
    pub max_body_bytes: usize,
    pub header_read_timeout: Duration,
    /// How long a request body may take to arrive, unless it averages `body_min_rate`.
    pub body_timeout: Duration,
    /// Bytes per second that earn a body more time than `body_timeout`; 0: none.
    pub body_min_rate: u64,
    /// Open client connections served at once.
    pub max_connections: usize,
    pub drain_timeout: Duration,
    pub log_format: LogFormat,
    /// Tokio worker threads; 0 = one per core.
    pub worker_threads: usize,
    pub tenancy: Tenancy,
    /// `None`: no tracing.
    pub tracing: Option<Tracing>,
    /// `None`: plain HTTP.
    pub tls: Option<crate::tenancy::TlsFiles>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Secrets {
    pub hf_token: Option<Secret>,
    pub ghcr_user: String,
    pub ghcr_token: Option<Secret>,
    pub vllm_api_key: Option<Secret>,
    /// API_KEYS, each maybe named.
    pub api_keys: Vec<crate::keys::ApiKey>,
    pub admin_token: Option<Secret>,
}

/// One variable as `sparkgate config` shows it: value (secrets redacted) and source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    pub name: &'static str,
    pub value: String,
    pub source: Source,
    /// Set under this older name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<&'static str>,
    #[serde(skip)]
    pub(crate) group: Group,
}

impl Supervision {
    /// The root a node's /proc, /sys and commands are found under (NODE_ROOT with `{node}` as
    /// its name): empty for `/`, so `<root>/proc` is `/proc`.
    pub fn node_root(&self, node: &str) -> String {
        let name = node.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        self.node_root.replace("{node}", &name).trim_end_matches('/').to_owned()
    }
}

impl Config {
    /// Every variable the profile uses, with its value (secrets redacted) and source.
    pub fn settings(&self) -> &[Setting] {
        &self.settings
    }

    /// Non-fatal findings: unknown variables in the env file, ignored overrides.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The settings as a JSON object (secrets redacted), for `sparkgate config --json`.
    pub fn settings_json(&self) -> serde_json::Value {
        serde_json::json!({
            "profile": self.profile,
            "env_file": self.env_file,
            "settings": self.settings,
            "speculation": {
                "active": self.speculation.active,
                "modes": self.speculation.modes,
            },
            "warnings": self.warnings,
        })
    }
}
