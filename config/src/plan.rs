//! The launch plan: a pure function of `Config` giving each rank's container spec and the exact
//! `vllm serve` argv, matching the reference launchers flag for flag.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::choice::choice;
use crate::config::{Config, Gpus, RankEnvValue, SchedulingPolicy, WeightSync, Weights};
use crate::profile::ProfileId;
use crate::spec::SpecMethod;

choice! {
    /// Which node a rank runs on.
    pub enum NodeRole {
        Head = "head",
        Worker = "worker",
    }
}

/// Everything needed to start the rank group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchPlan {
    /// Stable hash of the ranks' specs (labels excluded); a change means the running group is
    /// not this configuration.
    pub config_hash: String,
    /// Rank order is start order reversed: workers start first, rank 0 last.
    pub ranks: Vec<RankPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankPlan {
    pub rank: u32,
    pub node: NodeRole,
    pub container: ContainerSpec,
}

impl LaunchPlan {
    /// Mounts the packed Engram files of each listed `(rank, host directory)` read-only at
    /// `/engram-packed` and sets DSV41_PACKED_DIR there, as the DeepSeek launcher does when
    /// `engram-l1-r<rank>of<TP>.bin` exists; the config hash follows.
    pub fn with_packed_engram(mut self, packed: &[(u32, String)]) -> LaunchPlan {
        for (rank, dir) in packed {
            if let Some(r) = self.ranks.iter_mut().find(|r| r.rank == *rank) {
                r.container.mounts.push(Mount::Bind {
                    source: dir.clone(),
                    target: "/engram-packed".into(),
                    read_only: true,
                });
                r.container
                    .env
                    .push(("DSV41_PACKED_DIR".into(), RankEnvValue::Plain("/engram-packed".into())));
            }
        }
        self.config_hash = config_hash(&self.ranks);
        for r in &mut self.ranks {
            r.container
                .labels
                .insert(labels::CONFIG_HASH.into(), self.config_hash.clone());
        }
        self
    }
}

impl RankPlan {
    /// `serve MODEL --flag …`: the arguments after the `vllm` executable.
    pub fn vllm_argv(&self) -> &[String] {
        &self.container.cmd
    }
}

/// A rank container as Docker will be asked to create it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    #[serde(serialize_with = "serialize_env")]
    pub env: Vec<(String, RankEnvValue)>,
    pub mounts: Vec<Mount>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub network_mode: &'static str,
    pub ipc_mode: &'static str,
    /// `--gpus all` (a device request for every GPU) or none.
    pub gpus: Gpus,
    pub shm_size_bytes: u64,
    pub ulimits: Vec<Ulimit>,
    pub oom_score_adj: Option<i32>,
    pub cap_add: Vec<&'static str>,
    pub devices: Vec<String>,
    /// Always "no": the supervisor restarts the group as a unit, Docker must not restart a rank.
    pub restart_policy: &'static str,
    pub stop_timeout_s: u32,
}

