//! Speculation-policy evaluation in virtual time: tokens delivered by fixed modes, `auto` and an
//! oracle on the four demand traces, for a profile and a restart cost.
//!
//! usage: cargo run --release -p sparkgate-tests --bin spec-eval [-- --profile P] [--restart-s S]

use sparkgate_config::ProfileId;
use sparkgate_supervisor::spec_policy::PolicySettings;
use sparkgate_tests::spec_eval::{auto, fixed, modes, oracle, traces};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
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
    let names: Vec<String> = modes.iter().map(|m| format!("fixed {}", m.name)).collect();
    println!(
        "| trace | {} | auto (restarts) | oracle (restarts) | auto vs best fixed | auto / oracle |",
        names.join(" | ")
    );
    println!("|---|{}---|---|---|---|", "---|".repeat(names.len()));
    for trace in traces() {
        let fixed: Vec<f64> = (0..modes.len()).map(|m| fixed(&modes, m, &trace).tokens).collect();
        let best = fixed.iter().copied().fold(0.0, f64::max);
        let a = auto(&modes, &settings, &trace);
        let o = oracle(&modes, restart_s, &trace);
        let cells: Vec<String> = fixed.iter().map(|t| format!("{:.0}", t)).collect();
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
    }
}
