//! Pacing benchmark: runs vllm-sim at SIM_SPEED=1 and measures aggregate decode tokens/s at
//! widths 1, 2 and 4 for each profile's modes, against the seeded throughput tables.
//!
//! usage: cargo run --release -p sparkgate-tests --bin sim-pacing [-- --tokens N]

use std::time::Instant;

use serde_json::json;
use sparkgate_config::{seeded_throughput, ProfileId, SpecMethod};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::http::post_json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tokens: u64 = args
        .iter()
        .position(|a| a == "--tokens")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let sim_bin = std::env::current_exe().expect("exe").with_file_name("vllm-sim");
    let sim_bin = sim_bin.to_str().expect("utf-8 path");
    let cases = [
        (
            ProfileId::DeepSeekV41Flash,
            "deepseek_v41",
            SpecMethod::Dspark,
            Some(r#"{"method":"dspark","num_speculative_tokens":3}"#),
            2,
        ),
        (ProfileId::DeepSeekV41Flash, "deepseek_v41", SpecMethod::None, None, 4),
        (
            ProfileId::Glm53Flash,
            "glm45",
            SpecMethod::Dflash,
            Some(r#"{"method":"dflash","model":"/d","num_speculative_tokens":7}"#),
            4,
        ),
        (
            ProfileId::Glm53Flash,
            "glm45",
            SpecMethod::Mtp,
            Some(r#"{"method":"mtp","num_speculative_tokens":2}"#),
            4,
        ),
    ];
    println!("| profile | mode | width | table tok/s | measured tok/s | error |");
    println!("|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for (profile, parser, method, spec, seqs) in cases {
        let seqs_s = seqs.to_string();
        let mut argv = vec![
            "/model",
            "--served-model-name",
            "M",
            "--reasoning-parser",
            parser,
            "--max-num-seqs",
            &seqs_s,
        ];
        if let Some(s) = spec {
            argv.extend(["--speculative-config", s]);
        }
        let sim = Sim::start(sim_bin, &argv, &[("SIM_SPEED", "1")]);
        let table = seeded_throughput(profile, method).expect("table");
        for width in [1u32, 2, 4] {
            let addr = sim.addr();
            let started = Instant::now();
            let workers: Vec<_> = (0..width)
                .map(|i| {
                    let body = json!({"messages": [{"role": "user", "content": format!("stream {i}")}], "max_tokens": tokens, "ignore_eos": true,
                                      "chat_template_kwargs": {"enable_thinking": false}});
                    std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &body).json()["usage"]["completion_tokens"].as_u64().unwrap_or(0))
                })
                .collect();
            let total: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
            let measured = total as f64 / started.elapsed().as_secs_f64();
            // Demand beyond max_num_seqs queues: the engine runs min(width, seqs) at a time.
            let expected = table.at(width);
            let err = (measured - expected) / expected * 100.0;
            worst = worst.max(err.abs());
            println!("| {profile} | {method} | {width} | {expected:.1} | {measured:.1} | {err:+.1} % |");
        }
    }
    println!("\nworst error {worst:.1} % ({tokens} tokens per stream, SIM_SPEED=1)");
}
