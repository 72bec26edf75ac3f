//! Memory-replay benchmark (issue #35): long prompts whose prefills together would take the node
//! under MEM_GUARD_GIB, short prompts meanwhile, over vllm-sim's node memory — with the gateway's
//! memory guard and without, side by side: how often the guard held, how often memguard
//! restarted the group, the lowest MemAvailable, and the answers' times.
//!
//! usage: cargo run -p sparkgate-tests --bin memory-replay [-- --longs N --speed S]

use std::time::Duration;

use sparkgate_tests::memreplay::{self, Answer, Mix};

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (longs, speed) = (arg(&args, "--longs", 4.0) as usize, arg(&args, "--speed", 2.0));
    let sim = std::env::current_exe().expect("exe").with_file_name("vllm-sim");
    let sim = sim.to_str().expect("utf-8 path");
    println!("| guard | long prompts answered | last long answer | short prompts answered | short latency p50 / max | guard holds | memguard restarts | lowest MemAvailable |");
    println!("|---|---|---|---|---|---|---|---|");
    for guard in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mix = Mix {
            longs,
            speed,
            guard,
            until_memguard: false,
        };
        let (gw, meminfo) = memreplay::start(sim, dir.path(), mix);
        let r = memreplay::run(&gw, &meminfo, mix, Duration::from_secs(180));
        let ok = |list: &[Answer]| list.iter().filter(|a| a.status == 200).count();
        let mut latency: Vec<f64> = r.shorts.iter().map(|a| a.latency().as_secs_f64()).collect();
        latency.sort_by(f64::total_cmp);
        let p50 = latency.get(latency.len() / 2).copied().unwrap_or(f64::NAN);
        let max = latency.last().copied().unwrap_or(f64::NAN);
        let last = r.longs.iter().map(|a| a.ended.as_secs_f64()).fold(0.0, f64::max);
        println!(
            "| {} | {}/{longs} | {last:.1} s | {}/{} | {p50:.1} s / {max:.1} s | {} | {} | {:.2} GiB |",
            if guard { "on" } else { "off" },
            ok(&r.longs),
            ok(&r.shorts),
            r.shorts.len(),
            r.holds,
            r.memguard_restarts,
            r.lowest_gib,
        );
    }
}
