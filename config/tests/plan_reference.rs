//! The launch plan against the reference launchers: with each profile's reference `.env`, the
//! generated `vllm serve` argv and container spec equal what the launcher would run.

mod common;

use common::{options, words, Fixture};
use sparkgate_config::{Gpus, Mount, NodeRole, RankEnvValue, RankPlan, SpecMethod, Ulimit};

/// DeepSeek launcher §1.7, rank 0, with its `.env.example` values. The one deliberate
/// difference: vLLM listens on 127.0.0.1:VLLM_PORT because the gateway owns PORT.
const DEEPSEEK_RANK0: &str = r#"serve /model --served-model-name DeepSeek-v4.1-Flash-EXL3 --host 0.0.0.0 --port 8888
 --tensor-parallel-size 2 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29521
 --distributed-executor-backend mp
 --tokenizer-mode deepseek_v41 --tool-call-parser deepseek_v41 --reasoning-parser deepseek_v41
 --enable-auto-tool-choice --enable-prefix-caching --enable-prompt-tokens-details --no-enable-flashinfer-autotune --enable-scale-out
 --hf-overrides {"engram_table_dir":"/engram-src"}
 --quantization exl3 --max-model-len 600000 --gpu-memory-utilization 0.88 --max-num-seqs 2 --max-num-batched-tokens 1024
 --long-prefill-token-threshold 1792 --kv-cache-memory-bytes 2684354560 --block-size 64
 --speculative-config {"method":"dspark","num_speculative_tokens":3}
 --chat-template /opt/dsv41/chat_template.jinja --language-model-only
 --cudagraph-capture-sizes 1 2 3 4 6 8 12 18 24"#;

/// GLM launcher §2.5, rank 0, with the guide's values (DFlash2 draft TP 1).
const GLM_RANK0: &str = r#"serve /root/.cache/huggingface/hub/models--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/snapshots/25a44fdbf16862a46b7cc9921142c6c81350af2f
 --served-model-name GLM-5.3-Flash-EXL3 --host 0.0.0.0 --port 8888 --tensor-parallel-size 2 --nnodes 2 --node-rank 0
 --master-addr 127.0.0.1 --master-port 29521 --distributed-executor-backend mp
 --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45 --enable-prefix-caching --no-enable-flashinfer-autotune --enable-scale-out
 --quantization exl3 --max-model-len 900000 --gpu-memory-utilization 0.87 --max-num-seqs 4 --max-num-batched-tokens 1024
 --kv-cache-dtype fp8
 --speculative-config {"method":"dflash","model":"/root/.cache/huggingface/hub/models--incoai--GLM-5.3-Flash-DFlash2/snapshots/main","num_speculative_tokens":7,"kv_cache_dtype":"auto","draft_sample_method":"probabilistic","rejection_sample_method":"standard","draft_tensor_parallel_size":1}
 --chat-template /opt/glm53/chat_template.jinja --limit-mm-per-prompt {"image":4,"video":1} --skip-mm-profiling
 --cudagraph-capture-sizes 1 2 4 8 16 24 32"#;

/// The reference argv with the gateway-owned port moved to loopback.
fn reference(text: &str) -> Vec<String> {
    words(&text.replace("--host 0.0.0.0 --port 8888", "--host 127.0.0.1 --port 18888"))
}

/// Rank 1 per the launchers: rank 0's argv with `--node-rank 1` and `--headless` after
/// `--distributed-executor-backend mp`.
fn rank1_of(rank0: &[String]) -> Vec<String> {
    let mut argv = rank0.to_vec();
    let i = argv.iter().position(|a| a == "--node-rank").expect("--node-rank");
    argv[i + 1] = "1".into();
    let mp = argv.iter().position(|a| a == "mp").expect("mp backend");
    argv.insert(mp + 1, "--headless".into());
    argv
}

fn env_of(rank: &RankPlan) -> Vec<(String, String)> {
    rank.container
        .env
        .iter()
        .map(|(k, v)| match v {
            RankEnvValue::Plain(p) => (k.clone(), p.clone()),
            RankEnvValue::Secret(_) => (k.clone(), "<secret>".into()),
        })
        .collect()
}

