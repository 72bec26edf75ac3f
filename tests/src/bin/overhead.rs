//! Gateway overhead side by side: one vllm-sim (instant pacing, so the backend is not the
//! bottleneck) behind each front in turn — none, sparkgate, nginx, SMG, LiteLLM — driven by the
//! same load generator: (a) non-streaming small chats at concurrency 1/16/64, (b) streaming
//! 256-token answers (added TTFT and inter-token gaps, front CPU per 1000 requests), (c) idle
//! streams held open (front RSS per stream, against a simulator paced so slowly that they idle),
//! (d) a new connection per request at concurrency 16 (with a TLS front, a full handshake each).
//! The fronts `sparkgate-tls` and `nginx-tls` (HTTPS, one certificate of the harness's CA) are
//! run when `--fronts` names them, and compared with each other.
//! Prints ratio tables and writes JSON. `tests/overhead/run.sh` installs the peers and runs this.
//!
//! usage: overhead [--peers DIR] [--fronts direct,sparkgate,...] [--seconds S] [--rounds R]
//!                 [--streams N] [--idle N] [--out FILE] [--baseline SPARKGATE_BIN]
//!                 [--check RATIOS.json [--margin PCT]] [--bless RATIOS.json]
//!
//! After the tables, the same-run ratios (sparkgate ÷ nginx, SMG, LiteLLM per figure).
//! `--check` exits 1 when one is worse than the committed ratios by more than PCT (default 10);
//! `--bless` writes this run's ratios as the new baseline.
//!
//! `--baseline` adds a second sparkgate binary (say, a build of an earlier commit) as the front
//! `baseline`, right after `sparkgate`, so the two are compared within one run.

use serde_json::{json, Value};
use sparkgate_tests::harness::Sim;
use sparkgate_tests::overhead::load::{
    client, fresh_client, idle_streams, non_streaming, percentile, streaming, MODEL,
};
use sparkgate_tests::overhead::{ratios, Front, FrontKind, Peers};
const CONCURRENCIES: [usize; 3] = [1, 16, 64];
/// (d)'s concurrency, and its cell's name beside the concurrencies'.
const FRESH_CONCURRENCY: usize = 16;
const FRESH: &str = "fresh16";
const STREAM_CONCURRENCY: usize = 16;

