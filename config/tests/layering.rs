//! Precedence (command line > process environment > `.env` > profile default), sources, aliases,
//! warnings and secret redaction.

mod common;

use common::Fixture;
use sparkgate_config::{Config, LoadOptions, ProfileId, Source, REDACTED};

fn setting(config: &Config, name: &str) -> (String, Source) {
    let s = config
        .settings()
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} listed"));
    (s.value.clone(), s.source.clone())
}

#[test]
fn process_environment_beats_env_file_beats_default() {
    let f = Fixture::new(Some("MAX_MODEL_LEN=500000\nGPU_MEM_UTIL=0.8\n")).env("GPU_MEM_UTIL", "0.7");
    let config = f.config();
    let env_path = f.env_file.clone().unwrap();
    assert_eq!(config.serving.gpu_mem_util, "0.7");
    assert_eq!(setting(&config, "GPU_MEM_UTIL").1, Source::Process);
    assert_eq!(config.serving.max_model_len, 500_000);
    assert_eq!(
        setting(&config, "MAX_MODEL_LEN").1,
        Source::EnvFile {
            path: env_path,
            line: 1
        }
    );
    assert_eq!(config.serving.max_num_batched_tokens, 1024);
    assert_eq!(
        setting(&config, "MAX_NUM_BATCHED_TOKENS").1,
        Source::Profile {
            profile: ProfileId::DeepSeekV41Flash
        }
    );
}

#[test]
fn an_explicitly_empty_process_value_counts_as_set() {
    // .env sets the KV pool; an empty value in the environment wins and omits the flag — the
    // launchers' `[ -n "$x" ]` re-apply would have silently kept the .env value.
    let f = Fixture::new(Some("KV_CACHE_MEMORY_BYTES=3221225472\n")).env("KV_CACHE_MEMORY_BYTES", "");
    let config = f.config();
    assert_eq!(config.serving.kv_cache_memory_bytes, None);
    assert_eq!(
        setting(&config, "KV_CACHE_MEMORY_BYTES"),
        (String::new(), Source::Process)
    );
    assert!(!config.plan().ranks[0]
        .vllm_argv()
        .iter()
        .any(|a| a == "--kv-cache-memory-bytes"));
    // Without the empty override the .env value applies.
    let config = Fixture::new(Some("KV_CACHE_MEMORY_BYTES=3221225472\n")).config();
    assert_eq!(config.serving.kv_cache_memory_bytes, Some(3_221_225_472));
}

#[test]
fn an_empty_required_value_is_an_error_not_a_silent_default() {
    let err = Fixture::new(None)
        .env("MAX_MODEL_LEN", "")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(r#"MAX_MODEL_LEN="" (from process environment): must be an integer between 1 and 1048576"#),
        "{err}"
    );
}

#[test]
fn command_line_profile_beats_environment_and_file() {
    let f = Fixture::new(Some("PROFILE=deepseek-v4.1-flash\n")).env("PROFILE", "deepseek-v4.1-flash");
    let mut options: LoadOptions = f.options();
    options.profile = Some("glm-5.3-flash".into());
    let config = Config::load(&options).unwrap();
    assert_eq!(config.profile, ProfileId::Glm53Flash);
    assert_eq!(setting(&config, "PROFILE").1, Source::CommandLine);
    assert_eq!(config.serving.served_model_name, "GLM-5.3-Flash-EXL3");
    // The profile selects every default.
    assert_eq!(config.serving.max_model_len, 900_000);
    assert_eq!(config.supervision.ready_timeout.as_secs(), 3600);
}

#[test]
fn defaults_follow_other_values_and_the_env_file_location() {
    let f = Fixture::new(Some("NCCL_IB_GID_INDEX=5\nWORKER_USER=zurih\n"));
    let config = f.config();
    assert_eq!(
        config.nodes.head_nic.gid_index, 5,
        "HEAD_GID defaults to NCCL_IB_GID_INDEX"
    );
    assert_eq!(config.nodes.workers[0].nic.gid_index, 5);
    assert_eq!(config.nodes.workers[0].home, "/home/zurih", "another user's home");
    assert_eq!(config.nodes.workers[0].ssh, "zurih@10.0.0.2");
    assert_eq!(config.deploy_dir, f.dir.path());
    assert_eq!(
        config.serving.chat_template_host.as_deref(),
        Some(f.dir.path().join("files/chat_template.jinja").as_path())
    );
    let same_user = Fixture::new(None).config();
    assert_eq!(same_user.nodes.workers[0].home, "/home/op", "the local user's HOME");
}

