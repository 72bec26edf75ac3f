//! The diagnostics bundle of an unplanned restart (a lost group, a failed or stalled start),
//! written to `LOG_DIR/epoch-N/diagnostics/` while the ranks are still there, before they are
//! stopped: the reason, each rank's log tail and a Python stack dump where `py-spy` is
//! installed, rank 0's last `/metrics` scrape and heartbeat history (`Trail`), the requests in
//! flight as the gateway reports them (ids, key names, routes, token counts — never bodies or
//! keys), and each node's facts (meminfo; `nvidia-smi` and the kernel log's tail where present,
//! a worker's over its SSH session). Every part is bounded in time: a stopped rank or a cut SSH
//! session leaves its part saying so, never a hung restart.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;

use crate::start::Ranks;
use crate::watchdog::Sample;

/// How long one part (a stack dump, a node's facts) may take.
const PART_LIMIT: Duration = Duration::from_secs(5);
/// Heartbeat samples kept (about one a second).
const BEATS: usize = 300;
/// Log lines per rank.
const TAIL_LINES: usize = 200;

/// What the gateway reports of its requests in flight, as text (one per line).
pub type InFlightReport = Arc<dyn Fn() -> String + Send + Sync>;

/// Where the gateway's in-flight report is found once it is set (the gateway is built after its
/// supervisors).
#[derive(Clone, Default)]
pub(crate) struct InFlightSlot(Arc<OnceLock<InFlightReport>>);

impl InFlightSlot {
    pub(crate) fn set(&self, report: InFlightReport) {
        let _ = self.0.set(report);
    }

    pub(crate) fn get(&self) -> Option<InFlightReport> {
        self.0.get().cloned()
    }
}

impl std::fmt::Debug for InFlightSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "InFlightSlot(set)"
        } else {
            "InFlightSlot(unset)"
        })
    }
}

/// One watch sample, as the heartbeat history keeps it.
#[derive(Debug, Clone, Copy)]
struct Beat {
    at_unix: f64,
    healthy: bool,
    steps: Option<f64>,
    running: Option<f64>,
    waiting: Option<f64>,
    generated: Option<f64>,
}

/// The running group's recent history: heartbeats and rank 0's last answered scrape.
#[derive(Debug, Default)]
pub(crate) struct Trail {
    beats: VecDeque<Beat>,
    scrape: Option<(f64, Arc<str>)>,
}

impl Trail {
    pub(crate) fn record(&mut self, sample: &Sample) {
        let at_unix = crate::status::unix_now();
        let p = sample.progress;
        if self.beats.len() == BEATS {
            self.beats.pop_front();
        }
        self.beats.push_back(Beat {
            at_unix,
            healthy: sample.healthy,
            steps: p.map(|p| p.steps),
            running: p.map(|p| p.running),
            waiting: p.map(|p| p.waiting),
            generated: p.map(|p| p.generated),
        });
        if let Some(text) = &sample.scrape {
            self.scrape = Some((at_unix, text.clone()));
        }
    }

    fn heartbeat(&self) -> String {
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v}"));
        let mut out = String::from("unix_time\thealthy\tengine_steps\trunning\twaiting\tgenerated_tokens\n");
        for b in &self.beats {
            out.push_str(&format!(
                "{:.1}\t{}\t{}\t{}\t{}\t{}\n",
                b.at_unix,
                b.healthy,
                cell(b.steps),
                cell(b.running),
                cell(b.waiting),
                cell(b.generated)
            ));
        }
        out
    }
}

/// A node whose facts the bundle holds: the head (this machine) or a worker over SSH.
pub(crate) enum NodeAt {
    Head { meminfo: PathBuf },
    Worker(Arc<crate::rank::WorkerLink>),
}

/// What a bundle is written from.
pub(crate) struct Inputs<'a> {
    pub(crate) reason: &'a str,
    pub(crate) cause: &'a str,
    pub(crate) epoch: u64,
    pub(crate) ranks: &'a Ranks,
    pub(crate) trail: Option<&'a Trail>,
    pub(crate) in_flight: Option<InFlightReport>,
    pub(crate) nodes: Vec<NodeAt>,
}

/// Writes the bundle under `epoch_dir/diagnostics` and returns that directory.
pub(crate) async fn collect(epoch_dir: &Path, inputs: Inputs<'_>) -> PathBuf {
    let began = std::time::Instant::now();
    let dir = epoch_dir.join("diagnostics");
    let _ = std::fs::create_dir_all(&dir);
    let mut summary = format!(
        "reason: {}\ncause: {}\nepoch: {}\nwritten_at_unix: {:.0}\n",
        inputs.reason,
        inputs.cause,
        inputs.epoch,
        crate::status::unix_now()
    );
    let put = |name: &str, text: &str| {
        let _ = std::fs::write(dir.join(name), text);
    };
    let (ranks, facts) = tokio::join!(rank_parts(inputs.ranks), node_facts(&inputs.nodes));
    for (name, text, note) in ranks.into_iter().chain(facts) {
        put(&name, &text);
        summary.push_str(&format!("{name}: {note}\n"));
    }
    match inputs.trail {
        Some(t) => {
            put("heartbeat.tsv", &t.heartbeat());
            summary.push_str(&format!("heartbeat.tsv: {} samples\n", t.beats.len()));
            match &t.scrape {
                Some((at, text)) => {
                    put("rank0-metrics.txt", text);
                    summary.push_str(&format!(
                        "rank0-metrics.txt: rank 0's last /metrics, scraped at {at:.1}\n"
                    ));
                }
                None => summary.push_str("rank0-metrics.txt: rank 0 never answered /metrics\n"),
            }
        }
        None => summary.push_str("heartbeat.tsv: the group was not serving yet\n"),
    }
    match &inputs.in_flight {
        Some(report) => {
            let text = report();
            summary.push_str(&format!(
                "in-flight.tsv: {} requests\n",
                text.lines().count().saturating_sub(1)
            ));
            put("in-flight.tsv", &text);
        }
        None => summary.push_str("in-flight.tsv: no gateway report\n"),
    }
    summary.push_str(&format!("written in {} ms\n", began.elapsed().as_millis()));
    put("summary.txt", &summary);
    dir
}

