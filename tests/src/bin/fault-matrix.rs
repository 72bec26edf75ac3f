//! The whole fault matrix (`sparkgate_tests::faults`): every fault in turn under client loops,
//! then the table for BENCHMARKS.md. `--loops N` (default 6), `--only NAME[,NAME]` to pick
//! faults by name; exits 1 when a row is not clean.
//!
//! cargo build --release --bins && target/release/fault-matrix

use sparkgate_tests::faults::{table, Fault, Rig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let loops = sparkgate_tests::harness::flag_value(&args, "--loops").map_or(6, |v| v.parse().unwrap_or(6));
    let only = sparkgate_tests::harness::flag_value(&args, "--only");
    let exe = std::env::current_exe().expect("exe");
    let (sim, sparkgate) = (exe.with_file_name("vllm-sim"), exe.with_file_name("sparkgate"));
    let mut rig = Rig::start(sparkgate.to_str().expect("path"), sim.to_str().expect("path"));
    let mut rows = Vec::new();
    for fault in Fault::ALL {
        if only.as_ref().is_some_and(|o| !o.split(',').any(|n| n == fault.name())) {
            continue;
        }
        eprintln!("fault-matrix: {}", fault.name());
        let row = rig.run(fault, loops);
        eprintln!("  {row:?}");
        rows.push((fault, row));
    }
    drop(rig);
    // The worker over SSH: its session cut, and its rank killed.
    let mut rig = Rig::over_ssh(sparkgate.to_str().expect("path"), sim.to_str().expect("path"));
    for fault in [Fault::SshCut] {
        if only.as_ref().is_some_and(|o| !o.split(',').any(|n| n == fault.name())) {
            continue;
        }
        eprintln!("fault-matrix: {}", fault.name());
        let row = rig.run(fault, loops);
        eprintln!("  {row:?}");
        rows.push((fault, row));
    }
    print!("{}", table(&rows));
    let dirty: Vec<&str> = rows.iter().filter(|(_, r)| !r.clean()).map(|(f, _)| f.name()).collect();
    drop(rig);
    if !dirty.is_empty() {
        eprintln!("fault-matrix: not clean: {}", dirty.join(", "));
        std::process::exit(1);
    }
}
