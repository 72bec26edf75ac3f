//! `cargo run -p sparkgate-tests --bin conformance [deepseek|glm|0.33.0|0.34.0]…`: runs the
//! conformance battery against each real vLLM frontend and vllm-sim playing the same release,
//! and prints every difference (the integration test `conformance.rs` asserts there are none).
//! Words name the profiles and releases to run (default: all). CONFORMANCE_DUMP=DIR keeps both
//! raw answers of every case.

use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::conformance::{compare, exclusions, start_sim};
use sparkgate_tests::harness::binary_next_to;
use sparkgate_tests::realvllm::{fixture_profile, plan_argv, RealVllm};

fn main() {
    let exe = std::env::current_exe()
        .expect("current exe")
        .to_string_lossy()
        .into_owned();
    let sim_bin = binary_next_to(&exe, "vllm-sim");
    let words: Vec<String> = std::env::args().skip(1).collect();
    let releases: Vec<VllmRelease> = VllmRelease::ALL
        .into_iter()
        .filter(|r| !words.iter().any(|w| VllmRelease::parse(w).is_ok()) || words.iter().any(|w| w == r.version()))
        .collect();
    let profiles: Vec<ProfileId> = ProfileId::ALL
        .into_iter()
        .filter(|p| {
            !words.iter().any(|w| w == "deepseek" || w == "glm") || words.iter().any(|w| w == fixture_profile(*p))
        })
        .collect();
    let excl = exclusions();
    let mut failed = 0;
    for release in releases {
        for &profile in &profiles {
            let argv = plan_argv(profile, None);
            let real = RealVllm::start(release, profile);
            let (_sim, sim) = start_sim(&sim_bin, release, &argv);
            let dump = std::env::var_os("CONFORMANCE_DUMP")
                .map(|d| std::path::PathBuf::from(d).join(format!("{release}-{}", fixture_profile(profile))));
            if let Some(d) = &dump {
                std::fs::create_dir_all(d).expect("dump dir");
            }
            let report = compare(profile, real.addr, sim, &excl, dump.as_deref());
            for f in &report.failures {
                println!("{release} {f}");
            }
            println!(
                "{release} {}: {} cases, {} differences, {} excused",
                fixture_profile(profile),
                report.compared,
                report.failures.len(),
                report.used.len()
            );
            failed += report.failures.len();
        }
    }
    std::process::exit(i32::from(failed > 0));
}
