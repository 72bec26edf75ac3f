//! The `sparkgate` binary's configuration commands, run as a user would run them.

use std::path::Path;
use std::process::{Command, Output};

fn sparkgate(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sparkgate"));
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("HOME", "/home/op")
        .env("USER", "op");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run sparkgate")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn config_lists_every_value_with_its_source_and_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "MAX_MODEL_LEN=500000\nHF_TOKEN=hf_secret_in_file\nSTRAY=1\n",
    )
    .unwrap();
    let out = sparkgate(
        dir.path(),
        &["config"],
        &[("GPU_MEM_UTIL", "0.8"), ("ADMIN_TOKEN", "admin-secret")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let env_file = dir.path().join(".env").display().to_string();
    assert!(
        stdout.contains(&format!("MAX_MODEL_LEN=500000  # env file {env_file}:1")),
        "{stdout}"
    );
    assert!(stdout.contains("GPU_MEM_UTIL=0.8  # process environment"), "{stdout}");
    assert!(
        stdout.contains("MAX_NUM_BATCHED_TOKENS=1024  # deepseek-v4.1-flash profile default"),
        "{stdout}"
    );
    assert!(stdout.contains("HF_TOKEN='<redacted>'"), "{stdout}");
    let all = format!("{stdout}{}", text(&out.stderr));
    assert!(!all.contains("hf_secret_in_file") && !all.contains("admin-secret"));
    assert!(
        text(&out.stderr).contains("warning: STRAY"),
        "unknown .env variables are warned about"
    );

    let out = sparkgate(dir.path(), &["config", "--json"], &[("ADMIN_TOKEN", "admin-secret")]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["profile"], "deepseek-v4.1-flash");
    let settings = json["settings"].as_array().unwrap();
    let admin = settings.iter().find(|s| s["name"] == "ADMIN_TOKEN").unwrap();
    assert_eq!(admin["value"], "<redacted>");
    assert_eq!(admin["source"]["kind"], "process");
    assert!(!text(&out.stdout).contains("admin-secret"));
}

#[test]
fn invalid_configuration_exits_64_naming_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let out = sparkgate(dir.path(), &["plan"], &[("MAX_NUM_SEQS", "0"), ("GPU_MEM_UTIL", "1.5")]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(r#"MAX_NUM_SEQS="0" (from process environment): must be an integer between 1 and 65536"#),
        "{stderr}"
    );
    assert!(stderr.contains(r#"GPU_MEM_UTIL="1.5""#), "{stderr}");
    assert!(out.stdout.is_empty());

    let out = sparkgate(dir.path(), &["--env-file", "missing.env", "config"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("cannot read env file"),
        "{}",
        text(&out.stderr)
    );

    let out = sparkgate(dir.path(), &["--profile", "llama", "config"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains(r#"PROFILE="llama" (from command line): must be one of"#),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn plan_prints_pasteable_commands_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("HEAD_IP", "127.0.0.1"),
        ("WORKER_IP", "127.0.0.2"),
        ("VLLM_API_KEY", "sk-secret"),
    ];
    let out = sparkgate(dir.path(), &["--profile", "glm-5.3-flash", "plan"], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let worker = stdout
        .find("# rank 1 on worker (ssh op@127.0.0.2 port 22)")
        .expect("worker section");
    let head = stdout.find("# rank 0 on head").expect("head section");
    assert!(worker < head, "workers are listed (and started) first");
    assert!(stdout.contains("docker run -d --name glm53-exl3-worker"));
    assert!(stdout.contains("vllm serve /root/.cache/huggingface/hub/models--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/"));
    assert!(!stdout.contains("sk-secret"));

    let out = sparkgate(
        dir.path(),
        &["--profile", "glm-5.3-flash", "plan", "--json", "--rank", "1"],
        &env,
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ranks = json["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 1);
    assert_eq!(ranks[0]["rank"], 1);
    assert_eq!(ranks[0]["container"]["env"]["VLLM_API_KEY"], "<redacted>");
    assert!(ranks[0]["container"]["cmd"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--headless"));

    let out = sparkgate(dir.path(), &["plan", "--rank", "2"], &env);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--rank 2"), "{}", text(&out.stderr));
}

#[test]
fn readme_configuration_reference_matches_the_code() {
    let dir = tempfile::tempdir().unwrap();
    let out = sparkgate(dir.path(), &["config", "--reference"], &[]);
    assert!(out.status.success());
    let generated = text(&out.stdout);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md"))
        .expect("docs/configuration.md");
    let start =
        readme.find("<!-- config-reference:start -->").expect("start marker") + "<!-- config-reference:start -->".len();
    let end = readme.find("<!-- config-reference:end -->").expect("end marker");
    assert_eq!(
        readme[start..end].trim(),
        generated.trim(),
        "docs/configuration.md's reference is stale: regenerate it with `sparkgate config --reference`"
    );
}
