//! Admission counts sequences, not requests: a completion's prompts times `n` and a batch's
//! conversations take one permit per sequence, so vLLM's running + waiting (its own `/metrics`)
//! never exceed MAX_NUM_SEQS — in front of vllm-sim and of the real vLLM 0.33.0 frontend — and a
//! request that needs more sequences than the model runs at once is refused with 400 before it
//! reaches a rank. A batch's `n` is vLLM's to refuse (it runs one sequence per conversation).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, SpecMethod, VllmRelease};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::{in_vllm, post_json};
use sparkgate_tests::load::deepseek_sim_args;
use sparkgate_tests::realvllm::{plan_argv, RealVllm};
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
/// SPEC_METHOD=none: DeepSeek's mode with four sequence slots.
const SLOTS: u64 = 4;

fn conversation(i: usize) -> Value {
    json!([{"role": "user", "content": format!("Explain pipeline stage {i} of tensor parallel inference.")}])
}

/// A 4-prompt completion, a 2-prompt completion with `n: 2`, a two-conversation batch, and
/// single chats, sent at once; every answer 200 and the most vLLM held at once.
fn mixed_load(gw: SocketAddr, upstream: SocketAddr) -> u64 {
    let tokens = 40;
    let mut bodies: Vec<(&str, Value)> = vec![
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": ["a b c", "d e f", "g h i", "j k l"], "max_tokens": tokens, "ignore_eos": true}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": ["m n o", "p q r"], "n": 2, "max_tokens": tokens, "ignore_eos": true}),
        ),
        (
            "/v1/chat/completions/batch",
            json!({"model": MODEL, "messages": [conversation(1), conversation(2)], "max_tokens": tokens, "ignore_eos": true}),
        ),
    ];
    for i in 0..4 {
        bodies.push((
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": conversation(i), "max_tokens": tokens, "ignore_eos": true}),
        ));
    }
    let workers: Vec<_> = bodies
        .into_iter()
        .map(|(path, body)| std::thread::spawn(move || (path, post_json(gw, path, &body))))
        .collect();
    let mut most = 0;
    while !workers.iter().all(|w| w.is_finished()) {
        most = most.max(in_vllm(upstream));
        std::thread::sleep(Duration::from_millis(5));
    }
    for w in workers {
        let (path, r) = w.join().unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    most
}

/// Requests that need more sequences at once than the model runs: 400 naming the field.
fn oversized_are_refused(gw: SocketAddr) {
    let prompts: Vec<String> = (0..8).map(|i| format!("prompt {i}")).collect();
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": prompts, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/invocations",
            json!({"model": MODEL, "prompt": prompts, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": [[1, 2], [3, 4]], "n": 3, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/v1/chat/completions/batch",
            json!({"model": MODEL, "messages": (0..5).map(conversation).collect::<Vec<_>>()}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": conversation(0), "n": "5"}),
            "n",
        ),
    ] {
        let r = post_json(gw, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        let e = r.json()["error"].clone();
        assert_eq!(e["param"], param, "{path}: {e}");
        assert!(e["message"].as_str().unwrap().contains("MAX_NUM_SEQS=4"), "{path}: {e}");
    }
}

#[test]
fn prompt_lists_and_batches_take_a_permit_per_sequence_in_front_of_vllm_sim() {
    let sim = Sim::start(SIM, &deepseek_sim_args("4"), &[("SIM_SPEED", "4")]);
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .env("SPEC_METHOD", "none")
        .start();
    oversized_are_refused(gw.addr);
    let most = mixed_load(gw.addr, sim.addr());
    assert!(
        (3..=SLOTS).contains(&most),
        "{most} sequences inside vLLM at once (MAX_NUM_SEQS {SLOTS})"
    );
}

#[test]
fn prompt_lists_and_batches_take_a_permit_per_sequence_in_front_of_the_real_frontend() {
    let real = RealVllm::start_with(
        VllmRelease::V0_33,
        ProfileId::DeepSeekV41Flash,
        &plan_argv(ProfileId::DeepSeekV41Flash, Some(SpecMethod::None)),
        &[("FAKE_STEP_S", "0.02")],
    );
    let gw = TestGateway::builder(SIM)
        .upstream(real.addr)
        .env("SPEC_METHOD", "none")
        .start();
    oversized_are_refused(gw.addr);
    let most = mixed_load(gw.addr, real.addr);
    assert!(
        (3..=SLOTS).contains(&most),
        "{most} sequences inside vLLM at once (MAX_NUM_SEQS {SLOTS})"
    );
}

#[test]
fn an_eight_prompt_completion_takes_eight_permits() {
    let sim = Sim::start(SIM, &deepseek_sim_args("8"), &[("SIM_SPEED", "4")]);
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .envs(&[("SPEC_METHOD", "none"), ("MAX_NUM_SEQS", "8")])
        .start();
    let (addr, upstream) = (gw.addr, sim.addr());
    let prompts: Vec<String> = (0..8).map(|i| format!("prompt number {i}")).collect();
    let eight = json!({"model": MODEL, "prompt": prompts, "max_tokens": 40, "ignore_eos": true});
    let chat = json!({"model": MODEL, "messages": conversation(0), "max_tokens": 40, "ignore_eos": true});
    let completion = std::thread::spawn(move || post_json(addr, "/v1/completions", &eight));
    // The chat arrives while the eight sequences hold every slot: it waits in the gateway.
    let mut most = 0;
    while most < 8 && !completion.is_finished() {
        most = most.max(in_vllm(upstream));
    }
    let chatting = std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &chat));
    while !(completion.is_finished() && chatting.is_finished()) {
        most = most.max(in_vllm(upstream));
    }
    assert_eq!(completion.join().unwrap().status, 200);
    assert_eq!(chatting.join().unwrap().status, 200);
    assert_eq!(most, 8, "the eight prompts ran at once, and nothing beside them");
}
