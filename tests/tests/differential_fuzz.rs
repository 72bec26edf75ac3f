//! The differential fuzzer in every test run: 1 000 generated requests per profile (seed 31),
//! built from the real vLLM 0.33.0 frontend's own `/openapi.json`, sent to the real frontend and
//! to the gateway in front of it (`src/bin/diff-fuzz.rs --side gateway`). Nothing may differ
//! from the real answers outside docs/gateway.md's list of deliberate differences, and no entry
//! of it may be stale. `--seed` and `--count` make longer runs; BENCHMARKS.md has the figures.
//! The simulator's side (`--side sim`) is not gated yet: it differs on about half the cases
//! until its validation derives from the same schema (issue #31).

#[test]
fn generated_requests_get_the_real_frontends_answers() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_diff-fuzz"))
        .args(["--seed", "31", "--count", "1000", "--side", "gateway"])
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
    assert!(!report.contains("unused:"), "stale list entries:\n{report}");
}