struct Options {
    peers: Peers,
    fronts: Vec<FrontKind>,
    seconds: f64,
    rounds: usize,
    streams: usize,
    idle: usize,
    out: Option<String>,
    check: Option<String>,
    margin_pct: f64,
    bless: Option<String>,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| sparkgate_tests::harness::flag_value(&args, flag);
    let number = |flag: &str, default: f64| -> f64 {
        value(flag).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("overhead: {flag} needs a number, got {v:?}");
                std::process::exit(2)
            })
        })
    };
    let peers_dir = value("--peers").unwrap_or_else(|| {
        format!(
            "{}/.cache/sparkgate-overhead",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let baseline = value("--baseline").map(std::path::PathBuf::from);
    let mut fronts: Vec<FrontKind> = match value("--fronts") {
        None => FrontKind::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|n| {
                FrontKind::NAMED.into_iter().find(|k| k.name() == n).unwrap_or_else(|| {
                    let names: Vec<&str> = FrontKind::NAMED.iter().map(|k| k.name()).collect();
                    eprintln!("overhead: unknown front {n:?} ({})", names.join(", "));
                    std::process::exit(2)
                })
            })
            .collect(),
    };
    if baseline.is_some() && !fronts.contains(&FrontKind::Baseline) {
        let at = fronts
            .iter()
            .position(|k| *k == FrontKind::Sparkgate)
            .map_or(fronts.len(), |i| i + 1);
        fronts.insert(at, FrontKind::Baseline);
    }
    Options {
        peers: Peers {
            venv: format!("{peers_dir}/venv").into(),
            nginx: value("--nginx").unwrap_or_else(|| "/usr/sbin/nginx".into()).into(),
            baseline,
        },
        fronts,
        seconds: number("--seconds", 5.0),
        rounds: number("--rounds", 3.0).max(1.0) as usize,
        streams: number("--streams", 2000.0) as usize,
        idle: number("--idle", 9_000.0) as usize,
        out: value("--out"),
        check: value("--check"),
        margin_pct: number("--margin", 10.0),
        bless: value("--bless"),
    }
}

/// What every phase runs with: the options, the runtime that drives the load, and the binaries.
struct Bench {
    o: Options,
    runtime: tokio::runtime::Runtime,
    sim_bin: String,
    sparkgate: std::path::PathBuf,
}

const SIM_ARGS: [&str; 5] = ["/model", "--served-model-name", MODEL, "--max-num-seqs", "20000"];

fn main() {
    let o = options();
    let exe = std::env::current_exe().expect("exe");
    let sim_bin = exe.with_file_name("vllm-sim");
    let sparkgate = exe.with_file_name("sparkgate");
    for bin in [&sim_bin, &sparkgate] {
        if !bin.exists() {
            eprintln!(
                "overhead: {} is missing; build with `cargo build --release --bins`",
                bin.display()
            );
            std::process::exit(2);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bench = Bench {
        o,
        runtime,
        sim_bin: sim_bin.to_str().expect("utf-8 path").to_owned(),
        sparkgate,
    };
    let mut results: Vec<Value> = bench
        .o
        .fronts
        .iter()
        .map(|k| json!({"front": k.name(), "setup": k.setup_note()}))
        .collect();
    bench.non_streaming_phase(&mut results);
    bench.streaming_phase(&mut results);
    if bench.o.idle > 0 {
        bench.idle_phase(&mut results);
    }
    report(&results, &bench.o);
    std::process::exit(check_ratios(&results, &bench.o));
}

impl Bench {
    /// (a) Every front up at once in front of an instant simulator; rounds interleave the
    /// fronts so that drift on a shared machine hits them alike; each figure is the median of
    /// rounds.
    fn non_streaming_phase(&self, results: &mut [Value]) {
        let fast = Sim::start(&self.sim_bin, &SIM_ARGS, &[("SIM_SPEED", "instant")]);
        let fronts = start_all(&self.o, results, &fast.addr().to_string(), &self.sparkgate);
        let mut rounds: Vec<Vec<Value>> = vec![Vec::new(); fronts.len()];
        for round in 0..self.o.rounds {
            for (i, front) in fronts.iter().enumerate() {
                let Some(front) = front else { continue };
                let client = client();
                let mut cells = json!({});
                let cpu = || front.usage().map(|u| u.cpu_s);
                for c in CONCURRENCIES {
                    cells[c.to_string()] =
                        self.runtime
                            .block_on(non_streaming(&client, &front.base, c, self.o.seconds, &cpu));
                }
                let fresh = fresh_client();
                cells[FRESH] = self.runtime.block_on(non_streaming(
                    &fresh,
                    &front.base,
                    FRESH_CONCURRENCY,
                    self.o.seconds,
                    &cpu,
                ));
                eprintln!("   (a) round {} {}: {cells}", round + 1, front.kind.name());
                rounds[i].push(cells);
            }
        }
        for (i, r) in rounds.iter().enumerate() {
            if !r.is_empty() {
                results[i]["non_streaming"] = median_cells(r);
            }
        }
    }

    /// (b) Streams from a paced simulator (about 2 ms between tokens per stream at 16 streams),
    /// so inter-token gaps are the backend's pacing plus what the front adds.
    fn streaming_phase(&self, results: &mut [Value]) {
        let paced = Sim::start(&self.sim_bin, &SIM_ARGS, &[("SIM_SPEED", "150")]);
        for (i, &kind) in self.o.fronts.iter().enumerate() {
            if !results[i]["error"].is_null() {
                continue;
            }
            match Front::start(kind, &paced.addr().to_string(), MODEL, &self.sparkgate, &self.o.peers) {
                Ok(front) => {
                    let before = front.usage();
                    let mut r =
                        self.runtime
                            .block_on(streaming(&client(), &front.base, STREAM_CONCURRENCY, self.o.streams));
                    if let (Some(b), Some(a)) = (before, front.usage()) {
                        r["cpu_s_per_1000"] = json!((a.cpu_s - b.cpu_s) / self.o.streams as f64 * 1000.0);
                    }
                    eprintln!("   (b) {}: {r}", kind.name());
                    results[i]["streaming"] = r;
                }
                Err(e) => results[i]["streaming"] = json!({"error": e}),
            }
        }
    }

    /// (c) Idle streams: 53.7 tok/s × 0.05 shared by thousands of streams — hours per token.
    fn idle_phase(&self, results: &mut [Value]) {
        let slow = Sim::start(&self.sim_bin, &SIM_ARGS, &[("SIM_SPEED", "0.05")]);
        for (i, &kind) in self.o.fronts.iter().enumerate() {
            if !results[i]["error"].is_null() || kind == FrontKind::Direct {
                continue;
            }
            results[i]["idle"] =
                match Front::start(kind, &slow.addr().to_string(), MODEL, &self.sparkgate, &self.o.peers) {
                    Ok(front) => self.runtime.block_on(idle_streams(&front, self.o.idle)),
                    Err(e) => json!({"error": e}),
                };
            eprintln!("   (c) {}: {}", kind.name(), results[i]["idle"]);
        }
    }
}

/// `--bless` writes this run's ratios; `--check` compares them with a committed set: the exit code.
fn check_ratios(results: &[Value], o: &Options) -> i32 {
    let now = ratios::ratios(results);
    if let Some(path) = &o.bless {
        let text = serde_json::to_string_pretty(&ratios::baseline_json(&now)).unwrap_or_default() + "\n";
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("overhead: cannot write {path}: {e}");
            return 2;
        }
        println!("wrote the ratios to {path}");
    }
    let Some(path) = &o.check else { return 0 };
    let baseline: Value = match std::fs::read_to_string(path).map(|t| serde_json::from_str(&t)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            eprintln!("overhead: {path} is not JSON: {e}");
            return 2;
        }
        Err(e) => {
            eprintln!("overhead: cannot read {path}: {e}");
            return 2;
        }
    };
    let worse = ratios::regressions(&now, &baseline, o.margin_pct / 100.0);
    if worse.is_empty() {
        println!("check: no ratio is worse than {path} by more than {} %", o.margin_pct);
        return 0;
    }
    eprintln!(
        "check: {} ratio(s) worse than {path} by more than {} %:",
        worse.len(),
        o.margin_pct
    );
    for w in &worse {
        eprintln!("  {w}");
    }
    1
}

/// Starts every front against `backend`; a front that cannot run gets its reason in `results`.
fn start_all(o: &Options, results: &mut [Value], backend: &str, sparkgate: &std::path::Path) -> Vec<Option<Front>> {
    o.fronts
        .iter()
        .enumerate()
        .map(
            |(i, &kind)| match Front::start(kind, backend, MODEL, sparkgate, &o.peers) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("== {}: not run: {e}", kind.name());
                    results[i]["error"] = json!(e);
                    None
                }
            },
        )
        .collect()
}

