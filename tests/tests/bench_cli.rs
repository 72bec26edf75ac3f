//! `sparkgate bench` against vllm-sim directly and through the gateway: the figures it writes,
//! its coherence check, and its errors for unusable input; `sparkgate smoke` through the gateway.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{ds_pair, DS, SIM};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::test_gateway::sparkgate_bin;

fn bench(args: &[&str]) -> (i32, String, String, Option<Value>) {
    let out_file = tempfile::NamedTempFile::new().expect("temp file");
    let out_path = out_file.path().to_str().expect("utf-8").to_owned();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--out", &out_path]);
    let out = Command::new(sparkgate_bin(SIM))
        .arg("bench")
        .args(&all)
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("run sparkgate bench");
    let json = std::fs::read_to_string(&out_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        json,
    )
}

#[test]
fn bench_reports_every_phase_and_concurrency_with_exact_token_counts() {
    let sim = Sim::start(SIM, DS, &[("SIM_SPEED", "40")]);
    let base = format!("http://{}/v1", sim.addr());
    let (code, stdout, stderr, json) = bench(&[
        "--base-url",
        &base,
        "--runs",
        "2",
        "--concurrency",
        "1,3",
        "--max-tokens",
        "48",
        "--ignore-eos",
        "--skip-coherence",
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let json = json.expect("--out JSON");
    assert_eq!(
        json["model"], "DeepSeek-v4.1-Flash-EXL3",
        "the model comes from /v1/models"
    );
    let aggregates = json["aggregates"].as_array().expect("aggregates");
    let cells: Vec<(String, u64, u64)> = aggregates
        .iter()
        .map(|a| {
            (
                a["phase"].as_str().unwrap().to_owned(),
                a["concurrency"].as_u64().unwrap(),
                a["requests"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            ("structured".into(), 1, 2),
            ("structured".into(), 3, 6),
            ("prose".into(), 1, 2),
            ("prose".into(), 3, 6)
        ]
    );
    for a in aggregates {
        assert_eq!(a["failed"], 0, "{a}");
        assert!(a["aggregate_tokens_per_s_median"].as_f64() > Some(0.0), "{a}");
        assert!(a["ttft_s_median"].as_f64() > Some(0.0), "{a}");
        assert!(a["itl_s_p95"].as_f64() >= a["itl_s_median"].as_f64(), "{a}");
    }
    // With ignore_eos every request decodes exactly max_tokens (from the stream's usage).
    for cell in json["requests"].as_array().unwrap() {
        for run in cell["runs"].as_array().unwrap() {
            for r in run.as_array().unwrap() {
                assert_eq!(r["tokens"], 48, "{r}");
                assert_eq!(r["ok"], true, "{r}");
            }
        }
    }
    assert!(stdout.contains("structured") && stdout.contains("prose"), "{stdout}");
    // Every request reached the simulator: (2×1 + 2×3) per phase × 2 phases × 48 tokens.
    assert_eq!(sim.state()["generation_tokens"], 16 * 48, "{}", sim.state());
}

#[test]
fn the_coherence_check_fails_answers_that_are_not_json_for_the_structured_phase() {
    let (_sim, gw) = ds_pair(&[("SIM_SPEED", "instant")], &[]);
    let (code, stdout, stderr, json) = bench(&[
        "--base-url",
        &gw.base_url(),
        "--runs",
        "1",
        "--concurrency",
        "2",
        "--max-tokens",
        "40",
    ]);
    // The structured answer (a JSON array of 150 numbers, 301 tokens) is cut at 40 tokens:
    // it fails the check, saying so; prose passes it.
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(stderr.contains("unusable answer"), "{stderr}");
    assert!(
        stderr.contains("structured answer is not a JSON object or array (cut at max_tokens: raise --max-tokens)"),
        "{stderr}"
    );
    let json = json.expect("--out JSON");
    let agg = json["aggregates"].as_array().unwrap();
    assert_eq!(agg[0]["phase"], "structured");
    assert_eq!(agg[0]["incoherent"], 2, "{}", agg[0]);
    assert_eq!(agg[1]["phase"], "prose");
    assert_eq!(agg[1]["incoherent"], 0, "{}", agg[1]);
    assert_eq!(agg[1]["failed"], 0, "{}", agg[1]);
}

#[test]
fn the_default_run_passes_the_coherence_check_against_the_simulator() {
    let (_sim, gw) = ds_pair(&[("SIM_SPEED", "instant")], &[]);
    let (code, stdout, stderr, json) = bench(&["--url", &gw.base_url(), "--runs", "1", "--concurrency", "1"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let json = json.expect("--out JSON");
    for agg in json["aggregates"].as_array().unwrap() {
        assert_eq!(
            (agg["failed"].as_u64(), agg["incoherent"].as_u64()),
            (Some(0), Some(0)),
            "{agg}"
        );
    }
}

#[test]
fn unusable_input_gets_a_clear_error() {
    let cases: [(&[&str], &str); 5] = [
        // HTTPS is spoken (tests/tests/service_tls.rs runs it against a TLS gateway).
        (
            &["--base-url", "https://127.0.0.1:1/v1"],
            "nothing answers at https://127.0.0.1:1/v1/models",
        ),
        (
            &["--base-url", "ftp://127.0.0.1:1/v1"],
            "must look like http://host:port/v1",
        ),
        (&["--base-url", "not a url"], "is not a URL"),
        (
            &["--base-url", "http://127.0.0.1:1/v1"],
            "nothing answers at http://127.0.0.1:1/v1/models",
        ),
        (&["--concurrency", "0"], "0 is not in 1..=4096"),
    ];
    for (args, expected) in cases {
        let (code, stdout, stderr, _) = bench(args);
        assert_ne!(code, 0, "{args:?}: {stdout}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

fn smoke(url: &str) -> (i32, String) {
    let out = Command::new(sparkgate_bin(SIM))
        .args(["smoke", "--url", url, "--timeout-s", "30"])
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("run sparkgate smoke");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn smoke_passes_through_the_gateway_and_fails_clearly_without_one() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "instant")], &[]);
    let (code, out) = smoke(&format!("http://{}", gw.addr));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("smoke: pass in ") && out.contains("323"), "{out}");
    assert_eq!(
        sim.state()["generation_tokens"],
        1,
        "one answer token went through: {}",
        sim.state()
    );

    let (code, out) = smoke("http://127.0.0.1:1");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("smoke: FAIL") && out.contains("nothing answers at http://127.0.0.1:1"),
        "{out}"
    );
}
