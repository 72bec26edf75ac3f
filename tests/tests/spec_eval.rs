//! The speculation policy on the evaluation traces (virtual time, DeepSeek tables, 300 s
//! restarts, margin 1): what `auto` must hold against fixed modes and the oracle.

use sparkgate_config::ProfileId;
use sparkgate_spec::policy::PolicySettings;
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

/// Two DeepSeek groups on a trace with widths × `scale`: the split policy, the single-group
/// policy (every group in one mode, switched together by auto) and the single-group oracle.
fn two_groups(name_starts: &str, scale: u8) -> (Outcome, Outcome, Outcome) {
    use sparkgate_tests::spec_split_eval as split;
    let modes = modes(ProfileId::DeepSeekV41Flash);
    let settings = PolicySettings::for_restart(300.0);
    let trace = split::scaled(&trace(name_starts), scale);
    let uniform = split::uniform(&modes, 2);
    (
        split::policy(&modes, 2, split::all_splits(&modes, 2), &settings, &trace),
        split::policy(&modes, 2, uniform.clone(), &settings, &trace),
        split::oracle(&modes, 2, &uniform, settings.restart_s, &trace),
    )
}

#[test]
fn two_groups_split_on_a_working_day_at_least_match_the_single_group_policy() {
    for scale in [2, 3] {
        let (split, single, oracle) = two_groups("working day", scale);
        assert!(split.tokens >= single.tokens, "× {scale}: {split:?} vs {single:?}");
        assert!(
            split.tokens >= 0.98 * oracle.tokens,
            "× {scale}: {split:?} vs {oracle:?}"
        );
        assert!(split.restarts <= single.restarts, "× {scale}: {split:?} vs {single:?}");
    }
}

#[test]
fn two_groups_in_different_modes_route_a_lone_stream_to_the_speculating_one() {
    use sparkgate_tests::spec_split_eval as split;
    let modes = modes(ProfileId::DeepSeekV41Flash);
    let one = trace("steady 1");
    // dspark+none serves one stream exactly as two dspark groups do: it goes to the dspark one.
    let mixed = split::fixed(&modes, &[0, 1], &one);
    let dspark = split::fixed(&modes, &[0, 0], &one);
    let none = split::fixed(&modes, &[1, 1], &one);
    assert_eq!(mixed.tokens, dspark.tokens);
    assert!(mixed.tokens > none.tokens * 1.3, "{mixed:?} vs {none:?}");
}
