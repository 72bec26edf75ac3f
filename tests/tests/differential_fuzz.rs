//! The differential fuzzer in every test run: 2 000 generated requests per vLLM release and
//! profile (seed 31), built from each real frontend's own `/openapi.json`, each sent to the real
//! frontend, to vllm-sim playing the same release and to the gateway in front of the real
//! frontend (`src/bin/diff-fuzz.rs`). Nothing may differ from the real answers outside the two
//! written lists (docs/gateway.md's deliberate differences, tests/vllm-sim.md's fuzzer
//! exclusions), and each captured schema vllm-sim derives from must equal its live frontend's.
//! Entries for rare combinations go unused in 8 000 cases; `diff-fuzz` prints the unused ones,
//! and a long run (BENCHMARKS.md) is where a stale entry shows. `--seed`, `--count`, `--jobs`
//! and `--vllm-version` make other runs; BENCHMARKS.md has the figures.

use sparkgate_config::VllmRelease;

#[test]
fn generated_requests_get_the_real_frontends_answers() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_diff-fuzz"))
        .args(["--seed", "31", "--count", "2000"])
        .output()
        .expect("diff-fuzz runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for release in VllmRelease::ALL {
        for profile in ["deepseek", "glm"] {
            assert!(
                report.contains(&format!("{release} {profile}: 2000 cases (seed 31)")),
                "{report}"
            );
        }
    }
}