#[test]
fn workers_list_the_ranks_and_inherit_the_one_worker_settings() {
    let f = Fixture::new(Some(
        "WORKER_SSH_PORT=2200\nWORKER_CX7_IF=enp9\nWORKERS='10.0.0.2, ops@10.0.0.3:22 ,op@10.0.0.4'\n",
    ));
    let config = f.config();
    let w = &config.nodes.workers;
    let seen: Vec<(u32, String, u16, &str, &str, &str)> = w
        .iter()
        .map(|w| {
            (
                w.rank,
                w.ip.to_string(),
                w.ssh_port,
                w.ssh.as_str(),
                w.home.as_str(),
                w.label.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (1, "10.0.0.2".into(), 2200, "op@10.0.0.2", "/home/op", "worker 1"),
            (2, "10.0.0.3".into(), 22, "ops@10.0.0.3", "/home/ops", "worker 2"),
            (3, "10.0.0.4".into(), 2200, "op@10.0.0.4", "/home/op", "worker 3"),
        ]
    );
    assert!(
        w.iter().all(|w| w.nic.ifname == "enp9"),
        "the CX7 pins apply to every worker"
    );
    assert_eq!(
        (config.serving.nnodes, config.serving.tp, config.serving.pp),
        (4, 4, 1),
        "NNODES = 1 + workers, TP = NNODES"
    );
    assert_eq!(
        w[1].path("/home/op/.cache/vllm-dsv41-flash-exl3"),
        "/home/ops/.cache/vllm-dsv41-flash-exl3",
        "a directory under WORKER_HOME follows the worker's home"
    );
    assert_eq!(
        w[1].path("/home/opx/x"),
        "/home/opx/x",
        "only whole path components move"
    );
    assert_eq!(w[1].path("/srv/models"), "/srv/models");
    let nfs = config.preparation.nfs.as_ref().expect("deepseek shares over NFS");
    assert_eq!(
        nfs.clients, "10.0.0.2,10.0.0.3,10.0.0.4",
        "every worker may mount the share"
    );
    let pp = f.with("PP", "2");
    assert_eq!((pp.serving.tp, pp.serving.pp), (4, 2));
    let one = Fixture::new(Some("NNODES=1\n")).config();
    assert!(one.nodes.workers.is_empty());
    assert_eq!(one.serving.tp, 1, "TP follows NNODES");
}

#[test]
fn workers_refuse_a_second_one_worker_form_and_a_wrong_node_count() {
    let f = Fixture::new(Some(
        "WORKERS=10.0.0.2,10.0.0.3\nWORKER_IP=10.0.0.9\nNNODES=4\nTP=3\nPP=1\n",
    ));
    let err = f.load().expect_err("refused").to_string();
    for expected in [
        "WORKER_IP=\"10.0.0.9\" (from env file",
        "must not be set with WORKERS: list the worker in WORKERS instead",
        "NNODES=\"4\"",
        "must be 1 + the 2 WORKERS (3)",
    ] {
        assert!(err.contains(expected), "{expected}\n{err}");
    }
    let pp = Fixture::new(Some("WORKERS=10.0.0.2,10.0.0.3,10.0.0.4\nTP=2\nPP=3\n")).load();
    assert!(pp.expect_err("6 ranks over 4 nodes").to_string().contains("TP=\"2\""),);
    let ok = Fixture::new(Some("WORKERS=10.0.0.2,10.0.0.3,10.0.0.4\nTP=2\nPP=2\n")).config();
    assert_eq!(ok.serving.nnodes, 4);
}

#[test]
fn max_num_seqs_follows_the_mode_unless_set() {
    let f = Fixture::new(None);
    assert_eq!(f.config().speculation.active_mode().max_num_seqs, 2);
    assert_eq!(f.with("SPEC_METHOD", "none").speculation.active_mode().max_num_seqs, 4);
    let pinned = Fixture::new(Some("MAX_NUM_SEQS=3\n")).config();
    assert_eq!(pinned.speculation.active_mode().max_num_seqs, 3);
    assert_eq!(
        pinned
            .speculation
            .modes
            .iter()
            .find(|m| m.method.as_str() == "none")
            .unwrap()
            .max_num_seqs,
        4
    );
}

#[test]
fn launcher_prefixed_aliases_are_accepted() {
    let f = Fixture::new(Some("DSV41_HANG_SECONDS=300\nDSV41_MEM_GUARD=1\n"));
    let config = f.config();
    assert_eq!(config.supervision.hang.as_secs(), 300);
    assert!(config.supervision.mem_guard);
    let s = config.settings().iter().find(|s| s.name == "HANG_SECONDS").unwrap();
    assert_eq!(s.alias, Some("DSV41_HANG_SECONDS"));
    let err = Fixture::new(Some("DSV41_HANG_SECONDS=soon\n"))
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("HANG_SECONDS (set as DSV41_HANG_SECONDS)=\"soon\""),
        "{err}"
    );
}