fn env_value(rank: &RankPlan, key: &str) -> Option<String> {
    env_of(rank).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

#[test]
fn deepseek_argv_matches_the_launcher_flag_for_flag() {
    let config = Fixture::from_file("deepseek.env").config();
    let plan = config.plan();
    assert_eq!(plan.ranks.len(), 2);
    let expected0 = reference(DEEPSEEK_RANK0);
    assert_eq!(plan.ranks[0].vllm_argv(), expected0.as_slice());
    assert_eq!(options(plan.ranks[1].vllm_argv()), options(&rank1_of(&expected0)));
    assert_eq!(plan.ranks[1].vllm_argv(), rank1_of(&expected0).as_slice());
}

#[test]
fn glm_argv_matches_the_launcher_flag_for_flag() {
    let config = Fixture::from_file("glm.env").config();
    let plan = config.plan();
    let expected0 = reference(GLM_RANK0);
    assert_eq!(
        &plan.ranks[0].vllm_argv()[..2],
        &expected0[..2],
        "positional model path"
    );
    assert_eq!(options(plan.ranks[0].vllm_argv()), options(&expected0));
    assert_eq!(options(plan.ranks[1].vllm_argv()), options(&rank1_of(&expected0)));
}

#[test]
fn glm_default_effort_reaches_both_ranks() {
    let config = Fixture::from_file("glm.env")
        .env("GLM53_DEFAULT_REASONING_EFFORT", "high")
        .config();
    for rank in config.plan().ranks {
        let argv = rank.vllm_argv();
        let i = argv
            .iter()
            .position(|a| a == "--default-chat-template-kwargs")
            .expect("flag on every rank");
        assert_eq!(argv[i + 1], r#"{"reasoning_effort":"high"}"#);
    }
}

#[test]
fn deepseek_container_spec_matches_the_launcher() {
    let config = Fixture::from_file("deepseek.env").config();
    let plan = config.plan();
    let head = &plan.ranks[0];
    let worker = &plan.ranks[1];
    assert_eq!((head.node, worker.node), (NodeRole::Head, NodeRole::Worker));
    assert_eq!(head.container.name, "dsv41-exl3-head");
    assert_eq!(worker.container.name, "dsv41-exl3-worker");
    for rank in [head, worker] {
        let c = &rank.container;
        assert_eq!(
            c.image,
            "ghcr.io/miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks:2.9bpw"
        );
        assert_eq!((c.network_mode, c.ipc_mode), ("host", "host"));
        assert_eq!(c.gpus, Gpus::All);
        assert_eq!(c.shm_size_bytes, 32 << 30);
        assert_eq!(c.stop_timeout_s, 60);
        assert_eq!(c.restart_policy, "no");
        assert_eq!(c.oom_score_adj, Some(1000));
        assert_eq!(c.cap_add, vec!["SYS_PTRACE", "IPC_LOCK"]);
        assert_eq!(c.devices, vec!["/dev/infiniband"]);
        assert_eq!(
            c.ulimits,
            vec![
                Ulimit {
                    name: "memlock",
                    soft: -1,
                    hard: -1
                },
                Ulimit {
                    name: "stack",
                    soft: 67_108_864,
                    hard: 67_108_864
                }
            ]
        );
        assert_eq!(c.entrypoint, vec!["vllm"]);
        assert_eq!(c.labels["sparkgate.rank"], rank.rank.to_string());
        assert_eq!(c.labels["sparkgate.mode"], "dspark");
        assert_eq!(c.labels["sparkgate.config-hash"], plan.config_hash);
        // §1.5 "Environment, common to both ranks", with the launcher's values.
        for (k, v) in [
            ("NCCL_IB_DISABLE", "0"),
            ("NCCL_IB_ROCE_VERSION_NUM", "2"),
            ("NCCL_NET", "IB"),
            ("NCCL_NET_PLUGIN", "none"),
            ("NCCL_NVLS_ENABLE", "0"),
            ("NCCL_CUMEM_ENABLE", "0"),
            ("NCCL_IB_MERGE_NICS", "0"),
            ("NCCL_CROSS_NIC", "0"),
            ("NCCL_IGNORE_CPU_AFFINITY", "1"),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_BUFFSIZE", "1048576"),
            ("NCCL_LL128_BUFFSIZE", "262144"),
            ("NCCL_PROTO", "^LL128"),
            ("NCCL_MAX_NCHANNELS", "8"),
            ("VLLM_DISABLE_SHARED_EXPERTS_STREAM", "1"),
            ("CUDA_LAUNCH_BLOCKING", "0"),
            ("DSV41_EXL3_SERIAL_STREAMS", "1"),
            ("DSV41_ENGRAM_DISABLE", "0"),
            ("DSV41_INDEXER_PREFILL_FACTOR", "1"),
            ("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "256"),
            ("DSV41_PREFILL_EMPTY_CACHE_TOKENS", "8192"),
            ("DSV41_PREFILL_EMPTY_CACHE_MEMAVAIL_GIB", "2.5"),
            ("DSV41_PREFILL_END_EMPTY_CACHE", "0"),
            ("NCCL_DEBUG_SUBSYS", ""),
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("VLLM_CACHE_ROOT", "/root/.cache/vllm"),
            ("GLM53_SUPPRESS_STOPS_IN_REASONING", "1"),
            ("GLM53_MIXED_PREFILL_CHUNK", "0"),
            ("GLM53_INDEXER_WORKSPACE", "stock"),
            ("GLM53_SPINWAIT_MS", "stock"),
            ("TRITON_CACHE_DIR", "/root/.triton/cache"),
            ("TILELANG_CACHE_DIR", "/root/.tilelang/cache"),
            ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800"),
            ("TORCH_CUDA_ARCH_LIST", "12.1a"),
            ("FLASHINFER_CUDA_ARCH_LIST", "12.1a"),
            ("FLASHINFER_DISABLE_VERSION_CHECK", "1"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("VLLM_ENGINE_READY_TIMEOUT_S", "1500"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("DO_NOT_TRACK", "1"),
            ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1"),
            ("DSV41_EXL3_K_MAP", "/opt/dsv41/exl3_k_map.json"),
            ("GLM53_DENSE_FP8", "off"),
            ("EXL3_FAT_GROUPED", "1"),
            ("EXL3_TEMP_ROWS_FUSED", "16"),
            ("DSV41_IO_THREADS", "32"),
            ("DSV41_SOURCE", "/engram-src"),
        ] {
            assert_eq!(env_value(rank, k).as_deref(), Some(v), "{k} on rank {}", rank.rank);
        }
        let names: Vec<String> = env_of(rank).into_iter().map(|(k, _)| k).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "no variable twice");
    }
    // §1.5 "Environment, per rank".
    for (rank, ifname, hca, ip) in [
        (head, "enp1s0f1np1", "rocep1s0f1", "127.0.0.1"),
        (worker, "enp1s0f0np0", "rocep1s0f0", "127.0.0.2"),
    ] {
        assert_eq!(env_value(rank, "NCCL_SOCKET_IFNAME").as_deref(), Some(ifname));
        assert_eq!(env_value(rank, "GLOO_SOCKET_IFNAME").as_deref(), Some(ifname));
        assert_eq!(env_value(rank, "NCCL_IB_HCA").as_deref(), Some(hca));
        assert_eq!(env_value(rank, "NCCL_IB_GID_INDEX").as_deref(), Some("3"));
        assert_eq!(env_value(rank, "VLLM_HOST_IP").as_deref(), Some(ip));
    }
    // Mounts: head binds its trees, the worker uses the NFS volumes (WEIGHT_SYNC=nfs).
    let dir = config.deploy_dir.display().to_string();
    assert!(head.container.mounts.contains(&Mount::Bind {
        source: format!("{dir}/model"),
        target: "/model".into(),
        read_only: true
    }));
    assert!(worker.container.mounts.contains(&Mount::Volume {
        name: "dsv41-exl3-weights".into(),
        target: "/model".into(),
        read_only: true
    }));
    assert!(worker.container.mounts.contains(&Mount::Volume {
        name: "dsv41-exl3-engram".into(),
        target: "/engram-src".into(),
        read_only: true
    }));
    for rank in [head, worker] {
        let targets: Vec<&str> = rank
            .container
            .mounts
            .iter()
            .map(|m| match m {
                Mount::Bind { target, .. } | Mount::Volume { target, .. } => target.as_str(),
            })
            .collect();
        for t in [
            "/model",
            "/engram-src",
            "/root/.cache/vllm",
            "/root/.triton/cache",
            "/root/.tilelang/cache",
            "/opt/dsv41/chat_template.jinja",
        ] {
            assert!(targets.contains(&t), "rank {} mounts {t}", rank.rank);
        }
    }
}

#[test]
fn glm_container_spec_matches_the_launcher() {
    let config = Fixture::from_file("glm.env").config();
    let plan = config.plan();
    for rank in &plan.ranks {
        let c = &rank.container;
        assert_eq!(c.oom_score_adj, None, "the glm launcher sets no oom-score-adj");
        assert_eq!(c.cap_add, vec!["IPC_LOCK"], "and no SYS_PTRACE");
        assert_eq!(env_value(rank, "HF_HOME").as_deref(), Some("/root/.cache/huggingface"));
        assert_eq!(env_value(rank, "VLLM_ENGINE_READY_TIMEOUT_S").as_deref(), Some("3600"));
        assert_eq!(env_value(rank, "NCCL_BUFFSIZE"), None, "deepseek-only NCCL tuning");
        assert_eq!(env_value(rank, "EXL3_TEMP_ROWS_FUSED").as_deref(), Some("128"));
    }
    assert_eq!(plan.ranks[0].container.name, "glm53-exl3-head");
    assert!(plan.ranks[1].container.mounts.contains(&Mount::Bind {
        source: "/home/op/.cache/huggingface".into(),
        target: "/root/.cache/huggingface".into(),
        read_only: false,
    }));
}

/// Option groups only in `a`, and only in `b`.
fn diff(a: &[String], b: &[String]) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let (oa, ob) = (options(a), options(b));
    (
        oa.iter().filter(|g| !ob.contains(g)).cloned().collect(),
        ob.iter().filter(|g| !oa.contains(g)).cloned().collect(),
    )
}

#[test]
fn spec_method_changes_exactly_the_spec_flags_and_max_num_seqs() {
    let fixture = Fixture::new(None);
    let spark = fixture.config();
    let none = fixture.with("SPEC_METHOD", "none");
    let (a, b) = (spark.plan(), none.plan());
    for (ra, rb) in a.ranks.iter().zip(&b.ranks) {
        let (only_a, only_b) = diff(ra.vllm_argv(), rb.vllm_argv());
        assert_eq!(
            only_a,
            vec![
                words("--max-num-seqs 2"),
                vec![
                    "--speculative-config".into(),
                    r#"{"method":"dspark","num_speculative_tokens":3}"#.into()
                ]
            ]
        );
        assert_eq!(only_b, vec![words("--max-num-seqs 4")]);
        assert_eq!(env_of(ra), env_of(rb), "the environment does not depend on the mode");
        assert_eq!(ra.container.mounts, rb.container.mounts);
        assert_eq!(rb.container.labels["sparkgate.mode"], "none");
    }
    assert_ne!(a.config_hash, b.config_hash);
    assert_eq!(none.speculation.active_mode().max_num_seqs, 4);
    // plan_for gives the other mode's plan from one config, as a mode switch needs.
    assert_eq!(
        spark.plan_for(SpecMethod::None).ranks[0].vllm_argv(),
        b.ranks[0].vllm_argv()
    );
}

#[test]
fn glm_mode_change_swaps_spec_flags_and_capture_sizes_only() {
    let fixture = Fixture::from_file("glm.env");
    let dflash = fixture.config();
    let mtp = fixture.with("SPEC_METHOD", "mtp");
    let (only_a, only_b) = diff(dflash.plan().ranks[0].vllm_argv(), mtp.plan().ranks[0].vllm_argv());
    assert_eq!(only_a.len(), 2, "{only_a:?}");
    assert!(only_a
        .iter()
        .any(|g| g[0] == "--speculative-config" && g[1].contains("dflash")));
    assert!(only_a.contains(&words("--cudagraph-capture-sizes 1 2 4 8 16 24 32")));
    assert_eq!(
        only_b,
        vec![
            words("--cudagraph-capture-sizes 1 2 3 4 6 8 12"),
            vec![
                "--speculative-config".into(),
                r#"{"method":"mtp","num_speculative_tokens":2}"#.into()
            ],
        ]
    );
    let none = Fixture::from_file("glm.env").env("SPEC_METHOD", "none").config();
    assert!(!none.plan().ranks[0]
        .vllm_argv()
        .iter()
        .any(|a| a == "--speculative-config"));
    let mtp0 = Fixture::from_file("glm.env")
        .env("SPEC_METHOD", "mtp")
        .env("MTP_TOKENS", "0")
        .config();
    assert!(
        !mtp0.plan().ranks[0]
            .vllm_argv()
            .iter()
            .any(|a| a == "--speculative-config"),
        "MTP_TOKENS=0 omits the flag"
    );
}

#[test]
fn priority_scheduling_adds_exactly_its_flag_on_every_rank() {
    let fixture = Fixture::new(None);
    let (fcfs, priority) = (fixture.config(), fixture.with("SCHEDULING_POLICY", "priority"));
    for (ra, rb) in fcfs.plan().ranks.iter().zip(&priority.plan().ranks) {
        let (only_fcfs, only_priority) = diff(ra.vllm_argv(), rb.vllm_argv());
        assert!(only_fcfs.is_empty(), "{only_fcfs:?}");
        assert_eq!(only_priority, vec![words("--scheduling-policy priority")]);
    }
}

#[test]
fn eager_mode_drops_capture_sizes_and_extra_args_come_last() {
    let eager = Fixture::new(None).env("ENFORCE_EAGER", "1").config();
    let argv = eager.plan().ranks[0].vllm_argv().to_vec();
    assert!(argv.contains(&"--enforce-eager".to_owned()));
    assert!(!argv.contains(&"--cudagraph-capture-sizes".to_owned()));

    let custom = Fixture::new(None)
        .env("EXTRA_ARGS", "--cudagraph-capture-sizes 1 2 --seed '4 2'")
        .config();
    let argv = custom.plan().ranks[0].vllm_argv().to_vec();
    assert_eq!(
        argv[argv.len() - 5..],
        words("--cudagraph-capture-sizes 1 2 --seed")
            .into_iter()
            .chain(["4 2".to_owned()])
            .collect::<Vec<_>>()[..]
    );
    assert_eq!(argv.iter().filter(|a| *a == "--cudagraph-capture-sizes").count(), 1);
}

#[test]
fn test_machine_settings_remove_gpu_and_privilege_requests() {
    let config = Fixture::new(None)
        .env("RANK_GPUS", "none")
        .env("RANK_MEMLOCK_UNLIMITED", "0")
        .env("RANK_DEVICES", "")
        .env("OOM_SCORE_ADJ", "")
        .config();
    for rank in config.plan().ranks {
        let c = rank.container;
        assert_eq!(c.gpus, Gpus::None);
        assert!(c.devices.is_empty());
        assert_eq!(c.oom_score_adj, None);
        assert_eq!(
            c.ulimits,
            vec![Ulimit {
                name: "stack",
                soft: 67_108_864,
                hard: 67_108_864
            }]
        );
    }
}

#[test]
fn single_node_plan_has_one_rank_without_rendezvous_flags() {
    let config = Fixture::new(None).env("NNODES", "1").config();
    let plan = config.plan();
    assert_eq!(plan.ranks.len(), 1);
    let argv = plan.ranks[0].vllm_argv();
    for flag in ["--nnodes", "--node-rank", "--master-addr", "--headless"] {
        assert!(!argv.iter().any(|a| a == flag), "{flag}");
    }
}

#[test]
fn host_nccl_mounts_and_preloads() {
    let config = Fixture::new(None).env("USE_HOST_NCCL", "1").config();
    let plan = config.plan();
    assert_eq!(
        env_value(&plan.ranks[0], "LD_PRELOAD").as_deref(),
        Some("/nccl/libnccl.so.2.30.7")
    );
    assert!(plan.ranks[0].container.mounts.contains(&Mount::Bind {
        source: "/home/op/nccl-2.30.7".into(),
        target: "/nccl".into(),
        read_only: true
    }));
}

#[test]
fn rendered_commands_quote_json_and_hide_secrets() {
    let config = Fixture::new(None).env("VLLM_API_KEY", "sk-rank-secret").config();
    let plan = config.plan();
    let run = plan.ranks[0].docker_run_command();
    assert!(!run.contains("sk-rank-secret"));
    assert!(run.contains(" -e VLLM_API_KEY "), "secret passed by name only: {run}");
    assert!(run.contains(r#"'{"method":"dspark","num_speculative_tokens":3}'"#));
    let parsed = shlex_split(&plan.ranks[0].vllm_command());
    assert_eq!(
        &parsed[1..],
        plan.ranks[0].vllm_argv(),
        "the printed command round-trips"
    );
}

fn shlex_split(s: &str) -> Vec<String> {
    // A minimal POSIX-shell splitter for single-quoted words, enough to check round-trips.
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            ' ' if in_word => {
                out.push(std::mem::take(&mut cur));
                in_word = false;
            }
            ' ' => {}
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

#[test]
fn tracing_gives_rank_0_alone_the_collector_and_the_protocol_vllm_speaks() {
    let fx = Fixture::from_file("deepseek.env").env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/");
    let plan = fx.config().plan();
    let rank0 = plan.ranks[0].vllm_argv();
    let at = rank0
        .iter()
        .position(|a| a == "--otlp-traces-endpoint")
        .expect("rank 0 traces");
    assert_eq!(rank0[at + 1], "http://127.0.0.1:4318/v1/traces");
    let env0 = env_of(&plan.ranks[0]);
    assert!(env0.contains(&("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL".into(), "http/protobuf".into())));
    assert!(!plan.ranks[1].vllm_argv().iter().any(|a| a == "--otlp-traces-endpoint"));
    assert!(!env_of(&plan.ranks[1]).iter().any(|(k, _)| k.starts_with("OTEL_")));
    let off = Fixture::from_file("deepseek.env").config().plan();
    assert!(!off.ranks[0].vllm_argv().iter().any(|a| a == "--otlp-traces-endpoint"));
    let refused = Fixture::from_file("deepseek.env")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .load();
    assert!(refused.unwrap_err().to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"));
}