/// Per concurrency, the median of each figure over the rounds.
fn median_cells(rounds: &[Value]) -> Value {
    let mut out = json!({});
    let keys = CONCURRENCIES.map(|c| c.to_string());
    for key in keys.iter().map(String::as_str).chain([FRESH]) {
        let mut cell = json!({});
        for field in ["rps", "p50_ms", "p99_ms", "errors", "requests", "cpu_us_per_req"] {
            let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[key][field].as_f64()).collect();
            v.sort_by(f64::total_cmp);
            if !v.is_empty() {
                cell[field] = json!(percentile(&v, 0.5));
            }
        }
        cell["rps_rounds"] = json!(rounds.iter().map(|r| r[key]["rps"].clone()).collect::<Vec<_>>());
        out[key] = cell;
    }
    out
}

fn report(results: &[Value], o: &Options) {
    report_non_streaming(results);
    report_streaming(results, o);
    report_idle(results, o);
    report_connections(results);
    println!("\nSetups:");
    for r in results {
        println!(
            "- {}: {}",
            r["front"].as_str().unwrap_or("?"),
            r["setup"].as_str().unwrap_or("")
        );
    }
    println!("\n### Same-run ratios\n\n{}", ratios::table(results));
    if let Some(path) = &o.out {
        let doc = json!({"machine": machine(), "seconds": o.seconds, "streams": o.streams, "idle": o.idle, "fronts": results});
        match std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default()) {
            Ok(()) => println!("\nwrote {path}"),
            Err(e) => eprintln!("overhead: cannot write {path}: {e}"),
        }
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn front_name(r: &Value) -> &str {
    r["front"].as_str().unwrap_or("?")
}

/// A table row for a front that did not run, its reason's first line in the first cell.
fn not_run(r: &Value, error: &str, cells: usize) {
    println!(
        "| {} | not run: {} {}",
        front_name(r),
        error.lines().next().unwrap_or(""),
        "|".repeat(cells)
    );
}

fn report_non_streaming(results: &[Value]) {
    let find = |name: &str| results.iter().find(|r| r["front"] == name);
    println!("\n### (a) non-streaming chat, 16 output tokens: req/s and latency (ms)\n");
    println!("| front | c=1 req/s | c=16 req/s | c=64 req/s | c=64 vs direct | c=64 vs sparkgate | c=1 p50 | c=1 added p50 | c=64 p50 | c=64 p99 | c=64 front CPU µs/req | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let direct = find("direct");
    let sparkgate = find("sparkgate");
    for r in results {
        if let Some(e) = r["error"].as_str() {
            println!(
                "| {} | not run: {} ||||||||||| ",
                front_name(r),
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        let a = &r["non_streaming"];
        let rps64 = num(&a["64"]["rps"]);
        let ratio = |other: Option<&Value>| other.map_or(f64::NAN, |o| rps64 / num(&o["non_streaming"]["64"]["rps"]));
        let added = direct.map_or(f64::NAN, |d| {
            num(&a["1"]["p50_ms"]) - num(&d["non_streaming"]["1"]["p50_ms"])
        });
        let errors: f64 = ["1", "16", "64"].iter().map(|c| num(&a[*c]["errors"])).sum();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {:.3} | {:+.3} | {:.3} | {:.3} | {:.1} | {} |",
            front_name(r),
            num(&a["1"]["rps"]),
            num(&a["16"]["rps"]),
            rps64,
            ratio(direct),
            ratio(sparkgate),
            num(&a["1"]["p50_ms"]),
            added,
            num(&a["64"]["p50_ms"]),
            num(&a["64"]["p99_ms"]),
            num(&a["64"]["cpu_us_per_req"]),
            errors
        );
    }
}

/// (d) a new connection per request, and the TLS pair side by side.
fn report_connections(results: &[Value]) {
    println!(
        "\n### (d) a new connection per request, c={FRESH_CONCURRENCY} (TLS: a full handshake each, no resumption)\n"
    );
    println!("| front | new connections/s | p50 ms | front CPU µs per connection | errors |");
    println!("|---|---|---|---|---|");
    for r in results.iter().filter(|r| r["error"].is_null()) {
        let f = &r["non_streaming"][FRESH];
        println!(
            "| {} | {:.0} | {:.3} | {:.1} | {} |",
            front_name(r),
            num(&f["rps"]),
            num(&f["p50_ms"]),
            num(&f["cpu_us_per_req"]),
            f["errors"]
        );
    }
    let find = |name: &str| results.iter().find(|r| r["front"] == name && r["error"].is_null());
    let (Some(ours), Some(theirs)) = (find("sparkgate-tls"), find("nginx-tls")) else {
        return;
    };
    println!("\n### TLS: sparkgate-tls ÷ nginx-tls (same run)\n");
    println!("| figure | better | sparkgate-tls | nginx-tls | ratio |");
    println!("|---|---|---|---|---|");
    let figures: [(&str, &str, &[&str]); 6] = [
        ("c=1 req/s", "higher", &["non_streaming", "1", "rps"]),
        ("c=1 p50 ms", "lower", &["non_streaming", "1", "p50_ms"]),
        ("c=64 req/s", "higher", &["non_streaming", "64", "rps"]),
        (
            "c=64 front CPU µs/req",
            "lower",
            &["non_streaming", "64", "cpu_us_per_req"],
        ),
        (
            "new connections/s (handshakes)",
            "higher",
            &["non_streaming", FRESH, "rps"],
        ),
        (
            "front CPU µs per handshake",
            "lower",
            &["non_streaming", FRESH, "cpu_us_per_req"],
        ),
    ];
    for (name, better, path) in figures {
        let get = |r: &Value| num(path.iter().fold(r, |v, k| &v[*k]));
        let (a, b) = (get(ours), get(theirs));
        println!("| {name} | {better} | {a:.3} | {b:.3} | {:.2}× |", a / b);
    }
}

fn report_streaming(results: &[Value], o: &Options) {
    let direct = results.iter().find(|r| r["front"] == "direct");
    println!(
        "\n### (b) streaming, 256 tokens, {STREAM_CONCURRENCY} at a time, {} requests, paced backend (~2 ms/token)\n",
        o.streams
    );
    println!("| front | TTFT p50 ms | added TTFT p50 ms | token gap p50 µs | token gap p99 µs | added gap p50 µs | added gap p99 µs | front CPU s / 1000 req | errors |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in results.iter().filter(|r| r["error"].is_null()) {
        let s = &r["streaming"];
        if let Some(e) = s["error"].as_str() {
            not_run(r, e, 8);
            continue;
        }
        let d = direct.map(|d| &d["streaming"]);
        println!(
            "| {} | {:.3} | {:+.3} | {:.1} | {:.1} | {:+.1} | {:+.1} | {} | {} |",
            front_name(r),
            num(&s["ttft_p50_ms"]),
            d.map_or(f64::NAN, |d| num(&s["ttft_p50_ms"]) - num(&d["ttft_p50_ms"])),
            num(&s["gap_p50_us"]),
            num(&s["gap_p99_us"]),
            d.map_or(f64::NAN, |d| num(&s["gap_p50_us"]) - num(&d["gap_p50_us"])),
            d.map_or(f64::NAN, |d| num(&s["gap_p99_us"]) - num(&d["gap_p99_us"])),
            s["cpu_s_per_1000"]
                .as_f64()
                .map_or("—".to_owned(), |c| format!("{c:.2}")),
            s["errors"]
        );
    }
}

fn report_idle(results: &[Value], o: &Options) {
    println!("\n### (c) {} idle streams held\n", o.idle);
    println!("| front | streams open | RSS before MiB | RSS held MiB | KiB per stream |");
    println!("|---|---|---|---|---|");
    for r in results
        .iter()
        .filter(|r| r["error"].is_null() && r["front"] != "direct")
    {
        let i = &r["idle"];
        if let Some(e) = i["error"].as_str() {
            not_run(r, e, 4);
            continue;
        }
        println!(
            "| {} | {} / {} | {:.1} | {:.1} | {:.1} |",
            front_name(r),
            i["open"],
            i["wanted"],
            num(&i["rss_before_kib"]) / 1024.0,
            num(&i["rss_held_kib"]) / 1024.0,
            num(&i["kib_per_stream"])
        );
    }
    // Streams that did not open, and why: a refusal, an error status, or no headers in time.
    for r in results.iter().filter(|r| r["idle"]["open"] != r["idle"]["wanted"]) {
        let i = &r["idle"];
        if i["wanted"].is_null() {
            continue;
        }
        let reasons: Vec<&str> = i["failed_because"]
            .as_array()
            .map(|w| w.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let why = match reasons.is_empty() {
            true => String::new(),
            false => format!(" ({})", reasons.join("; ")),
        };
        println!(
            "\n{}: {} failed{why}, {} without response headers after 180 s",
            front_name(r),
            i["failed"],
            i["no_headers"]
        );
    }
}

fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    json!({"cpus": cpus, "cpu": model})
}
