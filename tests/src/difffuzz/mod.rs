//! The differential fuzzer: requests built from the real vLLM frontend's own `/openapi.json`
//! (`schema`, `mutate`) go to the real frontend, to vllm-sim, and to the gateway in front of the
//! real frontend; every structural difference from the real answer (`conformance::shape`) is a
//! finding, unless one of two written lists excuses it — the gateway's deliberate rules
//! (docs/gateway.md, "Deliberate differences from vLLM") and the simulator's documented
//! exclusions (tests/vllm-sim.md, "Fuzzer exclusions"), each entry with its reason. A finding
//! is reduced to the fewest mutations that still show it.

pub mod mutate;
pub mod schema;

use std::net::SocketAddr;

use serde_json::{Map, Value};

use crate::conformance::shape::{diff, response_shape};
use crate::http::try_request;
use mutate::{apply, mutations, Mutation, Rng, ROUTES};

/// Which answer differs from the real frontend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Sim,
    Gateway,
}

/// Where the three servers listen.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    pub real: SocketAddr,
    pub sim: SocketAddr,
    pub gateway: SocketAddr,
}

/// One entry of a written list: differences on `route` (or `*`) in a case that touched `field`
/// (or `*`), at shape paths starting with `path`.
#[derive(Debug, Clone)]
pub struct Excuse {
    pub side: Side,
    pub route: String,
    pub field: String,
    pub path: String,
    pub reason: String,
}

impl Excuse {
    fn covers(&self, side: Side, route: &str, fields: &[String], line: &str) -> bool {
        self.side == side
            && (self.route == "*" || self.route == route)
            && (self.field == "*" || fields.contains(&self.field))
            && line.starts_with(&self.path)
    }
}

/// The table rows `| route | field | path | reason |` under `heading` in a markdown file.
pub fn excuses(side: Side, markdown: &str, heading: &str) -> Vec<Excuse> {
    let Some((_, section)) = markdown.split_once(heading) else {
        return Vec::new();
    };
    let section = section.split("\n## ").next().unwrap_or("");
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let unquote = |s: &str| s.trim_matches('`').to_owned();
            (cells.len() >= 4).then(|| Excuse {
                side,
                route: unquote(cells[0]),
                field: unquote(cells[1]),
                path: unquote(cells[2]),
                reason: cells[3].to_owned(),
            })
        })
        .collect()
}

/// A difference no list excuses, reduced.
#[derive(Debug, Clone)]
pub struct Finding {
    pub side: Side,
    pub case: usize,
    pub route: &'static str,
    pub mutations: Vec<Mutation>,
    pub lines: Vec<String>,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:?} differs on case {} — POST {}", self.side, self.case, self.route)?;
        for m in &self.mutations {
            writeln!(f, "  with {m:?}")?;
        }
        for l in &self.lines {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub sent: usize,
    pub excused: usize,
    pub findings: Vec<Finding>,
    /// For each excuse (in the order given), whether it excused anything.
    pub used: Vec<bool>,
}

/// A run: `count` cases from `seed` against `targets`, for a frontend serving `model`.
#[derive(Debug)]
pub struct Run<'a> {
    pub openapi: &'a Value,
    pub model: &'a str,
    pub targets: Targets,
    pub excuses: &'a [Excuse],
    /// The answers compared with the real one.
    pub sides: &'a [Side],
}

impl Report {
    fn merge(&mut self, other: Report) {
        self.sent += other.sent;
        self.excused += other.excused;
        self.findings.extend(other.findings);
        for (u, o) in self.used.iter_mut().zip(other.used) {
            *u |= o;
        }
    }
}

impl Run<'_> {
    /// `count` cases from `seed` on `jobs` threads (case `i` on thread `i % jobs`: the cases
    /// and their findings are the same for any number of jobs), findings in case order.
    pub fn go(&self, seed: u64, count: usize, jobs: usize) -> Report {
        let jobs = jobs.clamp(1, count.max(1));
        let mut report = Report {
            used: vec![false; self.excuses.len()],
            ..Report::default()
        };
        let parts: Vec<Report> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..jobs)
                .map(|j| s.spawn(move || self.cases(seed, (j..count).step_by(jobs))))
                .collect();
            handles.into_iter().map(|h| h.join().expect("a fuzz job")).collect()
        });
        for part in parts {
            report.merge(part);
        }
        report.findings.sort_by_key(|f| f.case);
        report
    }

    fn cases(&self, seed: u64, cases: impl Iterator<Item = usize>) -> Report {
        let mut report = Report {
            used: vec![false; self.excuses.len()],
            ..Report::default()
        };
        for case in cases {
            if case > 0 && case % 5000 == 0 {
                eprintln!(
                    "diff-fuzz: case {case}, {} findings on this job so far",
                    report.findings.len()
                );
            }
            // Each case has its own generator: it replays from (seed, case) alone.
            let mut rng = Rng::new(seed ^ (case as u64).wrapping_mul(0x100_0000_01b3));
            let (route, seed_body) = *rng.pick(ROUTES);
            let model = schema::model(self.openapi, route).unwrap_or_default();
            let seed_body: Map<String, Value> =
                serde_json::from_str(&seed_body.replace("$MODEL", self.model)).expect("seed JSON");
            let muts = mutations(&mut rng, &model);
            report.sent += 1;
            for &side in self.sides {
                let lines = self.differences(side, route, &seed_body, &muts, &mut report);
                if !lines.is_empty() {
                    let (mutations, lines) = self.reduce(side, route, &seed_body, muts.clone(), lines);
                    report.findings.push(Finding {
                        side,
                        case,
                        route,
                        mutations,
                        lines,
                    });
                }
            }
        }
        report
    }

    /// The unexcused differences between `side`'s answer and the real one (excused ones are
    /// counted in `report`).
    fn differences(
        &self,
        side: Side,
        route: &str,
        seed: &Map<String, Value>,
        muts: &[Mutation],
        report: &mut Report,
    ) -> Vec<String> {
        let wire = apply(route, seed, muts);
        let headers: Vec<(&str, &str)> = wire.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let shape_at = |addr| match try_request(addr, wire.method, &wire.path, &headers, &wire.body) {
            Some(r) => response_shape(&r),
            None => serde_json::json!("<connection failed before a complete answer>"),
        };
        let other = match side {
            Side::Sim => self.targets.sim,
            Side::Gateway => self.targets.gateway,
        };
        let fields: Vec<String> = muts.iter().map(Mutation::field).collect();
        let mut out = Vec::new();
        for line in diff(&shape_at(self.targets.real), &shape_at(other)) {
            match self.excuses.iter().position(|e| e.covers(side, route, &fields, &line)) {
                Some(i) => {
                    report.used[i] = true;
                    report.excused += 1;
                }
                None => out.push(line),
            }
        }
        out
    }

    /// Drops mutations one at a time while the difference stays.
    fn reduce(
        &self,
        side: Side,
        route: &str,
        seed: &Map<String, Value>,
        mut muts: Vec<Mutation>,
        mut lines: Vec<String>,
    ) -> (Vec<Mutation>, Vec<String>) {
        let mut scratch = Report {
            used: vec![false; self.excuses.len()],
            ..Report::default()
        };
        let mut i = 0;
        while muts.len() > 1 && i < muts.len() {
            let mut fewer = muts.clone();
            fewer.remove(i);
            let still = self.differences(side, route, seed, &fewer, &mut scratch);
            if still.is_empty() {
                i += 1;
            } else {
                muts = fewer;
                lines = still;
            }
        }
        (muts, lines)
    }
}
