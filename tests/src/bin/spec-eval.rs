//! Speculation-policy evaluation in virtual time: tokens delivered by fixed modes, `auto` and an
//! oracle on the four demand traces, and their request latency, for a profile and a restart cost.
//!
//! usage: cargo run --release -p sparkgate-tests --bin spec-eval [-- --profile P] [--restart-s S]

use sparkgate_config::ProfileId;
use sparkgate_supervisor::spec_policy::PolicySettings;
use sparkgate_tests::spec_eval::{auto, fixed, modes, oracle, traces, Outcome, REQUEST_TOKENS};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| sparkgate_tests::harness::flag_value(&args, flag);
    let profile = match value("--profile").as_deref() {
        None | Some("deepseek-v4.1-flash") => ProfileId::DeepSeekV41Flash,
        Some("glm-5.3-flash") => ProfileId::Glm53Flash,
        Some(other) => {
            eprintln!("spec-eval: unknown profile {other:?} (deepseek-v4.1-flash or glm-5.3-flash)");
            std::process::exit(2);
        }
    };
    let restart_s: f64 = match value("--restart-s").map(|v| v.parse::<f64>()) {
        None => 300.0,
        Some(Ok(s)) if s >= 0.0 => s,
        Some(_) => {
            eprintln!("spec-eval: --restart-s needs a number of seconds ≥ 0");
            std::process::exit(2);
        }
    };
    let modes = modes(profile);
    let settings = PolicySettings::for_restart(restart_s);
    println!("profile {profile:?}, restart {restart_s} s, policy {settings:?}\n");
    let names: Vec<String> = modes.rates.iter().map(|m| format!("fixed {}", m.name)).collect();
    let mut latency_rows = Vec::new();
    println!(
        "| trace | {} | auto (restarts) | oracle (restarts) | auto vs best fixed | auto / oracle |",
        names.join(" | ")
    );
    println!("|---|{}---|---|---|---|", "---|".repeat(names.len()));
    for trace in traces() {
        let fixed: Vec<Outcome> = (0..modes.rates.len()).map(|m| fixed(&modes, m, &trace)).collect();
        let best = fixed.iter().map(|o| o.tokens).fold(0.0, f64::max);
        let a = auto(&modes, &settings, &trace);
        let o = oracle(&modes, restart_s, &trace);
        let cells: Vec<String> = fixed.iter().map(|f| format!("{:.0}", f.tokens)).collect();
        println!(
            "| {} | {} | {:.0} ({}) | {:.0} ({}) | {:+.1} % | {:.1} % |",
            trace.name,
            cells.join(" | "),
            a.tokens,
            a.restarts,
            o.tokens,
            o.restarts,
            100.0 * (a.tokens / best - 1.0),
            100.0 * a.tokens / o.tokens
        );
        let latency = |o: &Outcome| format!("{:.1} / {:.1}", o.p50_s, o.p95_s);
        let mut row: Vec<String> = fixed.iter().map(latency).collect();
        row.push(latency(&a));
        row.push(latency(&o));
        latency_rows.push(format!("| {} | {} |", trace.name, row.join(" | ")));
    }
    println!("\nrequest latency p50 / p95, seconds ({REQUEST_TOKENS} output tokens per request):\n");
    println!("| trace | {} | auto | oracle |", names.join(" | "));
    println!("|---|{}---|---|", "---|".repeat(names.len()));
    for row in latency_rows {
        println!("{row}");
    }
}
