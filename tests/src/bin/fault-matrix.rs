//! The whole fault matrix (`sparkgate_tests::faults`): every fault in turn under client loops,
//! then the table for BENCHMARKS.md. `--loops N` (default 6), `--only NAME[,NAME]` to pick
//! faults by name; exits 1 when a row is not clean.
//!
//! cargo build --release --bins && target/release/fault-matrix

use sparkgate_tests::faults::{table, Fault, Rig, Row};

/// Runs each of `faults` that `only` names (all without it) on `rig`, adding its row.
fn run(rig: &mut Rig, faults: &[Fault], only: Option<&str>, loops: usize, rows: &mut Vec<(Fault, Row)>) {
    for &fault in faults {
        if only.is_some_and(|o| !o.split(',').any(|n| n == fault.name())) {
            continue;
        }
        eprintln!("fault-matrix: {}", fault.name());
        let row = rig.run(fault, loops);
        eprintln!("  {row:?}");
        rows.push((fault, row));
    }
}

/// How a rig of its own is made (`Rig::over_ssh`, `Rig::docker_over_ssh`).
type RigFn = fn(&str) -> Rig;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let loops = sparkgate_tests::harness::flag_value(&args, "--loops").map_or(6, |v| v.parse().unwrap_or(6));
    let only = sparkgate_tests::harness::flag_value(&args, "--only");
    let exe = std::env::current_exe().expect("exe");
    let sim = exe.with_file_name("vllm-sim");
    let sim = sim.to_str().expect("path");
    let mut rows = Vec::new();
    run(&mut Rig::start(sim), &Fault::ALL, only.as_deref(), loops, &mut rows);
    // The worker over SSH on rigs of their own (a process, a container): its session cut.
    let ssh_rigs: [(RigFn, Fault); 2] = [
        (Rig::over_ssh, Fault::SshCut),
        (Rig::docker_over_ssh, Fault::DockerSshCut),
    ];
    for (rig, fault) in ssh_rigs {
        if only.as_deref().is_none_or(|o| o.split(',').any(|n| n == fault.name())) {
            run(&mut rig(sim), &[fault], None, loops, &mut rows);
        }
    }
    print!("{}", table(&rows));
    let dirty: Vec<&str> = rows.iter().filter(|(_, r)| !r.clean()).map(|(f, _)| f.name()).collect();
    if !dirty.is_empty() {
        eprintln!("fault-matrix: not clean: {}", dirty.join(", "));
        std::process::exit(1);
    }
}
