//! The gateway knows its vLLM: it reads rank 0's `/version`, names it in `/admin/status`,
//! `sparkgate status` and `/metrics` (`sparkgate_upstream_info`), and applies the rules of that
//! release (`gateway/src/api/releases.rs`, one test per row) — in front of each real frontend,
//! and in front of vllm-sim reporting releases sparkgate does not know.

use serde_json::json;
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::harness::{Gateway, Sim};
use sparkgate_tests::http::request;
use sparkgate_tests::load::deepseek_sim_args;
use sparkgate_tests::realvllm::RealVllm;
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

/// The gateway's view once it has read the upstream's version.
fn known(gw: &Gateway, version: &str) -> serde_json::Value {
    gw.wait_status(&format!("vLLM {version} read"), |s| s["vllm"]["version"] == version)
}

fn metrics(gw: &Gateway) -> String {
    request(gw.addr, "GET", "/metrics", &[], b"").text()
}

/// `sparkgate_request_repairs_total{rule="empty_tools"}`, 0 before the first.
fn empty_tools_repairs(gw: &Gateway) -> u64 {
    let text = metrics(gw);
    let line = text
        .lines()
        .find(|l| l.starts_with("sparkgate_request_repairs_total{rule=\"empty_tools\"}"));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
}

/// `sparkgate status` against `gw`, as printed.
fn status_text(gw: &Gateway) -> String {
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["status", "--url", &format!("http://{}", gw.addr)])
        .output()
        .expect("sparkgate status runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `empty_tools` row: LiteLLM's `tools: []` is answered on both releases — repaired before
/// 0.33 (which refuses it), left for 0.34 (which reads it as no tools).
fn empty_tools_row(gw: &Gateway, release: VllmRelease) {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "tools": [], "tool_choice": "auto"});
    let before = empty_tools_repairs(gw);
    let r = request(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{release}: {}", r.text());
    let repaired = empty_tools_repairs(gw) - before;
    assert_eq!(
        repaired,
        u64::from(release == VllmRelease::V0_33),
        "{release}: empty_tools repairs"
    );
}

#[test]
fn in_front_of_each_real_frontend_the_gateway_names_it_and_applies_its_rules() {
    let reals: Vec<_> = VllmRelease::ALL
        .into_iter()
        .map(|r| std::thread::spawn(move || RealVllm::start(r, ProfileId::DeepSeekV41Flash)))
        .collect();
    for handle in reals {
        let real = handle.join().expect("the reference frontend starts");
        let release = real.release;
        let gw = TestGateway::builder(SIM).upstream(real.addr).start();
        let s = known(&gw, release.version());
        assert_eq!(
            (&s["vllm"]["rules"], &s["vllm"]["fit"]),
            (&json!(release), &json!("known")),
            "{s}"
        );
        assert!(s["vllm"]["warning"].is_null(), "{s}");
        let holding = if release == VllmRelease::V0_33 {
            json!(["empty_tools"])
        } else {
            json!([])
        };
        assert_eq!(s["vllm"]["release_rules"], holding, "{s}");
        let info = format!(
            "sparkgate_upstream_info{{group=\"main\",vllm_version=\"{release}\",rules=\"{release}\",fit=\"known\"}} 1"
        );
        assert!(metrics(&gw).contains(&info), "{release}: no `{info}` in /metrics");
        assert!(status_text(&gw).contains(&format!("vllm       {release} · rules {release}\n")));
        empty_tools_row(&gw, release);
    }
}

#[test]
fn a_release_sparkgate_does_not_know_gets_the_nearest_rules_and_a_warning() {
    for (plays, reports, rules, fit) in [
        (VllmRelease::V0_34, "0.35.1", VllmRelease::V0_34, "newer"),
        (VllmRelease::V0_33, "0.32.0", VllmRelease::V0_33, "older"),
    ] {
        let args = [&deepseek_sim_args("2")[..], &["--vllm-version", plays.version()]].concat();
        let sim = Sim::start(SIM, &args, &[("SIM_REPORTED_VERSION", reports)]);
        let gw = TestGateway::builder(SIM).upstream(sim.addr()).start();
        let s = known(&gw, reports);
        assert_eq!(
            (&s["vllm"]["rules"], &s["vllm"]["fit"]),
            (&json!(rules), &json!(fit)),
            "{s}"
        );
        let warning = s["vllm"]["warning"].as_str().unwrap_or_default();
        assert!(
            warning.contains(reports) && warning.contains(&format!("the {rules} rules apply")),
            "{s}"
        );
        let text = status_text(&gw);
        assert!(
            text.contains(&format!("vllm       {reports} · rules {rules}\nwarning    {warning}\n")),
            "{text}"
        );
        let info = format!("vllm_version=\"{reports}\",rules=\"{rules}\",fit=\"{fit}\"}} 1");
        assert!(metrics(&gw).contains(&info), "no `{info}` in /metrics");
        empty_tools_row(&gw, rules);
    }
}
