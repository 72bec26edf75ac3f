//! Every validation rule: the message names the variable, its value, its source and the rule.

mod common;

use common::Fixture;

/// (profile, variable, bad value, expected rule text)
const CASES: &[(&str, &str, &str, &str)] = &[
    (
        "deepseek-v4.1-flash",
        "PROFILE",
        "llama",
        "must be one of: deepseek-v4.1-flash, glm-5.3-flash",
    ),
    (
        "deepseek-v4.1-flash",
        "GPU_MEM_UTIL",
        "0",
        "must be a decimal number in (0, 1]",
    ),
    (
        "deepseek-v4.1-flash",
        "GPU_MEM_UTIL",
        "1.2",
        "must be a decimal number in (0, 1]",
    ),
    (
        "deepseek-v4.1-flash",
        "GPU_MEM_UTIL",
        "9e-1",
        "must be a decimal number in (0, 1]",
    ),
    (
        "deepseek-v4.1-flash",
        "MAX_MODEL_LEN",
        "0",
        "must be an integer between 1 and 1048576",
    ),
    (
        "deepseek-v4.1-flash",
        "MAX_MODEL_LEN",
        "1048577",
        "must be an integer between 1 and 1048576",
    ),
    (
        "glm-5.3-flash",
        "MAX_MODEL_LEN",
        "1000001",
        "must be an integer between 1 and 1000000",
    ),
    (
        "deepseek-v4.1-flash",
        "MAX_NUM_SEQS",
        "65537",
        "must be an integer between 1 and 65536",
    ),
    (
        "deepseek-v4.1-flash",
        "MAX_NUM_SEQS",
        "two",
        "must be an integer between 1 and 65536",
    ),
    (
        "deepseek-v4.1-flash",
        "MAX_NUM_BATCHED_TOKENS",
        "8388609",
        "must be an integer between 1 and 8388608",
    ),
    (
        "glm-5.3-flash",
        "MAX_NUM_BATCHED_TOKENS",
        "8192",
        "must be an integer between 1 and 8191 (glm guide",
    ),
    ("glm-5.3-flash", "KV_CACHE_DTYPE", "bf16", "must be fp8 for glm"),
    (
        "glm-5.3-flash",
        "EXTRA_ARGS",
        "--moe-backend marlin",
        "must not pass --moe-backend marlin",
    ),
    (
        "glm-5.3-flash",
        "EXTRA_ARGS",
        "--moe-backend=marlin",
        "must not pass --moe-backend marlin",
    ),
    (
        "glm-5.3-flash",
        "EXTRA_ARGS",
        "--attention-backend TRITON_ATTN",
        "must not pin TRITON_ATTN with DFlash2",
    ),
    (
        "deepseek-v4.1-flash",
        "KV_CACHE_DTYPE",
        "fp8",
        "must stay empty for deepseek",
    ),
    (
        "deepseek-v4.1-flash",
        "EXTRA_ARGS",
        "--kv-cache-dtype fp8",
        "must not pass --kv-cache-dtype for deepseek",
    ),
    (
        "deepseek-v4.1-flash",
        "EXTRA_ARGS",
        "--port 9000",
        "must not set --port",
    ),
    (
        "deepseek-v4.1-flash",
        "EXTRA_ARGS",
        "--scheduling-policy=priority",
        "must not set --scheduling-policy",
    ),
    (
        "deepseek-v4.1-flash",
        "EXTRA_ARGS",
        "--seed 'open",
        "must be shell words with balanced quotes",
    ),
    (
        "deepseek-v4.1-flash",
        "DSPARK_TOKENS",
        "6",
        "must be an integer between 1 and 5",
    ),
    (
        "glm-5.3-flash",
        "DFLASH_TOKENS",
        "0",
        "must be an integer between 1 and 16",
    ),
    ("glm-5.3-flash", "MTP_TOKENS", "9", "must be an integer between 0 and 8"),
    (
        "glm-5.3-flash",
        "DFLASH_DRAFT_TP",
        "3",
        "must be an integer between 1 and 2",
    ),
    (
        "deepseek-v4.1-flash",
        "SPEC_METHOD",
        "dflash",
        "must be one of: dspark, none",
    ),
    (
        "glm-5.3-flash",
        "SPEC_METHOD",
        "dspark",
        "must be one of: dflash, mtp, none",
    ),
    ("deepseek-v4.1-flash", "VLLM_PORT", "8888", "must differ from PORT"),
    ("deepseek-v4.1-flash", "MASTER_PORT", "8888", "must differ from PORT"),
    (
        "deepseek-v4.1-flash",
        "PORT",
        "70000",
        "must be an integer between 0 and 65535",
    ),
    (
        "deepseek-v4.1-flash",
        "HEAD_IP",
        "10.0.0.300",
        "must be an IPv4 or IPv6 address",
    ),
    (
        "deepseek-v4.1-flash",
        "WORKER_IP",
        "spark2",
        "must be an IPv4 or IPv6 address",
    ),
    ("deepseek-v4.1-flash", "TP", "3", "must be a multiple of NNODES"),
    (
        "deepseek-v4.1-flash",
        "NNODES",
        "3",
        "must be 1 or 2 without WORKERS: list every worker in WORKERS for more nodes",
    ),
    (
        "deepseek-v4.1-flash",
        "NNODES",
        "65",
        "must be an integer between 1 and 64",
    ),
    (
        "glm-5.3-flash",
        "WORKERS",
        "10.0.0.2,spark-3",
        "`spark-3` must be [user@]address[:ssh-port] with an IP address",
    ),
    (
        "glm-5.3-flash",
        "WORKERS",
        "10.0.0.2,10.0.0.3,10.0.0.2",
        "must list each worker once: 10.0.0.2 is listed twice",
    ),
    ("deepseek-v4.1-flash", "ENFORCE_EAGER", "yes", "must be 0 or 1"),
    (
        "deepseek-v4.1-flash",
        "LIMIT_MM",
        "{image:100}",
        "must be a JSON object",
    ),
    (
        "glm-5.3-flash",
        "GLM53_DEFAULT_REASONING_EFFORT",
        "medium",
        "must be one of: (empty), low, high, max",
    ),
    (
        "deepseek-v4.1-flash",
        "GLM53_INDEXER_WORKSPACE",
        "huge",
        "must be one of: stock, rightsize",
    ),
    (
        "deepseek-v4.1-flash",
        "GLM53_SPINWAIT_MS",
        "0",
        "must be `stock` or an integer between 1 and 1000",
    ),
    (
        "deepseek-v4.1-flash",
        "WEIGHT_SYNC",
        "share",
        "must be one of: nfs, rsync, zfs, none",
    ),
    ("deepseek-v4.1-flash", "RANK_GPUS", "2", "must be one of: all, none"),
    (
        "deepseek-v4.1-flash",
        "OOM_SCORE_ADJ",
        "-1001",
        "must be an integer between -1000 and 1000",
    ),
    (
        "deepseek-v4.1-flash",
        "CONTAINER_HEAD",
        "bad name",
        "must be a Docker container name",
    ),
    (
        "deepseek-v4.1-flash",
        "CONTAINER_WORKER",
        "dsv41-exl3-head",
        "must differ from CONTAINER_HEAD",
    ),
    (
        "deepseek-v4.1-flash",
        "SERVED_MODEL_NAME",
        "my model",
        "must not contain whitespace",
    ),
    (
        "deepseek-v4.1-flash",
        "READY_TIMEOUT",
        "0",
        "must be an integer between 1 and 604800",
    ),
    (
        "deepseek-v4.1-flash",
        "MEM_GUARD_GIB",
        "-1",
        "must be a decimal number in (0, 1024]",
    ),
    ("deepseek-v4.1-flash", "IMAGE", "", "must not be empty"),
    (
        "deepseek-v4.1-flash",
        "UPSTREAM_URL",
        "ftp://10.0.0.1",
        "must be an http:// URL",
    ),
    // Passed the old prefix check, then panicked the gateway on every request.
    (
        "deepseek-v4.1-flash",
        "UPSTREAM_URL",
        "http://[::1",
        "must be an http:// URL",
    ),
    (
        "deepseek-v4.1-flash",
        "UPSTREAM_URL",
        "http://host:99999999",
        "must be an http:// URL",
    ),
    (
        "deepseek-v4.1-flash",
        "REASONING_EFFORT_MAP",
        "medium=ultra",
        "`medium=ultra`: deepseek-v4.1-flash accepts low, high, max, none, an integer 1-100",
    ),
    (
        "glm-5.3-flash",
        "REASONING_EFFORT_MAP",
        "medium=60",
        "`medium=60`: glm-5.3-flash accepts low, high, max, none",
    ),
    (
        "deepseek-v4.1-flash",
        "REASONING_EFFORT_MAP",
        "turbo=high",
        "`turbo` is not an effort name",
    ),
    (
        "deepseek-v4.1-flash",
        "QUEUE_DEPTH",
        "-1",
        "must be an integer between 0 and 1000000",
    ),
    ("deepseek-v4.1-flash", "LOG_FORMAT", "xml", "must be one of: text, json"),
    (
        "deepseek-v4.1-flash",
        "RATE_LIMIT_RPM",
        "fast",
        "must be an integer between 0 and 1000000",
    ),
    (
        "deepseek-v4.1-flash",
        "MAX_BODY_BYTES",
        "10",
        "must be an integer between 1024 and 1073741824",
    ),
];

