//! The fault matrix's representative subset, run in CI (`sparkgate_tests::faults`; the whole
//! matrix is `target/debug/fault-matrix`): for each fault, under six client loops mixing
//! every streaming API, nothing silently truncated, hung or lost, no 502 for a request that
//! never reached a rank, no rank process or container left over, and the group serving
//! again — the SSH cut on a process rig and on a Docker rig. Every stream cut by a fault is
//! continued (docs/resume.md; chat and completions from their token ids, temperature-0 Messages
//! and Responses by replay): none ends with an error event, and each one's text is an
//! uninterrupted run's, nothing duplicated or missing at the splice. Each fault's log holds to
//! the event table (issue #39): an unplanned loss logs exactly one WARN (`group_lost`) and is
//! counted with its restart reason; a planned restart logs no loss and is counted as planned;
//! every WARN or ERROR line is an event of the table at its level, each cut stream one
//! `stream_cut`.

use sparkgate_tests::faults::trail::Trail;
use sparkgate_tests::faults::{table, Fault, Rig, Row};

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
    for (fault, row) in &rows {
        logged_as_the_table_says(*fault, row, &t);
    }
}

/// The restarts a fault is counted as (none: it restarts nothing, or starts another gateway
/// whose log and counts are new); planned ones say so.
fn expected_restarts(fault: Fault) -> Vec<&'static str> {
    let one = match fault {
        Fault::KillRank0 | Fault::KillRank1 => Some("killed"),
        Fault::StopRank0 | Fault::StopRank1 => Some("unwell"),
        // A remote rank process dies with its SSH session (a signal); a container outlives
        // it, and the supervisor loses sight of it.
        Fault::SshCut => Some("killed"),
        Fault::DockerSshCut => Some("unreachable"),
        Fault::Restart | Fault::RestartForce => Some("operator (planned)"),
        // To `none` and back.
        Fault::SpecSwitch => return vec!["spec_switch (planned)"; 2],
        _ => None,
    };
    one.into_iter().collect()
}

fn logged_as_the_table_says(fault: Fault, row: &Row, t: &str) {
    let name = fault.name();
    let Some(trail): Option<&Trail> = row.trail.as_ref() else {
        return;
    };
    assert!(
        trail.strays.is_empty(),
        "{name}: lines outside the table: {:#?}",
        trail.strays
    );
    let want: Vec<String> = expected_restarts(fault).into_iter().map(String::from).collect();
    assert_eq!(
        trail.restarts, want,
        "{name}: restarts counted
{t}"
    );
    let unplanned = want.iter().any(|r| !r.ends_with("(planned)"));
    assert_eq!(
        trail.group_lost,
        usize::from(unplanned),
        "{name}: one group_lost WARN for an unplanned loss, none otherwise: {trail:?}"
    );
    assert!(
        trail.stream_cuts as u64 >= row.resumed,
        "{name}: each continued stream's cut is logged: {trail:?}, {} resumed",
        row.resumed
    );
    assert!(
        trail.errors.is_empty(),
        "{name}: no answer or rank lost: {:#?}",
        trail.errors
    );
    if want.is_empty() {
        assert!(
            trail.loud.is_empty(),
            "{name}: nothing unplanned, nothing loud: {trail:?}"
        );
    }
}
