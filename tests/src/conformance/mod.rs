//! The conformance suite: the battery in `tests/conformance/cases.json` is sent to a real vLLM
//! frontend (`crate::realvllm`, each release) and to vllm-sim playing the same release, both
//! started with the same launch-plan argv, and every structural difference (`shape`) is a failure — except the few listed with
//! their reasons under "Conformance exclusions" in `tests/vllm-sim.md`, and exactly those.

pub mod shape;

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::Value;
use sparkgate_config::{ProfileId, VllmRelease};

use crate::harness::{addr_in, Proc};
use crate::http::try_request;

/// One request of the battery, ready to send for a profile.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

fn manifest_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Placeholders in the battery, expanded per profile.
fn expand(text: &str, model: &str) -> String {
    let mut t = text.replace("$MODEL", model);
    if t.contains("$BIG_PROMPT") {
        t = t.replace("$BIG_PROMPT", &"hash ".repeat(1_000_000));
    }
    if t.contains("$PAD_2MIB") {
        t = t.replace("$PAD_2MIB", &"a".repeat(2_300_000));
    }
    t
}

/// The battery for a served model name.
pub fn cases(model: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(manifest_path("conformance/cases.json")).expect("cases.json");
    let doc: Value = serde_json::from_str(&text).expect("cases.json is JSON");
    let list = doc["cases"].as_array().expect("cases.json has `cases`");
    list.iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().map(str::to_owned);
            let mut headers: Vec<(String, String)> = c["headers"]
                .as_object()
                .map(|h| {
                    h.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            let body = match (s("raw"), c.get("body")) {
                (Some(raw), _) => expand(&raw, model),
                (None, Some(b)) => expand(&b.to_string(), model),
                (None, None) => String::new(),
            };
            if !body.is_empty() {
                let ct = s("content_type").unwrap_or_else(|| "application/json".into());
                headers.push(("Content-Type".into(), ct));
            }
            Case {
                name: s("name").expect("case name"),
                method: s("method").unwrap_or_else(|| "POST".into()),
                path: s("path").expect("case path"),
                headers,
                body: body.into_bytes(),
            }
        })
        .collect()
}

/// An accepted difference: a case (or `*`), a path prefix in its shape, and why.
#[derive(Debug, Clone)]
pub struct Exclusion {
    pub case: String,
    pub path: String,
    pub reason: String,
}

/// The exclusion table of `tests/vllm-sim.md` (rows `| case | path | reason |` under the
/// "Conformance exclusions" heading).
pub fn exclusions() -> Vec<Exclusion> {
    let text = std::fs::read_to_string(manifest_path("vllm-sim.md")).expect("tests/vllm-sim.md");
    let Some((_, section)) = text.split_once("## Conformance exclusions") else {
        return Vec::new();
    };
    let section = section.split("\n## ").next().unwrap_or("");
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let unquote = |s: &str| s.trim_matches('`').to_owned();
            (cells.len() >= 3).then(|| Exclusion {
                case: unquote(cells[0]),
                path: unquote(cells[1]),
                reason: cells[2].to_owned(),
            })
        })
        .collect()
}

impl Exclusion {
    fn covers(&self, profile: &str, case: &str, line: &str) -> bool {
        let case_ok = self.case == "*" || self.case == case || self.case == format!("{profile}:{case}");
        case_ok && line.starts_with(&self.path)
    }
}

/// What one profile's run found.
#[derive(Debug, Default)]
pub struct Report {
    pub compared: usize,
    pub failures: Vec<String>,
    /// Indices into the exclusion list that excused at least one difference.
    pub used: Vec<usize>,
}

/// Sends every case to both servers and compares the shapes.
/// With `dump`, both raw answers of each case are written there (`<profile>.<case>.{real,sim}`).
pub fn compare(
    profile: ProfileId,
    real: SocketAddr,
    sim: SocketAddr,
    excl: &[Exclusion],
    dump: Option<&std::path::Path>,
) -> Report {
    let model = crate::realvllm::test_config(profile, &[])
        .serving
        .served_model_name
        .clone();
    let tag = crate::realvllm::fixture_profile(profile);
    let mut report = Report::default();
    for case in cases(&model) {
        let headers: Vec<(&str, &str)> = case.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let observe = |addr, side: &str| match try_request(addr, &case.method, &case.path, &headers, &case.body) {
            Some(r) => {
                if let Some(dir) = dump {
                    let head: String = r.headers.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
                    let mut text = format!("{}\n{head}\n", r.status).into_bytes();
                    text.extend_from_slice(&r.body);
                    let _ = std::fs::write(dir.join(format!("{tag}.{}.{side}", case.name)), text);
                }
                shape::response_shape(&r)
            }
            None => serde_json::json!("<connection failed before a complete answer>"),
        };
        let (r, s) = (observe(real, "real"), observe(sim, "sim"));
        report.compared += 1;
        for line in shape::diff(&r, &s) {
            match excl.iter().position(|e| e.covers(tag, &case.name, &line)) {
                Some(i) => report.used.push(i),
                None => report.failures.push(format!("{tag}:{} {line}", case.name)),
            }
        }
    }
    report
}

/// A vllm-sim group serving `argv` (a plan's rank-0 argv): rank 0 and, for a two-node plan, a
/// headless rank 1 joined over loopback. Returns the processes (kept alive) and rank 0's address.
pub fn start_sim(bin: &str, release: VllmRelease, argv: &[String]) -> (Vec<Proc>, SocketAddr) {
    let set = |argv: &mut Vec<String>, flag: &str, value: &str| {
        if let Some(i) = argv.iter().position(|a| a == flag) {
            argv[i + 1] = value.to_owned();
        }
    };
    // One token per step, as the fixture's engine: chunk boundaries then follow tokens alike.
    let env = [
        ("SIM_LOAD_SECONDS", "0"),
        ("SIM_SPEED", "instant"),
        ("SIM_DRAFT_ACCEPTANCE", "0"),
    ];
    let mut a0 = argv.to_vec();
    a0.extend(["--vllm-version".to_owned(), release.version().to_owned()]);
    set(&mut a0, "--port", "0");
    set(&mut a0, "--master-addr", "127.0.0.1");
    set(&mut a0, "--master-port", "0");
    let rank0 = Proc::spawn(bin, &a0, &env);
    let mut procs = Vec::new();
    if argv.iter().any(|a| a == "--nnodes") {
        let master = addr_in(&rank0.wait_for("torch.distributed rendezvous listening on"));
        let mut a1 = a0.clone();
        set(&mut a1, "--master-port", &master.port().to_string());
        set(&mut a1, "--node-rank", "1");
        a1.push("--headless".into());
        procs.push(Proc::spawn(bin, &a1, &env));
    }
    let http = addr_in(&rank0.wait_for("Starting vLLM server on http://"));
    rank0.wait_for("Application startup complete.");
    procs.insert(0, rank0);
    (procs, http)
}