#[test]
fn unknown_env_file_variables_warn_and_model_knobs_pass_through() {
    let f = Fixture::new(Some(
        "TOTALLY_UNKNOWN=1\nDSV41_NEW_KNOB=7\nDFLASH_TOKENS=5\nNCCL_SOCKET_IFNAME=eth9\n",
    ))
    .env("EXL3_EXPERIMENT", "on");
    let config = f.config();
    let warnings = config.warnings().join("\n");
    assert!(warnings.contains("TOTALLY_UNKNOWN"), "{warnings}");
    assert!(
        warnings.contains("DFLASH_TOKENS") && warnings.contains("not used by the deepseek-v4.1-flash profile"),
        "{warnings}"
    );
    assert!(
        warnings.contains("NCCL_SOCKET_IFNAME") && warnings.contains("ignored"),
        "{warnings}"
    );
    assert!(!warnings.contains("DSV41_NEW_KNOB"));
    let plan = config.plan();
    let env: Vec<(String, String)> = plan.ranks[0]
        .container
        .env
        .iter()
        .filter_map(|(k, v)| match v {
            sparkgate_config::RankEnvValue::Plain(p) => Some((k.clone(), p.clone())),
            _ => None,
        })
        .collect();
    assert!(env.contains(&("DSV41_NEW_KNOB".into(), "7".into())));
    assert!(env.contains(&("EXL3_EXPERIMENT".into(), "on".into())));
    assert!(
        env.contains(&("NCCL_SOCKET_IFNAME".into(), "enp1s0f1np1".into())),
        "the pin, not the generic value"
    );
    assert!(!env.iter().any(|(k, _)| k == "TOTALLY_UNKNOWN"));
}

#[test]
fn long_prefill_threshold_beyond_the_batch_warns() {
    let config = Fixture::from_file("deepseek.env").config();
    assert!(
        config
            .warnings()
            .iter()
            .any(|w| w.starts_with("LONG_PREFILL_TOKEN_THRESHOLD=1792")),
        "{:?}",
        config.warnings()
    );
}

#[test]
fn secrets_are_redacted_everywhere_they_could_be_printed() {
    let f = Fixture::new(Some("HF_TOKEN=hf_file_secret\n"))
        .env("GHCR_TOKEN", "ghp_process_secret")
        .env("VLLM_API_KEY", "sk-rank-secret")
        .env("API_KEYS", "key-one,key-two")
        .env("ADMIN_TOKEN", "admin-secret");
    let config = f.config();
    let secrets = [
        "hf_file_secret",
        "ghp_process_secret",
        "sk-rank-secret",
        "key-one",
        "key-two",
        "admin-secret",
    ];
    let renderings = [
        sparkgate_config::settings_table(&config),
        serde_json::to_string(&config.settings_json()).unwrap(),
        format!("{config:?}"),
        serde_json::to_string(&config.plan()).unwrap(),
        config.plan().ranks[0].docker_run_command(),
    ];
    for text in &renderings {
        for s in secrets {
            assert!(!text.contains(s), "{s} leaked into: {}", &text[..text.len().min(200)]);
        }
    }
    assert!(
        renderings[0].contains(&format!("HF_TOKEN='{REDACTED}'")),
        "{}",
        renderings[0]
    );
    assert_eq!(config.secrets.api_keys.len(), 2);
    assert_eq!(config.secrets.vllm_api_key.as_ref().unwrap().expose(), "sk-rank-secret");
    // A bad secret value is reported without echoing it.
    let err = Fixture::new(None)
        .env("PORT", "x")
        .env("ADMIN_TOKEN", "admin-secret")
        .load()
        .unwrap_err()
        .to_string();
    assert!(!err.contains("admin-secret"));
}

#[test]
fn missing_or_broken_env_files_are_clear_errors() {
    let f = Fixture::new(None);
    let mut options = f.options();
    options.env_file = Some(f.dir.path().join("nope.env"));
    let err = Config::load(&options).unwrap_err().to_string();
    assert!(
        err.starts_with("cannot read env file") && err.contains("nope.env"),
        "{err}"
    );
    let err = Fixture::new(Some("A=1\nB='x\n")).load().unwrap_err().to_string();
    assert!(err.contains(".env:2: unterminated single quote"), "{err}");
}

