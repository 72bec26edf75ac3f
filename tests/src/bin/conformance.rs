//! `cargo run -p sparkgate-tests --bin conformance [deepseek|glm]…`: runs the conformance
//! battery against the real vLLM 0.33.0 frontend and vllm-sim and prints every difference (the
//! integration test `conformance.rs` asserts there are none). CONFORMANCE_DUMP=DIR keeps both
//! raw answers of every case.

use sparkgate_config::ProfileId;
use sparkgate_tests::conformance::{compare, exclusions, start_sim};
use sparkgate_tests::harness::binary_next_to;
use sparkgate_tests::realvllm::{fixture_profile, plan_argv, RealVllm};

fn main() {
    let exe = std::env::current_exe()
        .expect("current exe")
        .to_string_lossy()
        .into_owned();
    let sim_bin = binary_next_to(&exe, "vllm-sim");
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let excl = exclusions();
    let mut failed = 0;
    for profile in ProfileId::ALL {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == fixture_profile(profile)) {
            continue;
        }
        let argv = plan_argv(profile, None);
        let real = RealVllm::start(profile);
        let (_sim, sim) = start_sim(&sim_bin, &argv);
        let dump = std::env::var_os("CONFORMANCE_DUMP").map(std::path::PathBuf::from);
        if let Some(d) = &dump {
            std::fs::create_dir_all(d).expect("dump dir");
        }
        let report = compare(profile, real.addr, sim, &excl, dump.as_deref());
        for f in &report.failures {
            println!("{f}");
        }
        println!(
            "{}: {} cases, {} differences, {} excused",
            fixture_profile(profile),
            report.compared,
            report.failures.len(),
            report.used.len()
        );
        failed += report.failures.len();
    }
    std::process::exit(i32::from(failed > 0));
}
