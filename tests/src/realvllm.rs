//! The reference fixture from Rust: vLLM's real `vllm serve` frontend (each release of
//! `VllmRelease`, in its own venv) with a fake engine core (`tests/realvllm/`, what is real and what is faked is written at the top of
//! `fixture.py`), started like any fixture — a free loopback port, readiness from its log, killed
//! when dropped — and the launch-plan argv each profile serves with.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sparkgate_config::{Config, LoadOptions, ProfileId, SpecMethod, VllmRelease};

use crate::harness::{free_port, Proc};
use crate::http::try_request;

/// The variable that names `release`'s venv instead of the default (`SPARKGATE_VLLM_VENV_0_34`).
pub fn venv_variable(release: VllmRelease) -> String {
    let version: Vec<&str> = release.version().split('.').collect();
    format!("SPARKGATE_VLLM_VENV_{}_{}", version[0], version[1])
}

/// The venv `.ci/run` installs `vllm==<release>` into: `~/.cache/vllm-<release>`, or the
/// variable [`venv_variable`] names.
pub fn venv(release: VllmRelease) -> PathBuf {
    match std::env::var_os(venv_variable(release)) {
        Some(v) => PathBuf::from(v),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(format!(".cache/vllm-{release}")),
    }
}

/// The venv's Python, or a panic that says how to get it (the suite never skips).
pub fn python(release: VllmRelease) -> String {
    let venv = venv(release);
    assert!(
        venv.join(".sparkgate-complete").exists(),
        "vLLM {release} is not installed in {} — run `bash .ci/run` (or set {})",
        venv.display(),
        venv_variable(release)
    );
    venv.join("bin/python").to_string_lossy().into_owned()
}

/// `tests/realvllm/` (the Python side of the fixture).
pub fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("realvllm")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The fixture's name for a profile.
pub fn fixture_profile(profile: ProfileId) -> &'static str {
    match profile {
        ProfileId::DeepSeekV41Flash => "deepseek",
        ProfileId::Glm53Flash => "glm",
    }
}

/// A `Config` of `profile` as the tests load it: loopback nodes, a throwaway working
/// directory, and `extra` variables on top.
pub fn test_config(profile: ProfileId, extra: &[(&str, &str)]) -> Config {
    let mut env: BTreeMap<String, String> = [
        ("HOME", "/home/t"),
        ("USER", "t"),
        ("HEAD_IP", "127.0.0.1"),
        ("WORKER_IP", "127.0.0.2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let dir = tempfile::tempdir().expect("tempdir");
    Config::load(&LoadOptions {
        env_file: None,
        profile: Some(profile.as_str().into()),
        overrides: Default::default(),
        demo: Default::default(),
        process_env: env,
        working_dir: dir.path().into(),
    })
    .expect("test config loads")
}

/// Every launch-plan argv the tests check: both profiles, every mode and rank, and the plan's
/// variants (eager, multimodal, long-prefill threshold, GLM's default effort, one node, traced) —
/// `(profile, description, mode's MAX_NUM_SEQS, whether speculative, rank, argv)`.
pub fn every_plan_argv() -> Vec<PlanArgv> {
    let variants: &[&[(&str, &str)]] = &[
        &[],
        &[("ENFORCE_EAGER", "1")],
        &[("LANGUAGE_MODEL_ONLY", "0")],
        &[("LONG_PREFILL_TOKEN_THRESHOLD", "512")],
        &[("GLM53_DEFAULT_REASONING_EFFORT", "high")],
        &[("NNODES", "1")],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")],
    ];
    let mut out = Vec::new();
    for profile in ProfileId::ALL {
        for extra in variants {
            if profile == ProfileId::DeepSeekV41Flash && extra.iter().any(|(k, _)| k.starts_with("GLM53_")) {
                continue;
            }
            let c = test_config(profile, extra);
            for mode in c.speculation.modes.iter().map(|m| m.method) {
                for rank in c.plan_for(mode).ranks {
                    out.push(PlanArgv {
                        profile,
                        name: format!("{profile} {mode} rank {} {extra:?}", rank.rank),
                        max_num_seqs: c.speculation.mode(mode).expect("the plan's mode").max_num_seqs,
                        speculative: c.speculative_config(mode).is_some(),
                        rank: rank.rank,
                        argv: rank.vllm_argv().to_vec(),
                    });
                }
            }
        }
    }
    out
}

/// One rank's argv of one plan variant.
#[derive(Debug, Clone)]
pub struct PlanArgv {
    pub profile: ProfileId,
    pub name: String,
    pub max_num_seqs: u32,
    pub speculative: bool,
    pub rank: u32,
    pub argv: Vec<String>,
}

/// Rank 0's `vllm serve …` argv of the profile's default plan in `mode` (default: the
/// profile's default mode).
pub fn plan_argv(profile: ProfileId, mode: Option<SpecMethod>) -> Vec<String> {
    plan_argv_with(profile, mode, &[])
}

/// [`plan_argv`] for a configuration with `extra` environment settings.
pub fn plan_argv_with(profile: ProfileId, mode: Option<SpecMethod>, extra: &[(&str, &str)]) -> Vec<String> {
    let c = test_config(profile, extra);
    let plan = match mode {
        Some(m) => c.plan_for(m),
        None => c.plan(),
    };
    plan.ranks
        .iter()
        .find(|r| r.rank == 0)
        .expect("rank 0")
        .vllm_argv()
        .to_vec()
}

/// A running reference frontend.
#[derive(Debug)]
pub struct RealVllm {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub release: VllmRelease,
    _work: tempfile::TempDir,
}

/// How long the frontend may take to start (≈20 s on 2 cores, more when the machine is busy).
const START: Duration = Duration::from_secs(240);

impl RealVllm {
    /// The model directory the fixture generated (its trained `tokenizer.json`, config, template).
    pub fn model_dir(&self) -> PathBuf {
        self._work.path().join("model")
    }

    /// `release` serving `profile` with its default plan's rank-0 argv.
    pub fn start(release: VllmRelease, profile: ProfileId) -> RealVllm {
        RealVllm::start_with(release, profile, &plan_argv(profile, None), &[])
    }

    /// `release` serving `argv` (`serve MODEL …`, paths rewritten by the fixture) for `profile`.
    pub fn start_with(release: VllmRelease, profile: ProfileId, argv: &[String], env: &[(&str, &str)]) -> RealVllm {
        let work = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut args = vec![
            script("fixture.py"),
            "--profile".into(),
            fixture_profile(profile).into(),
            "--workdir".into(),
            work.path().to_string_lossy().into_owned(),
            "--port".into(),
            port.to_string(),
            "--".into(),
        ];
        args.extend(argv.iter().cloned());
        let mut full_env = vec![("PYTHONUNBUFFERED", "1")];
        full_env.extend_from_slice(env);
        let proc = Proc::spawn(&python(release), &args, &full_env);
        proc.wait_for_within("Application startup complete.", START);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Ready when `/health` answers 200, as the supervisor judges a rank.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while try_request(addr, "GET", "/health", &[], b"").map(|r| r.status) != Some(200) {
            assert!(
                std::time::Instant::now() < deadline,
                "/health never answered 200:\n{}",
                proc.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        RealVllm {
            proc,
            addr,
            release,
            _work: work,
        }
    }
}