#[test]
fn gateway_settings_default_to_the_local_rank_and_parse_maps() {
    let config = Fixture::new(None)
        .env("VLLM_PORT", "19000")
        .env("MODEL_ALIASES", "ds, deepseek ")
        .config();
    let g = &config.gateway;
    assert_eq!(
        g.upstream, "http://127.0.0.1:19000",
        "rank 0's loopback port follows VLLM_PORT"
    );
    assert_eq!(g.model_aliases, vec!["ds", "deepseek"]);
    assert_eq!(
        g.effort_map,
        vec![
            ("minimal".into(), "low".into()),
            ("medium".into(), "high".into()),
            ("xhigh".into(), "max".into())
        ]
    );
    assert_eq!(g.rate_limit_rpm, None);
    let limited = Fixture::new(None)
        .env("RATE_LIMIT_RPM", "60")
        .env("UPSTREAM_URL", "http://127.0.0.1:8000/")
        .config();
    assert_eq!(
        (limited.gateway.rate_limit_rpm, limited.gateway.rate_limit_burst),
        (Some(60), 60)
    );
    assert_eq!(limited.gateway.upstream, "http://127.0.0.1:8000");
}

#[test]
fn a_groups_file_gives_each_group_its_own_nodes_ports_logs_and_containers() {
    let f = Fixture::new(Some(
        "GROUPS_FILE=groups.env\nLOG_DIR=/var/log/sg\nSPEC_METHOD=dspark\n",
    ));
    std::fs::write(
        f.dir.path().join("groups.env"),
        "# two groups of two Sparks\n[a]\nHEAD_IP=10.0.0.1\nWORKER_IP=10.0.0.2\n\n[b]\nHEAD_IP=10.0.0.3\nWORKERS=10.0.0.4\nSPEC_METHOD=none\n",
    )
    .unwrap();
    let groups = sparkgate_config::Config::load_groups(&f.options()).unwrap();
    let seen: Vec<(&str, String, String, String, String)> = groups
        .iter()
        .map(|g| {
            let c = &g.config;
            (
                g.name.as_str(),
                c.nodes.head_ip.to_string(),
                c.nodes.workers[0].ip.to_string(),
                c.supervision.log_dir.display().to_string(),
                c.containers.head_name.clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "a",
                "10.0.0.1".into(),
                "10.0.0.2".into(),
                "/var/log/sg/a".into(),
                "dsv41-exl3-head-a".into()
            ),
            (
                "b",
                "10.0.0.3".into(),
                "10.0.0.4".into(),
                "/var/log/sg/b".into(),
                "dsv41-exl3-head-b".into()
            ),
        ]
    );
    assert_eq!(groups[0].config.speculation.active.to_string(), "dspark");
    assert_eq!(
        groups[1].config.speculation.active.to_string(),
        "none",
        "a section wins over the env file"
    );
    let single = sparkgate_config::Config::load_groups(&Fixture::new(None).options()).unwrap();
    assert_eq!(
        (single.len(), single[0].name.as_str()),
        (1, sparkgate_config::SINGLE_GROUP)
    );
}

#[test]
fn a_groups_file_refuses_shared_settings_unknown_names_and_clashing_ports() {
    let f = Fixture::new(Some("GROUPS_FILE=groups.env\n"));
    std::fs::write(
        f.dir.path().join("groups.env"),
        "[a]\nPORT=9000\nHEAD_IPP=10.0.0.1\n[b]\nWORKER_IP=10.0.0.9\nSCHEDULING_POLICY=priority\n",
    )
    .unwrap();
    let err = sparkgate_config::Config::load_groups(&f.options())
        .unwrap_err()
        .to_string();
    for expected in [
        "[a] PORT=\"9000\" (from env file",
        "groups.env:2): must be the same for every group: set it outside GROUPS_FILE",
        "[a] HEAD_IPP=\"10.0.0.1\"",
        "is not a sparkgate variable",
        "[b] SCHEDULING_POLICY=\"priority\"",
        "[b] VLLM_PORT=\"18888\"",
        "must differ from every other group on head 10.0.0.1",
    ] {
        assert!(err.contains(expected), "{expected}\n{err}");
    }
    for (text, expected) in [
        (
            "HEAD_IP=10.0.0.1\n[a]\n",
            "groups.env:1: a line before the first `[group]` section",
        ),
        ("[a]\n[a]\n", "groups.env:2: group `a` appears twice"),
        ("[a b]\n", "a section name is letters, digits, ., - and _"),
        ("# nothing\n", "no `[group]` section"),
    ] {
        std::fs::write(f.dir.path().join("groups.env"), text).unwrap();
        let err = sparkgate_config::Config::load_groups(&f.options())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{expected}\n{err}");
    }
}
