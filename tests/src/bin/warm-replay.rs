//! Warm-replay benchmark (WARM_REPLAY_BYTES): a conversation with a long first turn, its group
//! restarted, and the time to first token of its next turn — with the warm replay and without,
//! side by side, over vllm-sim at the guides' prefill speed (SIM_SPEED=1).
//!
//! usage: cargo run -p sparkgate-tests --bin warm-replay [-- --words N] (8 500 words: about
//! 20 000 prompt tokens)

use sparkgate_tests::test_gateway::TestGateway;
use sparkgate_tests::warm::next_turn_after_restart;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let words: usize = args
        .iter()
        .position(|a| a == "--words")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(8_500);
    let sim = std::env::current_exe().expect("exe").with_file_name("vllm-sim");
    let sim = sim.to_str().expect("utf-8 path");
    println!("| WARM_REPLAY_BYTES | next turn's prompt tokens | of them cached | next turn's TTFT |");
    println!("|---|---|---|---|");
    for (bytes, warmed) in [("0", false), ("67108864", true)] {
        let gw = TestGateway::builder(sim)
            .envs(&[("SIM_SPEED", "1"), ("WARM_REPLAY_BYTES", bytes)])
            .start();
        gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
        let next = next_turn_after_restart(&gw, words, warmed);
        println!(
            "| {bytes} | {} | {} | {:.3} s |",
            next.prompt_tokens,
            next.cached_tokens,
            next.ttft.as_secs_f64()
        );
    }
}
