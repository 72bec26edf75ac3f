//! The speculation policy on the evaluation traces (virtual time, DeepSeek tables, 300 s
//! restarts, margin 1): what `auto` must hold against fixed modes and the oracle.

use sparkgate_config::ProfileId;
use sparkgate_supervisor::spec_policy::PolicySettings;
use sparkgate_tests::spec_eval::{auto, fixed, modes, oracle, traces, Outcome, Trace};

fn trace(name_starts: &str) -> Trace {
    traces()
        .into_iter()
        .find(|t| t.name.starts_with(name_starts))
        .expect("trace")
}

fn run(name_starts: &str) -> (f64, Outcome, Outcome, PolicySettings) {
    let modes = modes(ProfileId::DeepSeekV41Flash);
    let settings = PolicySettings::for_restart(300.0);
    let trace = trace(name_starts);
    let best_fixed = (0..modes.rates.len())
        .map(|m| fixed(&modes, m, &trace).tokens)
        .fold(0.0, f64::max);
    (
        best_fixed,
        auto(&modes, &settings, &trace),
        oracle(&modes, settings.restart_s, &trace),
        settings,
    )
}

#[test]
fn steady_loads_stay_within_3_percent_of_the_better_fixed_mode() {
    for trace in ["steady 1", "steady 4"] {
        let (best, auto, oracle, _) = run(trace);
        assert!(auto.tokens >= 0.97 * best, "{trace}: {auto:?} vs {best}");
        assert!(auto.restarts <= 1, "{trace}: {auto:?}");
        assert!(oracle.tokens >= auto.tokens);
    }
}

#[test]
fn a_working_day_beats_both_fixed_modes_and_nears_the_oracle() {
    let (best, auto, oracle, _) = run("working day");
    assert!(auto.tokens > 1.05 * best, "{auto:?} vs best fixed {best}");
    assert!(auto.tokens >= 0.95 * oracle.tokens, "{auto:?} vs oracle {oracle:?}");
    // Running the right mode for the batch hours shows in request latency too.
    let dspark = fixed(&modes(ProfileId::DeepSeekV41Flash), 0, &trace("working day"));
    assert!(
        auto.requests > 0 && auto.p95_s < dspark.p95_s,
        "{auto:?} vs fixed dspark {dspark:?}"
    );
}

#[test]
fn an_oscillating_load_does_not_flap() {
    let (best, auto, _, settings) = run("rapid oscillation");
    if let Some(gap) = auto.min_gap_s {
        assert!(gap >= settings.min_dwell_s, "{auto:?}");
    }
    assert!(auto.tokens >= 0.98 * best, "{auto:?} vs {best}");
}
