//! Microbenchmarks of the hot path's pure parts (`sparkgate_gateway::microbench`): wall time
//! per iteration, and instructions per iteration under callgrind, which do not drift with the
//! machine's load. `--check` fails when a case needs more instructions than its committed
//! baseline (`benches/baseline.json`) by more than `--margin` percent and by more than
//! `FLOOR_INSTRUCTIONS` (an unrelated change moves inlining by a few instructions, which is
//! 3 % of the smallest case and nothing of a request); `--bless` rewrites it.
//!
//! `cargo bench -p sparkgate-gateway --bench hot_path -- --check` (valgrind on PATH).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use sparkgate_gateway::microbench::{cases, Case};

#[derive(Debug, Default)]
struct Options {
    check: bool,
    bless: bool,
    margin_pct: f64,
    only: Option<String>,
    /// Internal: run one case this many times (what callgrind is given).
    run: Option<(String, u64)>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        margin_pct: 2.0,
        ..Options::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            "--check" => o.check = true,
            "--bless" => o.bless = true,
            "--margin" => {
                o.margin_pct = args
                    .next()
                    .and_then(|m| m.parse().ok())
                    .ok_or("--margin needs a percentage")?
            }
            "--case" => o.only = Some(args.next().ok_or("--case needs a name")?),
            "--run" => {
                let name = args.next().ok_or("--run needs a case and a count")?;
                let n = args.next().and_then(|n| n.parse().ok()).ok_or("--run needs a count")?;
                o.run = Some((name, n));
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; use --check, --bless, --margin PCT, --case NAME"
                ))
            }
        }
    }
    Ok(o)
}

/// Instructions a case may gain whatever its margin: codegen noise, not a regression.
const FLOOR_INSTRUCTIONS: u64 = 16;

/// True when `ir` exceeds `base` by more than both the margin and the floor.
fn regressed(ir: u64, base: u64, margin_pct: f64) -> bool {
    ir as f64 > base as f64 * (1.0 + margin_pct / 100.0) && ir > base + FLOOR_INSTRUCTIONS
}

fn baseline_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/baseline.json")
}

fn find(name: &str) -> Result<&'static Case, String> {
    cases()
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no case {name}"))
}

/// Wall time of one iteration: enough iterations for about 0.3 s, best of three.
fn time_per_iter(case: &Case) -> Duration {
    let mut n = 1u64;
    loop {
        let t = Instant::now();
        case.run(n);
        if t.elapsed() >= Duration::from_millis(100) || n >= 1 << 30 {
            break;
        }
        n *= 2;
    }
    (0..3)
        .map(|_| {
            let t = Instant::now();
            case.run(n);
            t.elapsed() / n as u32
        })
        .min()
        .unwrap_or_default()
}

/// Instructions callgrind counts for `--run NAME iters` of this binary.
fn instructions(name: &str, iters: u64) -> Result<u64, String> {
    let out = std::env::temp_dir().join(format!("sparkgate-callgrind-{}-{name}-{iters}.out", std::process::id()));
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet"])
        // Only the case's iterations (`microbench::counted_loop`), not its set-up.
        .arg("--toggle-collect=*microbench*counted_loop*")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&me)
        .args(["--run", name, &iters.to_string()])
        .status()
        .map_err(|e| format!("valgrind: {e} (install it: apt-get install valgrind)"))?;
    if !status.success() {
        return Err(format!("valgrind exited with {status}"));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no summary line in callgrind's output".to_owned())
}

/// The case's `counted_iters` and twice as many under callgrind: the difference over
/// `counted_iters` is one iteration's cost without the setup.
fn per_iter_instructions(case: &Case) -> Result<u64, String> {
    let short = instructions(case.name, case.counted_iters)?;
    let long = instructions(case.name, 2 * case.counted_iters)?;
    Ok(long.saturating_sub(short) / case.counted_iters)
}

fn read_baseline() -> BTreeMap<String, u64> {
    std::fs::read_to_string(baseline_path())
        .ok()
        .and_then(|t| serde_json::from_str::<BTreeMap<String, u64>>(&t).ok())
        .unwrap_or_default()
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("hot_path: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some((name, n)) = &o.run {
        return match find(name) {
            Ok(case) => {
                case.run(*n);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("hot_path: {e}");
                ExitCode::from(2)
            }
        };
    }
    match report(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("hot_path: {e}");
            ExitCode::from(2)
        }
    }
}

/// Measures every case, prints the table, and checks or blesses; false when a check failed.
fn report(o: &Options) -> Result<bool, String> {
    let baseline = read_baseline();
    let mut measured = BTreeMap::new();
    let mut ok = true;
    println!("| case | ns / iter | instructions / iter | baseline | change |");
    println!("|---|---|---|---|---|");
    for case in cases().iter().filter(|c| o.only.as_deref().is_none_or(|n| n == c.name)) {
        let ns = time_per_iter(case).as_nanos();
        let ir = per_iter_instructions(case)?;
        measured.insert(case.name.to_owned(), ir);
        let (base, change) = match baseline.get(case.name) {
            Some(&b) if b > 0 => (b.to_string(), format!("{:+.2} %", (ir as f64 / b as f64 - 1.0) * 100.0)),
            _ => ("—".to_owned(), "—".to_owned()),
        };
        if o.check {
            match baseline.get(case.name) {
                Some(&b) if regressed(ir, b, o.margin_pct) => ok = false,
                None => ok = false,
                _ => {}
            }
        }
        println!("| {} | {ns} | {ir} | {base} | {change} |", case.name);
    }
    if o.bless {
        let mut all = baseline;
        all.extend(measured);
        let text = serde_json::to_string_pretty(&all).map_err(|e| e.to_string())? + "\n";
        std::fs::write(baseline_path(), text).map_err(|e| e.to_string())?;
        println!("\nwrote {}", baseline_path().display());
    }
    if o.check && !ok {
        eprintln!(
            "hot_path: a case needs more than {}% and {FLOOR_INSTRUCTIONS} over its baseline instructions, or has none (--bless records them)",
            o.margin_pct
        );
    }
    Ok(ok)
}
