//! Real clients from PyPI through the gateway: the `openai` SDK (sync, async, streaming, tools,
//! extra_body, error classes) and the `openai-agents` framework, in `tests/python/`.

use sparkgate_tests::harness::{binary_next_to, Gateway, Sim};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

#[test]
fn openai_sdk_and_agents_framework_through_the_gateway() {
    let sparkgate = binary_next_to(SIM, "sparkgate");
    let args = [
        "/model",
        "--served-model-name",
        MODEL,
        "--reasoning-parser",
        "deepseek_v41",
        "--max-num-seqs",
        "8",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "deepseek_v41",
    ];
    let sim = Sim::start(SIM, &args, &[]);
    let gw = Gateway::start(&sparkgate, "deepseek-v4.1-flash", sim.addr(), &[("MAX_NUM_SEQS", "8")]);
    let slow = Sim::start(SIM, &args, &[("SIM_SPEED", "1")]);
    let tight = Gateway::start(&sparkgate, "deepseek-v4.1-flash", slow.addr(), &[("QUEUE_DEPTH", "0")]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/test_clients.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .env("SPARKGATE_BASE_URL", gw.base_url())
        .env("SPARKGATE_TIGHT_URL", tight.base_url())
        .env("SPARKGATE_MODEL", MODEL)
        .env("OPENAI_AGENTS_DISABLE_TRACING", "1")
        .output()
        .expect("python3 runs (bash .ci/run installs openai and openai-agents)");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python client tests failed:\n{report}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for test in [
        "test_non_streaming_smoke",
        "test_tools",
        "test_errors_raise_the_right_classes",
        "test_async_stream_and_non_stream",
        "test_openai_agents_tool_turn",
    ] {
        assert!(
            report.contains(&format!("{test} ")) && report.contains("OK"),
            "{test} did not run:\n{report}"
        );
    }
}
