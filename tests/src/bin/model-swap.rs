//! Model-swap benchmark (issue #50): both models on one simulated pair, closed-loop clients of
//! each alternating streams and whole answers for a while (3 minutes by default), SWAP_MIN_DWELL_S
//! apart; prints what they saw (answers, failures, resumed streams, the most requests rank 0
//! held), the swaps, how long a swap took and how long a client waited for one.
//!
//! usage: cargo run --release -p sparkgate-tests --bin model-swap [-- --seconds S --dwell S --load S]

use std::time::Duration;

use sparkgate_tests::harness::flag_value;
use sparkgate_tests::swapload::{self, percentile, Mix};

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    flag_value(args, name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A histogram's mean from `/metrics` (`_sum` / `_count`).
fn mean(gw: &sparkgate_tests::harness::Gateway, family: &str) -> (f64, u64) {
    let sum = swapload::sum(gw, &format!("{family}_sum")) as f64;
    let count = swapload::sum(gw, &format!("{family}_count"));
    (if count > 0 { sum / count as f64 } else { f64::NAN }, count)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mix = Mix {
        duration: Duration::from_secs_f64(arg(&args, "--seconds", 180.0)),
        dwell_s: arg(&args, "--dwell", 20.0) as u64,
        drain_s: arg(&args, "--drain", 1.0) as u64,
        clients: arg(&args, "--clients", 2.0) as usize,
        load_s: arg(&args, "--load", 2.0),
        long_streams: arg(&args, "--long", 1.0) > 0.0,
    };
    let sim = std::env::current_exe().expect("exe").with_file_name("vllm-sim");
    let (gw, control) = swapload::start(sim.to_str().expect("utf-8 path"), &mix, &[]);
    let out = swapload::run(&gw, control, &mix);
    let (swap_s, swaps_timed) = mean(&gw, "sparkgate_model_swap_seconds");
    let (wait_s, waits) = mean(&gw, "sparkgate_model_swap_wait_seconds");
    println!("{mix:?}");
    println!("| model | whole answers | streams | latency p50 | p95 | max |");
    println!("|---|---|---|---|---|---|");
    for (m, name) in [swapload::DEEPSEEK, swapload::GLM].iter().enumerate() {
        let l = &out.latencies[m];
        println!(
            "| {name} | {} | {} | {:.2} s | {:.2} s | {:.2} s |",
            out.answered[m].0,
            out.answered[m].1,
            percentile(l, 50.0).as_secs_f64(),
            percentile(l, 95.0).as_secs_f64(),
            percentile(l, 100.0).as_secs_f64()
        );
    }
    let bound = mix.duration.as_secs().div_ceil(mix.dwell_s) + 1;
    println!(
        "\nfailures {} · swaps {} (bound {bound}) · swap took {swap_s:.2} s on average ({swaps_timed} timed) · a request for the model not loaded waited {wait_s:.2} s on average ({waits}) · streams cut by a drain and continued {} ({} long streams answered whole) · most requests rank 0 held at once {} (cap {})",
        out.failures.len(),
        out.swaps,
        out.resumed,
        out.long_answered,
        out.peak,
        swapload::MAX_NUM_SEQS
    );
    for f in out.failures.iter().take(5) {
        println!("  {f}");
    }
}
