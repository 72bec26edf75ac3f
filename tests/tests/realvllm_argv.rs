//! The launch plan's `vllm serve` argv, for every profile, mode and rank (and the plan's
//! variants), goes through each vLLM release's own argument parser (0.33.0 and 0.34.0), serve-argument validation and
//! engine-config construction (`tests/realvllm/check_argv.py`). Paths that exist only in the
//! deployment image are replaced by stand-ins; `--quantization exl3` is the one flag the stock
//! package cannot take (the image's plugin), so it is dropped and must be the only thing dropped.

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::realvllm::{every_plan_argv, fixture_profile, python, script, test_config};

/// Runs `release`'s checker on `cases`; one verdict per case, in order.
fn check(release: VllmRelease, cases: &[Value]) -> Vec<Value> {
    let mut child = Command::new(python(release))
        .arg(script("check_argv.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run check_argv.py");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(Value::from(cases.to_vec()).to_string().as_bytes())
        .expect("write cases");
    let out = child.wait_with_output().expect("checker finishes");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let verdicts: Vec<Value> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("argv-check: "))
        .map(|l| serde_json::from_str(l).expect("verdict JSON"))
        .collect();
    assert_eq!(
        verdicts.len(),
        cases.len(),
        "one verdict per case; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    verdicts
}

#[test]
fn every_plan_argv_is_accepted_by_vllm_itself() {
    let cases: Vec<Value> = every_plan_argv()
        .into_iter()
        .map(|p| json!({"name": p.name, "profile": fixture_profile(p.profile), "argv": p.argv}))
        .collect();
    assert!(cases.len() >= 40, "{} argv", cases.len());
    for (release, v) in VllmRelease::ALL
        .into_iter()
        .flat_map(|r| check(r, &cases).into_iter().map(move |v| (r, v)))
    {
        assert_eq!(v["ok"], true, "{release} {}: {}", v["name"], v["error"]);
        assert_eq!(
            v["dropped"],
            json!(["exl3"]),
            "{}: only EXL3 is the image's own",
            v["name"]
        );
    }
}

#[test]
fn a_wrong_flag_or_value_is_refused_by_vllm() {
    let c = test_config(ProfileId::DeepSeekV41Flash, &[]);
    let argv = c.plan().ranks[0].vllm_argv().to_vec();
    let with = |extra: &[&str]| {
        let mut a = argv.clone();
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        json!({"name": format!("{extra:?}"), "profile": "deepseek", "argv": a})
    };
    let bad = [
        with(&["--no-such-flag", "1"]),
        with(&["--max-num-seqs", "two"]),
        with(&[
            "--speculative-config",
            r#"{"method":"dspark","num_speculative_tokens":3,"disable_by_batch_size":4}"#,
        ]),
    ];
    for (release, v) in VllmRelease::ALL
        .into_iter()
        .flat_map(|r| check(r, &bad).into_iter().map(move |v| (r, v)))
    {
        assert_eq!(v["ok"], false, "{release} {} must be refused", v["name"]);
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
}
