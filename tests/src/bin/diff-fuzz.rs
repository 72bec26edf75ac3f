//! `cargo run -p sparkgate-tests --bin diff-fuzz -- [--seed S] [--count N] [--jobs J]
//! [--side sim|gateway] [--vllm-version V]… [--capture] [deepseek|glm]…`: the differential
//! fuzzer (`sparkgate_tests::difffuzz`) for each release (default: every one) and profile — the
//! real vLLM frontend, vllm-sim playing the same release with the same launch-plan argv, and the
//! gateway in front of the real frontend; `J` cases at a time (2 by default; the findings do not
//! depend on it). Prints each finding with its reduced reproducer, then one summary line per
//! release and profile; exits 1 when anything differs outside the written lists.

use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::conformance::start_sim;
use sparkgate_tests::difffuzz::{excuses, Excuse, Report, Run, Side, Targets};
use sparkgate_tests::harness::binary_next_to;
use sparkgate_tests::http::request;
use sparkgate_tests::realvllm::{fixture_profile, plan_argv_with, test_config, RealVllm};
use sparkgate_tests::test_gateway::TestGateway;

/// A short context: a request with no max-tokens field and `ignore_eos` generates up to the
/// context limit, which at the fixture engine's 2 ms a token is 4 s here, not 20 minutes.
const SETTINGS: &[(&str, &str)] = &[("MAX_MODEL_LEN", "2048")];

/// The captured schema vllm-sim's validation derives from (`--capture` rewrites it).
fn schema_path(release: VllmRelease) -> String {
    format!("sim-schema/vllm-{release}-openapi.json")
}

struct Args {
    capture: bool,
    jobs: usize,
    seed: u64,
    count: usize,
    sides: Vec<Side>,
    releases: Vec<VllmRelease>,
    profiles: Vec<ProfileId>,
}

fn args() -> Args {
    let mut out = Args {
        capture: false,
        jobs: 2,
        seed: 31,
        count: 1000,
        sides: vec![Side::Sim, Side::Gateway],
        releases: Vec::new(),
        profiles: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--capture" => out.capture = true,
            "--jobs" => out.jobs = value().parse().expect("--jobs is an integer"),
            "--seed" => out.seed = value().parse().expect("--seed is an integer"),
            "--count" => out.count = value().parse().expect("--count is an integer"),
            "--vllm-version" => out
                .releases
                .push(VllmRelease::parse(&value()).unwrap_or_else(|e| panic!("--vllm-version: {e}"))),
            "--side" => {
                out.sides = match value().as_str() {
                    "sim" => vec![Side::Sim],
                    "gateway" => vec![Side::Gateway],
                    other => panic!("--side sim|gateway, not {other}"),
                }
            }
            name => out.profiles.push(
                ProfileId::ALL
                    .into_iter()
                    .find(|p| fixture_profile(*p) == name)
                    .unwrap_or_else(|| panic!("unknown profile {name}: deepseek or glm")),
            ),
        }
    }
    if out.profiles.is_empty() {
        out.profiles = ProfileId::ALL.to_vec();
    }
    if out.releases.is_empty() {
        out.releases = VllmRelease::ALL.to_vec();
    }
    out
}

fn lists(sides: &[Side]) -> Vec<Excuse> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut out = excuses(
        Side::Gateway,
        &read("../docs/gateway.md"),
        "## Deliberate differences from vLLM",
    );
    out.extend(excuses(Side::Sim, &read("vllm-sim.md"), "## Fuzzer exclusions"));
    out.retain(|e| sides.contains(&e.side));
    out
}

/// Whether the live frontend's schema is the captured one vllm-sim derives from (with
/// `capture`, it is written first).
fn schema_matches(release: VllmRelease, live: &serde_json::Value, capture: bool) -> bool {
    let schema = schema_path(release);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(&schema);
    if capture {
        let text = serde_json::to_string_pretty(live).expect("JSON") + "\n";
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let committed: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let same = &committed == live;
    if !same {
        println!("the frontend's /openapi.json differs from {schema}: vllm-sim derives from a stale schema (--capture rewrites it)");
    }
    same
}

/// What one release and profile's run found, and whether its captured schema is current.
struct Outcome {
    report: Report,
    schema_matches: bool,
}

impl std::ops::Deref for Outcome {
    type Target = Report;
    fn deref(&self) -> &Report {
        &self.report
    }
}

/// The three targets of `release` and `profile`, and the run's report.
fn fuzz(a: &Args, release: VllmRelease, profile: ProfileId, sim_bin: &str, excuses: &[Excuse]) -> Outcome {
    let argv = plan_argv_with(profile, None, SETTINGS);
    let real = RealVllm::start_with(release, profile, &argv, &[]);
    let (_sim, sim) = start_sim(sim_bin, release, &argv);
    let gw = TestGateway::builder(sim_bin)
        .profile(profile.as_str())
        .upstream(real.addr)
        .envs(SETTINGS)
        .start();
    let openapi = request(real.addr, "GET", "/openapi.json", &[], b"").json();
    let schema_matches = schema_matches(release, &openapi, a.capture);
    let model = test_config(profile, SETTINGS).serving.served_model_name.clone();
    let run = Run {
        openapi: &openapi,
        model: &model,
        targets: Targets {
            real: real.addr,
            sim,
            gateway: gw.addr,
        },
        excuses,
        sides: &a.sides,
    };
    Outcome {
        report: run.go(a.seed, a.count, a.jobs),
        schema_matches,
    }
}

fn main() {
    let a = args();
    let exe = std::env::current_exe()
        .expect("current exe")
        .to_string_lossy()
        .into_owned();
    let sim_bin = binary_next_to(&exe, "vllm-sim");
    let excuses = lists(&a.sides);
    let mut findings = 0;
    let mut used = vec![false; excuses.len()];
    for release in &a.releases {
        for profile in &a.profiles {
            let report = fuzz(&a, *release, *profile, &sim_bin, &excuses);
            for f in &report.findings {
                println!("{release} {}:{f}", fixture_profile(*profile));
            }
            let by = |side| report.findings.iter().filter(|f| f.side == side).count();
            println!(
                "{release} {}: {} cases (seed {}), {} differences excused, findings: sim {}, gateway {}",
                fixture_profile(*profile),
                report.sent,
                a.seed,
                report.excused,
                by(Side::Sim),
                by(Side::Gateway)
            );
            findings += report.findings.len() + usize::from(!report.schema_matches);
            for (u, r) in used.iter_mut().zip(&report.used) {
                *u |= *r;
            }
        }
    }
    for (e, u) in excuses.iter().zip(&used) {
        if !u {
            println!("unused: {:?} {} {} {}", e.side, e.route, e.field, e.path);
        }
    }
    std::process::exit(i32::from(findings > 0));
}
