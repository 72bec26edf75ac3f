//! A short run of the route fuzzer (`src/bin/route-fuzz.rs`) in every test run: 3000 random
//! requests over every route, path spelling, method and broken body — no 5xx, no answer outside
//! a valid response or an error envelope. The 20 000-request run is in BENCHMARKS.md.

#[test]
fn random_requests_get_responses_or_envelopes_never_a_5xx() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_route-fuzz"))
        .arg("3000")
        .output()
        .expect("route-fuzz runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("5xx: 0; unacceptable answers: 0"), "{report}");
}