#[test]
fn each_rule_names_variable_value_source_and_range_from_the_environment() {
    for (profile, name, value, rule) in CASES {
        let f = Fixture::new(None).env("PROFILE", profile).env(name, value);
        let err = f
            .load()
            .expect_err(&format!("{name}={value} must be refused"))
            .to_string();
        let expected = format!("{name}={value:?} (from process environment): {rule}");
        assert!(
            err.contains(&expected),
            "{profile} {name}={value}\n  expected: {expected}\n  got: {err}"
        );
    }
}

#[test]
fn each_rule_reports_the_env_file_line() {
    for (profile, name, value, rule) in CASES
        .iter()
        .filter(|c| c.1 != "PROFILE" && c.1 != "EXTRA_ARGS" && c.1 != "LIMIT_MM")
    {
        let text = format!("PROFILE={profile}\n{name}='{value}'\n");
        let f = Fixture::new(Some(&text));
        let err = f
            .load()
            .expect_err(&format!("{name}={value} must be refused"))
            .to_string();
        let path = f.env_file.as_ref().unwrap().display().to_string();
        let expected = format!("{name}={value:?} (from env file {path}:2): {rule}");
        assert!(err.contains(&expected), "expected: {expected}\n  got: {err}");
    }
}

#[test]
fn all_problems_are_reported_at_once() {
    let err = Fixture::new(None)
        .env("MAX_NUM_SEQS", "0")
        .env("GPU_MEM_UTIL", "2")
        .env("HEAD_IP", "x")
        .load()
        .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("invalid configuration (3 problems):"), "{text}");
    for name in ["MAX_NUM_SEQS", "GPU_MEM_UTIL", "HEAD_IP"] {
        assert!(text.contains(&format!("\n  {name}=")), "{text}");
    }
}

#[test]
fn valid_edge_values_are_accepted() {
    for (name, value) in [
        ("GPU_MEM_UTIL", "1"),
        ("GPU_MEM_UTIL", "1.0"),
        ("GPU_MEM_UTIL", ".5"),
        ("MAX_NUM_SEQS", "0004"),
        ("DSPARK_TOKENS", "5"),
        ("HEAD_IP", "::1"),
        ("OOM_SCORE_ADJ", "-1000"),
    ] {
        let f = Fixture::new(None).env(name, value);
        f.load().unwrap_or_else(|e| panic!("{name}={value} should load: {e}"));
    }
    assert_eq!(
        Fixture::new(None)
            .env("MAX_NUM_SEQS", "0004")
            .config()
            .speculation
            .active_mode()
            .max_num_seqs,
        4
    );
}
