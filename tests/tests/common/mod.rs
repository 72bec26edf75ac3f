//! Shared set-up of the gateway integration tests: a vllm-sim process and `sparkgate serve` in
//! front of it.

#![allow(dead_code, unreachable_pub)]

use serde_json::Value;
use sparkgate_tests::harness::{Gateway, Sim};
use sparkgate_tests::http::{post_json, HttpResponse};
use sparkgate_tests::test_gateway::TestGateway;

pub const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

pub const DS: &[&str] = &sparkgate_tests::load::DEEPSEEK_SIM_ARGS;
pub const GLM: &[&str] = &[
    "/glm",
    "--served-model-name",
    "GLM-5.3-Flash-EXL3",
    "--reasoning-parser",
    "glm45",
    "--max-num-seqs",
    "4",
];

pub fn ds_pair(sim_env: &[(&str, &str)], gw_env: &[(&str, &str)]) -> (Sim, Gateway) {
    let sim = Sim::start(SIM, DS, sim_env);
    let gw = TestGateway::builder(SIM).upstream(sim.addr()).envs(gw_env).start();
    (sim, gw)
}

pub fn chat(gw: &Gateway, body: Value) -> HttpResponse {
    post_json(gw.addr, "/v1/chat/completions", &body)
}

pub fn reasoning_first_line(resp: &Value) -> Option<String> {
    resp["choices"][0]["message"]["reasoning"]
        .as_str()
        .map(|r| r.lines().next().unwrap_or("").to_owned())
}
