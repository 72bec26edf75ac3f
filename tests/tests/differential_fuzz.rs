//! The differential fuzzer in every test run: 1 000 generated requests per profile (seed 31),
//! built from the real vLLM 0.33.0 frontend's own `/openapi.json`, each sent to the real
//! frontend, to vllm-sim and to the gateway in front of the real frontend
//! (`src/bin/diff-fuzz.rs`). Nothing may differ from the real answers outside the two written
//! lists (docs/gateway.md's deliberate differences, tests/vllm-sim.md's fuzzer exclusions), and
//! the captured schema vllm-sim derives from must equal the live frontend's. Entries for rare
//! combinations go unused in 2 000 cases; `diff-fuzz` prints the unused ones, and a long run
//! (BENCHMARKS.md) is where a stale entry shows. `--seed`, `--count` and `--jobs` make longer
//! runs; BENCHMARKS.md has the figures.

#[test]
fn generated_requests_get_the_real_frontends_answers() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_diff-fuzz"))
        .args(["--seed", "31", "--count", "1000"])
        .output()
        .expect("diff-fuzz runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for profile in ["deepseek", "glm"] {
        assert!(report.contains(&format!("{profile}: 1000 cases (seed 31)")), "{report}");
    }
}
