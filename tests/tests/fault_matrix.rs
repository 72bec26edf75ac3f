//! The fault matrix's representative subset, run in CI (`sparkgate_tests::faults`; the whole
//! matrix is `target/debug/fault-matrix`): for each fault, under six client loops mixing
//! every streaming API, nothing silently truncated, hung or lost, no 502 for a request that
//! never reached a rank, no rank process or container left over, and the group serving
//! again — the SSH cut on a process rig and on a Docker rig. Every stream cut by a fault is
//! continued (docs/resume.md; chat and completions from their token ids, temperature-0 Messages
//! and Responses by replay): none ends with an error event, and each one's text is an
//! uninterrupted run's, nothing duplicated or missing at the splice.

use sparkgate_tests::faults::{table, Fault, Rig};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

#[test]
fn each_fault_of_the_subset_loses_nothing_and_leaves_nothing() {
    let mut rig = Rig::start(SIM);
    let mut rows = Vec::new();
    for fault in [
        Fault::KillRank0,
        Fault::StopRank1,
        Fault::RestartForce,
        Fault::StartWhileRunning,
        Fault::SigtermPastDrain,
    ] {
        let row = rig.run(fault, 6);
        rows.push((fault, row));
    }
    drop(rig);
    let mut rig = Rig::over_ssh(SIM);
    rows.push((Fault::SshCut, rig.run(Fault::SshCut, 6)));
    drop(rig);
    let mut rig = Rig::docker_over_ssh(SIM);
    rows.push((Fault::DockerSshCut, rig.run(Fault::DockerSshCut, 6)));
    drop(rig);
    let t = table(&rows);
    for (fault, row) in &rows {
        assert!(row.clean(), "{}: {row:?}\n{t}", fault.name());
        assert!(row.completed > 0, "{}: the loops ran: {row:?}", fault.name());
        if *fault != Fault::SigtermPastDrain {
            assert_eq!(
                row.resumable_errors,
                0,
                "{}: every cut stream was continued: {row:?}\n{t}",
                fault.name()
            );
        }
    }
    assert!(
        rows[0].1.resumed > 0,
        "a killed rank 0 cut streams that were continued: {t}"
    );
    let (_, start) = &rows[3];
    assert_eq!(
        start.explicit_errors, 0,
        "a start on a running group breaks nothing: {start:?}"
    );
}
