//! vllm-sim's command line checks sparkgate's generated plans: every flag the plan produces for
//! either profile, rank and mode is accepted; a wrong flag or value is refused as vLLM would.

use sparkgate_config::ProfileId;
use sparkgate_tests::sim::parse_args;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn config(profile: ProfileId, extra: &[(&str, &str)]) -> sparkgate_config::Config {
    sparkgate_tests::realvllm::test_config(profile, extra)
}

#[test]
fn every_plan_argv_is_accepted() {
    let all = sparkgate_tests::realvllm::every_plan_argv();
    for p in &all {
        let parsed = parse_args(&p.argv).unwrap_or_else(|e| panic!("{}: {}\n{:?}", p.name, e.message, p.argv));
        assert_eq!(parsed.node_rank, p.rank);
        assert_eq!(parsed.headless, p.rank > 0);
        assert_eq!(parsed.max_num_seqs, p.max_num_seqs);
        assert_eq!(parsed.speculative.is_some(), p.speculative);
    }
    assert!(all.len() >= 40, "{} argv checked", all.len());
}

#[test]
fn a_wrong_flag_or_value_is_refused_by_the_process() {
    let c = config(ProfileId::DeepSeekV41Flash, &[]);
    let mut argv = c.plan().ranks[0].vllm_argv().to_vec();
    argv.push("--max-num-seq".into());
    argv.push("4".into());
    let out = std::process::Command::new(SIM).args(&argv).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("usage: vllm serve"), "{stderr}");
    assert!(
        stderr.contains("vllm serve: error: unrecognized arguments: --max-num-seq 4"),
        "{stderr}"
    );

    let out = std::process::Command::new(SIM)
        .args(["serve", "/m", "--gpu-memory-utilization", "most"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("argument --gpu-memory-utilization: invalid float value: 'most'")
    );

    let out = std::process::Command::new(SIM)
        .args([
            "serve",
            "/m",
            "--speculative-config",
            r#"{"method":"mtp","num_speculative_tokens":2,"disable_by_batch_size":4}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Extra inputs are not permitted"));
}