/// Each rank's tail and stack dump: (file name, text, summary note).
async fn rank_parts(ranks: &Ranks) -> Vec<(String, String, String)> {
    // What each rank shows now, taken under the lock; the dumps are taken after it.
    let seen: Vec<_> = ranks
        .lock()
        .expect("ranks lock")
        .iter()
        .map(|r| (r.rank(), r.tail(TAIL_LINES), r.stack_dumper()))
        .collect();
    let mut out = Vec::new();
    for (rank, tail, dumper) in seen {
        out.push((
            format!("rank{rank}-tail.log"),
            format!("{}\n", tail.join("\n")),
            format!("{} lines", tail.len()),
        ));
        match tokio::time::timeout(PART_LIMIT, dumper.dump()).await {
            Ok(Some((dump, note))) => out.push((format!("rank{rank}-py-spy.txt"), dump, note)),
            Ok(None) => {}
            Err(_) => out.push((
                format!("rank{rank}-py-spy.txt"),
                String::new(),
                format!("no dump within {} s", PART_LIMIT.as_secs()),
            )),
        }
    }
    out
}

/// The script that gathers a node's facts; `$1` is its meminfo file.
const FACTS: &str = r#"echo "== meminfo ($1)"; cat "$1" 2>&1
echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -q 2>&1 | head -n 400; else echo "not installed"; fi
echo "== kernel log (last 100 lines)"
{ dmesg -T 2>&1 || journalctl -k -n 100 --no-pager 2>&1; } | tail -n 100
"#;

/// Each node's facts, gathered at once: (file name, text, summary note).
async fn node_facts(nodes: &[NodeAt]) -> Vec<(String, String, String)> {
    let reads = nodes.iter().map(|n| async move {
        let (name, read) = match n {
            NodeAt::Head { meminfo } => ("head".to_owned(), head_facts(meminfo).await),
            NodeAt::Worker(link) => (link.label.clone(), worker_facts(link).await),
        };
        let file = format!("node-{}.txt", name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
        match read {
            Ok(text) => {
                let avail = text
                    .lines()
                    .find(|l| l.starts_with("MemAvailable"))
                    .unwrap_or("MemAvailable: unknown")
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                (file, text, format!("{name} {avail}"))
            }
            Err(why) => (
                file,
                format!("unreadable: {why}\n"),
                format!("{name} unreadable: {why}"),
            ),
        }
    });
    futures_util::future::join_all(reads).await
}

async fn head_facts(meminfo: &Path) -> Result<String, String> {
    let args = [meminfo.display().to_string()];
    let run = sparkgate_docker::run_script(None, FACTS, &args);
    match tokio::time::timeout(PART_LIMIT, run).await {
        Ok(out) => out.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {} s", PART_LIMIT.as_secs())),
    }
}

async fn worker_facts(link: &crate::rank::WorkerLink) -> Result<String, String> {
    let read = async {
        let node = link.node().await.map_err(|e| e.to_string())?;
        let facts = sparkgate_docker::run_script(Some(&node), FACTS, &["/proc/meminfo"]);
        facts.await.map_err(|e| e.to_string())
    };
    tokio::time::timeout(PART_LIMIT, read)
        .await
        .unwrap_or_else(|_| Err(format!("no answer over SSH within {} s", PART_LIMIT.as_secs())))
}

/// A bundle as `sparkgate logs --diagnostics` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bundle {
    pub epoch: u64,
    pub path: String,
    /// Its summary's reason line.
    pub reason: String,
    pub files: Vec<String>,
}

/// Every bundle under `log_dir`, oldest epoch first.
pub(crate) fn bundles(log_dir: &Path) -> Vec<Bundle> {
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return Vec::new();
    };
    let mut out: Vec<Bundle> = entries
        .flatten()
        .filter_map(|e| {
            let epoch = e.file_name().to_str()?.strip_prefix("epoch-")?.parse().ok()?;
            let dir = e.path().join("diagnostics");
            let summary = std::fs::read_to_string(dir.join("summary.txt")).ok()?;
            let reason = summary.lines().next()?.strip_prefix("reason: ")?.to_owned();
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .ok()?
                .flatten()
                .filter_map(|f| f.file_name().into_string().ok())
                .collect();
            files.sort();
            Some(Bundle {
                epoch,
                path: dir.display().to_string(),
                reason,
                files,
            })
        })
        .collect();
    out.sort_by_key(|b| b.epoch);
    out
}
