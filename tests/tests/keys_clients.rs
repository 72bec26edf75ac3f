//! Named keys through real SDKs (`tests/python/keys_clients.py`): the openai and anthropic SDKs,
//! each with its own named key, read the usage `/admin/usage` counts for that key, and a key over
//! its tokens per minute makes each SDK raise its own RateLimitError (429, Retry-After; Anthropic's
//! `rate_limit_error`).

use serde_json::Value;
use sparkgate_tests::http::request;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

#[test]
fn sdks_read_the_usage_their_keys_are_charged_and_raise_their_rate_limit_errors() {
    // Early in a minute, so the two requests of each key share one.
    sparkgate_tests::harness::early_in_a_minute();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(
        &file,
        "sdk-openai sk-sdk-openai tokens_per_minute=30\nsdk-anthropic sk-sdk-anthropic tokens_per_minute=30\n",
    )
    .unwrap();
    let gw = TestGateway::builder(SIM)
        .env("API_KEYS_FILE", &file.display().to_string())
        .env("STORE_URL", &dir.path().join("state.sqlite").display().to_string())
        .start();
    let base = format!("http://{}", gw.addr);
    let env = [("SPARKGATE_BASE_URL", base.as_str()), ("SPARKGATE_MODEL", MODEL)];
    let got: Value = sparkgate_tests::python::script("keys_clients.py", &[], &env)
        .unwrap_or_else(|e| panic!("{e}"))
        .last_json();
    for (sdk, refused) in [("openai", "openai_refused"), ("anthropic", "anthropic_refused")] {
        let r = &got[refused];
        assert_eq!(r["status"], 429, "{sdk}: {got}");
        let retry: u64 = r["retry_after"].as_str().unwrap().parse().unwrap();
        // The sliding minute lets a request's tokens go 61 s after the second it began in.
        assert!((1..=61).contains(&retry), "{sdk}: {got}");
    }
    assert_eq!(got["anthropic_refused"]["type"], "rate_limit_error");
    for (name, sdk) in [("sdk-openai", "openai"), ("sdk-anthropic", "anthropic")] {
        let u = request(gw.addr, "GET", &format!("/admin/usage?window=all&key={name}"), &[], b"").json();
        let t = &u["total"];
        assert_eq!(
            (t["prompt"].clone(), t["completion"].clone()),
            (got[sdk][0].clone(), got[sdk][1].clone()),
            "{name}: what the SDK read is what its key was charged: {u}"
        );
        assert_eq!(
            (t["requests"].as_u64(), t["refusals"].as_u64()),
            (Some(2), Some(1)),
            "{u}"
        );
    }
}
