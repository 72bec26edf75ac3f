//! docs/alerts.yml: valid rules (`promtool check rules`), their own tests passing (`promtool test
//! rules tests/alerts/alerts_test.yml`: an unplanned restart fires, a planned one does not), and
//! every series they read exported by a gateway that served and restarted.

use sparkgate_tests::http::request;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn repo(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

fn promtool(args: &[&str]) -> String {
    let out = std::process::Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool (Debian's prometheus package; .ci/run installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_and_their_tests_pass() {
    let checked = promtool(&["check", "rules", &repo("docs/alerts.yml")]);
    assert!(checked.contains("6 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", &repo("tests/alerts/alerts_test.yml")]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_series_the_alerts_read_is_one_the_gateway_exports() {
    let rules = std::fs::read_to_string(repo("docs/alerts.yml")).unwrap();
    let mut names: Vec<String> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("sparkgate_"))
        .map(|w| w.trim_end_matches("_bucket").to_owned())
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 5, "{names:?}");
    let gw = TestGateway::builder(SIM).start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    assert!(request(gw.addr, "POST", "/admin/restart", &[], b"").status < 300);
    gw.wait_status("serving again", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    let chat = serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    assert_eq!(
        sparkgate_tests::http::post_json(gw.addr, "/v1/chat/completions", &chat).status,
        200
    );
    let exposition = request(gw.addr, "GET", "/metrics", &[], b"").text();
    for name in &names {
        assert!(
            exposition
                .lines()
                .any(|l| l.starts_with(name.as_str()) && !l.starts_with('#')),
            "{name} is read by docs/alerts.yml but not exported:\n{exposition}"
        );
    }
}
