//! The conformance suite: the battery (`tests/conformance/cases.json`) against each real vLLM
//! frontend (0.33.0, 0.34.0) and vllm-sim playing the same release, both profiles, all started
//! with the profile's launch-plan argv.
//! Any structural difference fails, except the entries of `tests/vllm-sim.md`'s exclusion table
//! — and an entry that excuses nothing fails too, so the list stays exactly what is needed.

use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::conformance::{cases, compare, exclusions, start_sim};
use sparkgate_tests::realvllm::{plan_argv, test_config, RealVllm};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

#[test]
fn vllm_sim_matches_the_real_frontend() {
    let excl = exclusions();
    assert!(excl.len() <= 5, "the exclusion list stays short: {excl:?}");
    let mut failures = Vec::new();
    let mut used = vec![false; excl.len()];
    let mut compared = 0;
    for release in VllmRelease::ALL {
        // A release's two reference servers start together (≈20 s each on two cores).
        let reals: Vec<(ProfileId, std::thread::JoinHandle<RealVllm>)> = ProfileId::ALL
            .into_iter()
            .map(|p| (p, std::thread::spawn(move || RealVllm::start(release, p))))
            .collect();
        for (profile, handle) in reals {
            let real = handle.join().expect("reference frontend starts");
            let (_sim, sim) = start_sim(SIM, release, &plan_argv(profile, None));
            let report = compare(profile, real.addr, sim, &excl, None);
            compared += report.compared;
            failures.extend(report.failures.into_iter().map(|f| format!("{release} {f}")));
            for i in report.used {
                used[i] = true;
            }
        }
    }
    let model = test_config(ProfileId::DeepSeekV41Flash, &[])
        .serving
        .served_model_name
        .clone();
    assert!(
        cases(&model).len() >= 100,
        "the battery has at least 100 cases per profile"
    );
    assert!(compared >= 400, "{compared} comparisons");
    let stale: Vec<_> = excl
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(e, _)| &e.case)
        .collect();
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(stale.is_empty(), "exclusions that excuse nothing: {stale:?}");
}
