//! Speculation-policy evaluation in virtual time: tokens delivered by fixed modes, `auto` and an
//! oracle on the four demand traces, and their request latency, for a profile and a restart cost.
//!
//! With `--groups N` (N ≥ 2), the same traces (widths × N unless `--scale F`) in front of N
//! groups: fixed splits, the single-group policy and oracle (every group in one mode) against
//! `auto` over splits and the oracle over splits.
//!
//! usage: cargo run --release -p sparkgate-tests --bin spec-eval [-- --profile P] [--restart-s S]
//!        [--groups N [--scale F]]

use sparkgate_config::ProfileId;
use sparkgate_spec::policy::PolicySettings;
use sparkgate_tests::spec_eval::{auto, fixed, modes, oracle, traces, Modes, Outcome, REQUEST_TOKENS};
use sparkgate_tests::spec_split_eval as split;

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
    let count = |flag: &str, default: u8| match value(flag).map(|v| v.parse::<u8>()) {
        None => default,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("spec-eval: {flag} needs a whole number from 1 to 255");
            std::process::exit(2);
        }
    };
    let groups = count("--groups", 1);
    let modes = modes(profile);
    let settings = PolicySettings::for_restart(restart_s);
    println!("profile {profile:?}, restart {restart_s} s, policy {settings:?}\n");
    if groups > 1 {
        return split_tables(&modes, &settings, usize::from(groups), count("--scale", groups));
    }
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

/// The tables of `--groups N`: tokens (restarts) per policy, then the split policy against the
/// best single-group policy and the single-group oracle.
fn split_tables(modes: &Modes, settings: &PolicySettings, groups: usize, scale: u8) {
    let name = |s: &[usize]| {
        let words: Vec<String> = s.iter().map(|&m| modes.rates[m].name.to_string()).collect();
        words.join("+")
    };
    let uniform = split::uniform(modes, groups);
    let every = split::all_splits(modes, groups);
    let fixed_cols: Vec<String> = every.iter().map(|s| format!("fixed {}", name(s))).collect();
    println!("{groups} groups, demand widths × {scale}; tokens (restarts)\n");
    println!(
        "| trace | {} | single-group auto | split auto | single-group oracle | split oracle | split auto vs best single-group policy | split auto / single-group oracle |",
        fixed_cols.join(" | ")
    );
    println!("|---|{}---|---|---|---|---|---|", "---|".repeat(fixed_cols.len()));
    let mut latency_rows = Vec::new();
    for trace in traces() {
        let trace = split::scaled(&trace, scale);
        let fixed: Vec<Outcome> = every.iter().map(|s| split::fixed(modes, s, &trace)).collect();
        let single = split::policy(modes, groups, uniform.clone(), settings, &trace);
        let auto = split::policy(modes, groups, every.clone(), settings, &trace);
        let single_oracle = split::oracle(modes, groups, &uniform, settings.restart_s, &trace);
        let split_oracle = split::oracle(modes, groups, &every, settings.restart_s, &trace);
        // The single-group policies: every group fixed in one mode, or switched together by auto.
        let best_single = every
            .iter()
            .zip(&fixed)
            .filter(|(s, _)| uniform.contains(s))
            .map(|(_, o)| o.tokens)
            .fold(single.tokens, f64::max);
        let cell = |o: &Outcome| format!("{:.0} ({})", o.tokens, o.restarts);
        let cells: Vec<String> = fixed.iter().map(cell).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {:+.1} % | {:.1} % |",
            trace.name,
            cells.join(" | "),
            cell(&single),
            cell(&auto),
            cell(&single_oracle),
            cell(&split_oracle),
            100.0 * (auto.tokens / best_single - 1.0),
            100.0 * auto.tokens / single_oracle.tokens
        );
        let latency = |o: &Outcome| format!("{:.1} / {:.1}", o.p50_s, o.p95_s);
        let mut row: Vec<String> = fixed.iter().map(latency).collect();
        row.extend([&single, &auto, &single_oracle, &split_oracle].map(latency));
        latency_rows.push(format!("| {} | {} |", trace.name, row.join(" | ")));
    }
    println!("\nrequest latency p50 / p95, seconds ({REQUEST_TOKENS} output tokens per request):\n");
    println!(
        "| trace | {} | single-group auto | split auto | single-group oracle | split oracle |",
        fixed_cols.join(" | ")
    );
    println!("|---|{}---|---|---|---|", "---|".repeat(fixed_cols.len()));
    for row in latency_rows {
        println!("{row}");
    }
}