fn serialize_env<S: serde::Serializer>(env: &[(String, RankEnvValue)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(env.len()))?;
    for (k, v) in env {
        match v {
            RankEnvValue::Plain(p) => map.serialize_entry(k, p)?,
            RankEnvValue::Secret(secret) => map.serialize_entry(k, secret)?,
        }
    }
    map.end()
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Mount {
    Bind {
        source: String,
        target: String,
        read_only: bool,
    },
    Volume {
        name: String,
        target: String,
        read_only: bool,
    },
}

impl Mount {
    /// `source:target[:ro]`, as `docker run -v` and the Docker API's binds take it.
    pub fn bind_spec(&self) -> String {
        let (src, target, ro) = match self {
            Mount::Bind {
                source,
                target,
                read_only,
            } => (source, target, *read_only),
            Mount::Volume {
                name,
                target,
                read_only,
            } => (name, target, *read_only),
        };
        format!("{src}:{target}{}", if ro { ":ro" } else { "" })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ulimit {
    pub name: &'static str,
    pub soft: i64,
    pub hard: i64,
}

/// Labels every rank container carries (the supervisor adds `sparkgate.epoch`).
pub mod labels {
    pub const GROUP: &str = "sparkgate.group";
    pub const RANK: &str = "sparkgate.rank";
    pub const EPOCH: &str = "sparkgate.epoch";
    pub const MODE: &str = "sparkgate.mode";
    pub const CONFIG_HASH: &str = "sparkgate.config-hash";
}

const SHM_SIZE_BYTES: u64 = 32 << 30;

fn bind(source: &str, target: &str, read_only: bool) -> Mount {
    Mount::Bind {
        source: source.into(),
        target: target.into(),
        read_only,
    }
}
const STACK_BYTES: i64 = 64 << 20;

impl Config {
    /// The launch plan for the active speculation mode.
    pub fn plan(&self) -> LaunchPlan {
        self.plan_for(self.speculation.active)
    }

    /// The launch plan for `mode` (one of the profile's modes), with that mode's MAX_NUM_SEQS.
    pub fn plan_for(&self, mode: SpecMethod) -> LaunchPlan {
        let ranks_n = self.serving.nnodes;
        let mut ranks: Vec<RankPlan> = (0..ranks_n).map(|rank| self.rank_plan(rank, mode)).collect();
        let config_hash = config_hash(&ranks);
        for r in &mut ranks {
            r.container
                .labels
                .insert(labels::CONFIG_HASH.into(), config_hash.clone());
        }
        LaunchPlan { config_hash, ranks }
    }

    fn rank_plan(&self, rank: u32, mode: SpecMethod) -> RankPlan {
        let node = if rank == 0 { NodeRole::Head } else { NodeRole::Worker };
        let c = &self.containers;
        let mut ulimits = vec![Ulimit {
            name: "stack",
            soft: STACK_BYTES,
            hard: STACK_BYTES,
        }];
        if c.memlock_unlimited {
            ulimits.insert(
                0,
                Ulimit {
                    name: "memlock",
                    soft: -1,
                    hard: -1,
                },
            );
        }
        let labels = BTreeMap::from([
            (labels::GROUP.to_owned(), self.group_name()),
            (labels::RANK.to_owned(), rank.to_string()),
            (labels::MODE.to_owned(), mode.to_string()),
        ]);
        RankPlan {
            rank,
            node,
            container: ContainerSpec {
                name: self.container_name(rank),
                image: self.serving.image.clone(),
                labels,
                env: self.rank_env(rank),
                mounts: self.mounts(rank),
                entrypoint: vec!["vllm".into()],
                cmd: self.vllm_argv(rank, mode),
                network_mode: "host",
                ipc_mode: "host",
                gpus: c.gpus,
                shm_size_bytes: SHM_SIZE_BYTES,
                ulimits,
                oom_score_adj: c.oom_score_adj,
                cap_add: self.profile.facts().cap_add.to_vec(),
                devices: c.devices.clone(),
                restart_policy: "no",
                stop_timeout_s: 60,
            },
        }
    }

    /// The value of the `sparkgate.group` label: one group per profile and served name.
    pub fn group_name(&self) -> String {
        format!("{}.{}", self.profile, self.serving.served_model_name)
    }

    /// Rank 0 runs as CONTAINER_HEAD, rank 1 as CONTAINER_WORKER, rank r > 1 as
    /// `CONTAINER_WORKER-r` (several workers may share a daemon when they run on the head).
    fn container_name(&self, rank: u32) -> String {
        let c = &self.containers;
        match rank {
            0 => c.head_name.clone(),
            1 => c.worker_name.clone(),
            r => format!("{}-{r}", c.worker_name),
        }
    }

    fn rank_env(&self, rank: u32) -> Vec<(String, RankEnvValue)> {
        let plain = |k: &str, v: String| (k.to_owned(), RankEnvValue::Plain(v));
        let mut env = self.rank_env.clone();
        env.push(plain(
            "VLLM_ENGINE_READY_TIMEOUT_S",
            self.supervision.ready_timeout.as_secs().to_string(),
        ));
        env.push(plain(
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
            u8::from(self.serving.cg_estimate).to_string(),
        ));
        if self.profile == ProfileId::Glm53Flash {
            env.push(plain("HF_HOME", "/root/.cache/huggingface".into()));
        }
        if let Some(nccl) = &self.serving.host_nccl {
            env.push(plain("LD_PRELOAD", format!("/nccl/{}", nccl.so_name)));
        }
        let (nic, ip) = match self.nodes.worker(rank) {
            None => (&self.nodes.head_nic, self.nodes.head_ip),
            Some(w) => (&w.nic, w.ip),
        };
        env.push(plain("NCCL_SOCKET_IFNAME", nic.ifname.clone()));
        env.push(plain("GLOO_SOCKET_IFNAME", nic.ifname.clone()));
        env.push(plain("NCCL_IB_HCA", nic.hca.clone()));
        env.push(plain("NCCL_IB_GID_INDEX", nic.gid_index.to_string()));
        env.push(plain("VLLM_HOST_IP", ip.to_string()));
        if let (0, Some(_)) = (rank, &self.gateway.tracing) {
            // vLLM's exporter speaks gRPC unless told otherwise; OTLP/HTTP is what the gateway
            // and its collector speak, and vLLM's HTTP exporter sends protobuf.
            env.push(plain("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf".into()));
            env.push(plain("OTEL_SERVICE_NAME", "vllm".into()));
        }
        env
    }

    fn mounts(&self, rank: u32) -> Vec<Mount> {
        let s = &self.storage;
        let worker = self.nodes.worker(rank);
        let head = worker.is_none();
        // A worker directory as it is on this rank's worker (WORKER_HOME moved to its home).
        let on_worker = |dir: &str| worker.map_or_else(|| dir.to_owned(), |w| w.path(dir));
        let mut mounts = self.weight_mounts(worker);
        let (vllm_cache, triton, tilelang) = if head {
            (
                s.cache_root.clone(),
                s.triton_host_cache.clone(),
                s.tilelang_host_cache.clone(),
            )
        } else {
            let w = &on_worker(&s.worker_vllm_cache);
            (w.clone(), format!("{w}/triton"), format!("{w}/tilelang"))
        };
        mounts.push(bind(&vllm_cache, "/root/.cache/vllm", false));
        mounts.push(bind(&triton, "/root/.triton/cache", false));
        mounts.push(bind(&tilelang, "/root/.tilelang/cache", false));
        if let Some(template) = &self.serving.chat_template_host {
            // The worker gets a copy next to its caches (the supervisor ships it before start).
            let source = if head {
                template.display().to_string()
            } else {
                format!("{}/chat_template.jinja", on_worker(&s.worker_vllm_cache))
            };
            mounts.push(bind(&source, &self.chat_template_target(), true));
        }
        if let Some(nccl) = &self.serving.host_nccl {
            let source = if head {
                nccl.head_dir.clone()
            } else {
                on_worker(&nccl.worker_dir)
            };
            mounts.push(bind(&source, "/nccl", true));
        }
        mounts
    }

    /// The weights as a rank sees them: the head's trees for rank 0; on a worker its NFS volumes
    /// or its own copies (under its home).
    fn weight_mounts(&self, worker: Option<&crate::config::Worker>) -> Vec<Mount> {
        let volume = |name: &str, target: &str| Mount::Volume {
            name: name.into(),
            target: target.into(),
            read_only: true,
        };
        let s = &self.storage;
        match (&s.weights, worker) {
            (
                Weights::DeepSeek {
                    model_host, engram_src, ..
                },
                None,
            ) => vec![bind(model_host, "/model", true), bind(engram_src, "/engram-src", true)],
            (
                Weights::DeepSeek {
                    nfs_volume_model,
                    nfs_volume_engram,
                    ..
                },
                Some(_),
            ) if s.weight_sync == WeightSync::Nfs => vec![
                volume(nfs_volume_model, "/model"),
                volume(nfs_volume_engram, "/engram-src"),
            ],
            (
                Weights::DeepSeek {
                    worker_model_dir,
                    worker_engram_dir,
                    ..
                },
                Some(w),
            ) => vec![
                bind(&w.path(worker_model_dir), "/model", true),
                bind(&w.path(worker_engram_dir), "/engram-src", true),
            ],
            (Weights::Glm { hf_home, .. }, None) => vec![bind(hf_home, "/root/.cache/huggingface", false)],
            (Weights::Glm { worker_hf_home, .. }, Some(w)) => {
                vec![bind(&w.path(worker_hf_home), "/root/.cache/huggingface", false)]
            }
        }
    }

    fn chat_template_target(&self) -> String {
        format!("{}/chat_template.jinja", self.profile.facts().opt_dir)
    }

    fn model_path(&self) -> String {
        match &self.storage.weights {
            Weights::DeepSeek { .. } => "/model".into(),
            Weights::Glm {
                cache_name, revision, ..
            } => {
                format!("/root/.cache/huggingface/hub/{cache_name}/snapshots/{revision}")
            }
        }
    }

    /// `--speculative-config` JSON of `mode`, keys in the launchers' order; `None`: no flag.
    pub fn speculative_config(&self, mode: SpecMethod) -> Option<String> {
        let m = self.speculation.mode(mode)?;
        let k = m.num_speculative_tokens;
        match mode {
            SpecMethod::None => None,
            SpecMethod::Mtp if k == 0 => None,
            SpecMethod::Dspark | SpecMethod::Mtp => {
                Some(format!(r#"{{"method":"{mode}","num_speculative_tokens":{k}}}"#))
            }
            SpecMethod::Dflash => {
                let draft = self.speculation.dflash.as_ref().expect("glm carries its draft model");
                let mut json = format!(
                    r#"{{"method":"dflash","model":{},"num_speculative_tokens":{k},"kv_cache_dtype":"auto","draft_sample_method":"probabilistic","rejection_sample_method":"standard""#,
                    serde_json::Value::from(draft.model_dir.as_str())
                );
                if let Some(tp) = draft.draft_tensor_parallel_size {
                    let _ = write!(json, r#","draft_tensor_parallel_size":{tp}"#);
                }
                json.push('}');
                Some(json)
            }
        }
    }

    fn vllm_argv(&self, rank: u32, mode: SpecMethod) -> Vec<String> {
        let s = &self.serving;
        let facts = self.profile.facts();
        let mode_cfg = self
            .speculation
            .mode(mode)
            .expect("plan_for takes one of the profile's modes");
        let mut a = self.group_argv(rank);
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_owned()));
        push(facts.fixed_serve_flags);
        if let Some(overrides) = facts.hf_overrides {
            push(&["--hf-overrides", overrides]);
        }
        if s.enforce_eager {
            push(&["--enforce-eager"]);
        }
        if let Some(q) = &s.quantization {
            push(&["--quantization", q]);
        }
        push(&["--max-model-len", &s.max_model_len.to_string()]);
        push(&["--gpu-memory-utilization", &s.gpu_mem_util]);
        push(&["--max-num-seqs", &mode_cfg.max_num_seqs.to_string()]);
        push(&["--max-num-batched-tokens", &s.max_num_batched_tokens.to_string()]);
        if s.scheduling_policy == SchedulingPolicy::Priority {
            push(&["--scheduling-policy", "priority"]);
        }
        if let Some(t) = s.long_prefill_token_threshold {
            push(&["--long-prefill-token-threshold", &t.to_string()]);
        }
        if let Some(dtype) = &s.kv_cache_dtype {
            push(&["--kv-cache-dtype", dtype]);
        }
        if let Some(bytes) = s.kv_cache_memory_bytes {
            push(&["--kv-cache-memory-bytes", &bytes.to_string()]);
        }
        if let Some(block) = s.kv_block_size {
            push(&["--block-size", &block.to_string()]);
        }
        if let Some(spec) = self.speculative_config(mode) {
            push(&["--speculative-config", &spec]);
        }
        if s.chat_template_host.is_some() {
            push(&["--chat-template", &self.chat_template_target()]);
        }
        a.extend(self.input_argv());
        if let (0, Some(t)) = (rank, &self.gateway.tracing) {
            // Rank 0's frontend traces each request under the gateway's `traceparent`.
            push_owned(&mut a, &["--otlp-traces-endpoint", &t.traces_url()]);
        }
        a.extend(s.extra_args.iter().cloned());
        if !s.enforce_eager && !s.extra_args.iter().any(|x| x.starts_with("--cudagraph-capture-sizes")) {
            a.push("--cudagraph-capture-sizes".into());
            a.extend(mode_cfg.cudagraph_capture_sizes.iter().map(u32::to_string));
        }
        a
    }

    /// `serve MODEL`, the address rank 0 binds and the rank's place in the group.
    fn group_argv(&self, rank: u32) -> Vec<String> {
        let s = &self.serving;
        let mut a: Vec<String> = Vec::with_capacity(64);
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_owned()));
        let model = self.model_path();
        let port = self.ports.vllm.to_string();
        push(&["serve", &model, "--served-model-name", &s.served_model_name]);
        push(&["--host", "127.0.0.1", "--port", &port]);
        push(&["--tensor-parallel-size", &s.tp.to_string()]);
        if s.pp > 1 {
            push(&["--pipeline-parallel-size", &s.pp.to_string()]);
        }
        if s.nnodes > 1 {
            let head = self.nodes.head_ip.to_string();
            let master = self.ports.master.to_string();
            push(&["--nnodes", &s.nnodes.to_string(), "--node-rank", &rank.to_string()]);
            push(&["--master-addr", &head, "--master-port", &master]);
        }
        push(&["--distributed-executor-backend", "mp"]);
        if rank > 0 {
            push(&["--headless"]);
        }
        a
    }

    /// What the model takes in: text only or multimodal limits, and the template's default effort.
    fn input_argv(&self) -> Vec<String> {
        let s = &self.serving;
        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_owned()));
        if s.language_model_only {
            push(&["--language-model-only"]);
        } else {
            if self.profile == ProfileId::DeepSeekV41Flash {
                push(&["--mm-encoder-tp-mode", "data"]);
            }
            push(&["--limit-mm-per-prompt", &s.limit_mm]);
            if s.skip_mm_profiling {
                push(&["--skip-mm-profiling"]);
            }
        }
        if let Some(effort) = &s.default_reasoning_effort {
            let kwargs = format!(r#"{{"reasoning_effort":"{effort}"}}"#);
            push(&["--default-chat-template-kwargs", &kwargs]);
        }
        a
    }
}

/// FNV-1a over the serialised specs without labels. Secrets enter only as "set": the hash sits
/// in a container label anyone with Docker access can read.
fn config_hash(ranks: &[RankPlan]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in ranks {
        let mut c = r.container.clone();
        c.labels.clear();
        let text = serde_json::to_string(&(r.rank, r.node, c)).expect("plan serialises");
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn push_owned(a: &mut Vec<String>, items: &[&str]) {
    a.extend(items.iter().map(|s| (*s).to_owned()));
}
