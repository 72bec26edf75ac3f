//! The state machine's tests: the phase × command table (held equal to ARCHITECTURE.md's),
//! then the events of each phase and whole runs (failure, backoff, give-up, adoption).

use std::time::{Duration, Instant};

use sparkgate_config::SpecMethod;

use super::*;

fn backoff(budget: u32) -> Backoff {
    Backoff::seeded(
        Duration::from_secs(10),
        Duration::from_secs(300),
        Duration::from_secs(600),
        budget,
        7,
    )
}

fn fresh() -> Machine {
    Machine::new(SpecMethod::Dspark, backoff(3), false)
}

fn failure(reason: &str) -> Failure {
    Failure {
        reason: reason.into(),
        detected_in: None,
        cause: LossCause::Crashed,
    }
}

/// A machine in each row's phase (epoch 3, preparation done unless the row is `preparing`).
fn rows() -> Vec<(&'static str, Machine)> {
    let t0 = Instant::now();
    let at = |phase: Phase, prepared: bool| {
        let mut m = fresh();
        m.epoch = 3;
        m.prepared = prepared;
        m.phase = phase;
        m.ready_since = Some(t0);
        m
    };
    vec![
        ("stopped", at(Phase::Stopped, true)),
        ("preparing", at(Phase::Preparing { epoch: 3 }, false)),
        ("starting", at(Phase::Starting { epoch: 3 }, true)),
        ("ready", at(Phase::Ready { epoch: 3 }, true)),
        (
            "stopping (stop)",
            at(
                Phase::Stopping {
                    epoch: 3,
                    then: Then::Stay,
                },
                true,
            ),
        ),
        (
            "stopping (restart)",
            at(
                Phase::Stopping {
                    epoch: 3,
                    then: Then::Start { reason: "r".into() },
                },
                true,
            ),
        ),
        (
            "stopping (failure)",
            at(
                Phase::Stopping {
                    epoch: 3,
                    then: Then::Retry(failure("f")),
                },
                true,
            ),
        ),
        (
            "stopping (exit)",
            at(
                Phase::Stopping {
                    epoch: 3,
                    then: Then::Exit,
                },
                true,
            ),
        ),
        (
            "backoff",
            at(
                Phase::Backoff {
                    epoch: 3,
                    reason: "f".into(),
                    delay: Duration::from_secs(10),
                },
                true,
            ),
        ),
        ("failed", at(Phase::Failed { reason: "f".into() }, true)),
        ("shutting down", at(Phase::ShuttingDown, true)),
    ]
}

fn commands() -> Vec<(&'static str, Command)> {
    vec![
        ("start", Command::Start),
        ("stop", Command::Stop),
        (
            "restart",
            Command::Restart {
                reason: "operator restart".into(),
                mode: None,
            },
        ),
        (
            "switch mode",
            Command::Restart {
                reason: "spec".into(),
                mode: Some(SpecMethod::None),
            },
        ),
        ("shutdown", Command::Shutdown),
    ]
}

fn phase_name(m: &Machine) -> String {
    match &m.phase {
        Phase::Stopped => "stopped".into(),
        Phase::Preparing { .. } => "preparing".into(),
        Phase::Starting { epoch } => format!("starting e{epoch}"),
        Phase::Ready { .. } => "ready".into(),
        Phase::Stopping { then, .. } => match then {
            Then::Stay => "stopping (stop)".into(),
            Then::Start { .. } => "stopping (restart)".into(),
            Then::Retry(_) => "stopping (failure)".into(),
            Then::Exit => "stopping (exit)".into(),
        },
        Phase::Backoff { .. } => "backoff".into(),
        Phase::Failed { .. } => "failed".into(),
        Phase::ShuttingDown => "shutting down".into(),
    }
}

fn answer_name(a: Answer) -> &'static str {
    match a {
        Answer::Accepted => "accepted",
        Answer::Queued => "queued",
        Answer::AlreadyRunning => "already running",
        Answer::AlreadyStopped => "already stopped",
        Answer::ShuttingDown => "shutting down",
        Answer::Busy => "busy",
    }
}

fn action_names(actions: &[Action]) -> String {
    let names: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Publish => None,
            Action::Prepare => Some("prepare"),
            Action::CancelPrepare => Some("cancel preparation"),
            Action::Start {
                mode: SpecMethod::Dspark,
                ..
            } => Some("start"),
            Action::Start { .. } => Some("start in the new mode"),
            Action::Watch { .. } => Some("watch"),
            Action::Diagnose { .. } => Some("diagnose"),
            Action::Stop { .. } => Some("stop ranks"),
            Action::Release { .. } => Some("release"),
            Action::Wait { .. } => Some("wait"),
            Action::Exit => Some("exit"),
        })
        .collect();
    if names.is_empty() {
        "—".into()
    } else {
        names.join(", ")
    }
}

/// One cell: `answer → next phase: actions`, and the mode the next start runs when it changed.
fn cell(mut m: Machine, command: Command) -> String {
    let (answer, actions) = m.step(Event::Asked(command), Instant::now());
    let mode = if m.wanted.is_some() { " (mode kept)" } else { "" };
    format!(
        "{} → {}: {}{mode}",
        answer_name(answer.expect("a command is answered")),
        phase_name(&m),
        action_names(&actions)
    )
}

/// The table as ARCHITECTURE.md writes it.
fn rendered_table() -> String {
    let mut out = String::from("| phase \\ command |");
    for (name, _) in commands() {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(commands().len()));
    for (row, _) in rows() {
        out.push_str(&format!("\n| {row} |"));
        let machine_for = || rows().into_iter().find(|(r, _)| *r == row).unwrap().1;
        for (_, command) in commands() {
            out.push_str(&format!(" {} |", cell(machine_for(), command)));
        }
    }
    out
}

#[test]
fn every_phase_and_command_has_the_answer_architecture_md_writes() {
    let doc = include_str!("../../ARCHITECTURE.md");
    let table = rendered_table();
    assert!(
        doc.contains(&table),
        "ARCHITECTURE.md's phase × command table differs from the machine; the machine's:\n{table}"
    );
}

#[test]
fn start_while_running_touches_nothing() {
    for (row, m) in rows() {
        if matches!(
            m.phase,
            Phase::Starting { .. } | Phase::Ready { .. } | Phase::Preparing { .. }
        ) {
            let mut m = m;
            let before = m.phase.clone();
            let (answer, actions) = m.step(Event::Asked(Command::Start), Instant::now());
            assert_eq!(answer, Some(Answer::AlreadyRunning), "{row}");
            assert!(actions.is_empty(), "{row}: {actions:?}");
            assert_eq!(m.phase, before, "{row}");
            assert_eq!(m.epoch, 3, "{row}: no new epoch");
        }
    }
}

#[test]
fn a_mode_switch_asked_during_a_start_or_a_stop_is_kept_for_the_next_start() {
    let switch = Command::Restart {
        reason: "spec".into(),
        mode: Some(SpecMethod::None),
    };
    for (row, mut m) in rows() {
        if !matches!(
            m.phase,
            Phase::Preparing { .. }
                | Phase::Stopping {
                    then: Then::Stay | Then::Start { .. } | Then::Retry(_),
                    ..
                }
        ) {
            continue;
        }
        m.step(Event::Asked(switch.clone()), Instant::now());
        assert_eq!(m.next_mode(), SpecMethod::None, "{row}");
        // Finish whatever was under way: the next start runs the asked mode.
        let now = Instant::now();
        let (_, actions) = match m.phase {
            Phase::Preparing { .. } => m.step(Event::Prepared(Ok(())), now),
            _ => m.step(Event::Down { epoch: 3 }, now),
        };
        assert!(
            actions.contains(&Action::Start {
                epoch: m.epoch,
                mode: SpecMethod::None
            }),
            "{row}: {actions:?}"
        );
    }
}

#[test]
fn a_shutdown_never_schedules_a_start() {
    for (row, mut m) in rows() {
        let now = Instant::now();
        let (_, mut actions) = m.step(Event::Asked(Command::Shutdown), now);
        // Whatever follows — the stop ending, a timer, a rank exit, a late start — starts nothing.
        for ev in [
            Event::Down { epoch: 3 },
            Event::RetryDue { epoch: 3 },
            Event::RankExited {
                epoch: 3,
                reason: "x".into(),
                cause: LossCause::Crashed,
            },
            Event::Up {
                epoch: 3,
                outcome: Ok(()),
            },
            Event::Prepared(Ok(())),
            Event::Asked(Command::Start),
            Event::Asked(Command::Restart {
                reason: "r".into(),
                mode: None,
            }),
        ] {
            actions.extend(m.step(ev, now).1);
        }
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::Start { .. } | Action::Prepare | Action::Wait { .. })),
            "{row}: {actions:?}"
        );
        if row != "shutting down" {
            assert!(
                actions.contains(&Action::Exit),
                "{row}: the supervisor ends: {actions:?}"
            );
        }
        assert_eq!(m.phase, Phase::ShuttingDown, "{row}");
    }
}

#[test]
fn a_ready_group_is_left_for_adoption_when_asked() {
    let mut m = Machine::new(SpecMethod::Dspark, backoff(3), true);
    m.begin(Origin::Fresh { prepared: true }, Instant::now());
    m.step(
        Event::Up {
            epoch: 1,
            outcome: Ok(()),
        },
        Instant::now(),
    );
    let (_, actions) = m.step(Event::Asked(Command::Shutdown), Instant::now());
    assert_eq!(
        actions,
        vec![Action::Release { epoch: 1 }, Action::Publish, Action::Exit]
    );
}

#[test]
fn events_of_another_epoch_or_phase_change_nothing() {
    let now = Instant::now();
    for (row, m) in rows() {
        for ev in [
            Event::RankExited {
                epoch: 2,
                reason: "old".into(),
                cause: LossCause::Crashed,
            },
            Event::Up {
                epoch: 2,
                outcome: Ok(()),
            },
            Event::Down { epoch: 2 },
            Event::RetryDue { epoch: 2 },
            Event::Unwell {
                epoch: 4,
                failure: failure("future"),
            },
        ] {
            let mut m2 = rows().into_iter().find(|(r, _)| *r == row).unwrap().1;
            let (_, actions) = m2.step(ev.clone(), now);
            assert!(actions.is_empty(), "{row} {ev:?}: {actions:?}");
            assert_eq!(m2.phase, m.phase, "{row} {ev:?}");
        }
    }
}

#[test]
fn a_rank_exit_while_stopping_is_expected() {
    let mut m = rows().remove(4).1;
    let (_, actions) = m.step(
        Event::RankExited {
            epoch: 3,
            reason: "killed".into(),
            cause: LossCause::Crashed,
        },
        Instant::now(),
    );
    assert!(actions.is_empty());
    assert_eq!(m.restarts, 0);
}

#[test]
fn failures_back_off_and_the_budget_gives_up() {
    let t0 = Instant::now();
    let mut m = fresh();
    assert_eq!(
        m.begin(Origin::Fresh { prepared: false }, t0),
        vec![Action::Publish, Action::Prepare]
    );
    let (_, a) = m.step(Event::Prepared(Ok(())), t0);
    assert_eq!(
        a,
        vec![
            Action::Publish,
            Action::Start {
                epoch: 1,
                mode: SpecMethod::Dspark
            }
        ]
    );
    let mut delays = Vec::new();
    for epoch in 1..=4u64 {
        m.step(Event::Up { epoch, outcome: Ok(()) }, t0);
        let (_, a) = m.step(
            Event::RankExited {
                epoch,
                reason: format!("rank 1 exited (signal 9), epoch {epoch}"),
                cause: LossCause::Killed,
            },
            t0,
        );
        assert!(
            matches!(
                a.as_slice(),
                [Action::Publish, Action::Diagnose { epoch: e, failure }, Action::Stop { epoch: s }]
                    if *e == epoch && *s == epoch && failure.cause == LossCause::Killed
            ),
            "a lost group is diagnosed, then stopped: {a:?}"
        );
        assert!(
            matches!(
                m.group_state(),
                GroupState::Restarting {
                    cause: Some(LossCause::Killed),
                    ..
                }
            ),
            "the published state names what ended the group: {:?}",
            m.group_state()
        );
        let (_, a) = m.step(Event::Down { epoch }, t0);
        if epoch == 4 {
            assert_eq!(a, vec![Action::Publish]);
            let GroupState::Failed { reason } = m.group_state() else {
                panic!("{:?}", m.phase)
            };
            assert!(
                reason.contains("gave up after 3 failures") && reason.contains("epoch 4"),
                "{reason}"
            );
            break;
        }
        let Some(Action::Wait { delay, .. }) = a.last().cloned() else {
            panic!("{a:?}")
        };
        delays.push(delay.as_secs_f64());
        let (_, a) = m.step(Event::RetryDue { epoch }, t0);
        assert!(a.contains(&Action::Start {
            epoch: epoch + 1,
            mode: SpecMethod::Dspark
        }));
    }
    assert!(delays[0] < delays[1] && delays[1] < delays[2], "{delays:?}");
    assert_eq!(m.restarts, 4);
    assert_eq!(m.last_restart.as_ref().unwrap().detected_in_s, Some(0.0));
    // An operator's start leaves Failed with a clean budget.
    let (answer, a) = m.step(Event::Asked(Command::Start), t0);
    assert_eq!(answer, Some(Answer::Accepted));
    assert!(a.contains(&Action::Start {
        epoch: 5,
        mode: SpecMethod::Dspark
    }));
}

#[test]
fn a_long_healthy_run_resets_the_budget() {
    let t0 = Instant::now();
    let mut m = Machine::new(SpecMethod::Dspark, backoff(1), false);
    m.begin(Origin::Fresh { prepared: true }, t0);
    for epoch in 1..=3u64 {
        let up = t0 + Duration::from_secs(1000 * epoch);
        m.step(Event::Up { epoch, outcome: Ok(()) }, up);
        m.step(
            Event::Unwell {
                epoch,
                failure: failure("stall"),
            },
            up + Duration::from_secs(601),
        );
        let (_, a) = m.step(Event::Down { epoch }, up + Duration::from_secs(602));
        assert!(matches!(a.last(), Some(Action::Wait { .. })), "epoch {epoch}: {a:?}");
        m.step(Event::RetryDue { epoch }, up + Duration::from_secs(700));
    }
}

#[test]
fn a_failed_start_stops_its_ranks_then_backs_off() {
    let t0 = Instant::now();
    let mut m = fresh();
    m.begin(Origin::Fresh { prepared: true }, t0);
    let (_, a) = m.step(
        Event::Up {
            epoch: 1,
            outcome: Err("READY_TIMEOUT".into()),
        },
        t0,
    );
    assert!(
        matches!(
            a.as_slice(),
            [Action::Publish, Action::Diagnose { epoch: 1, failure }, Action::Stop { epoch: 1 }]
                if failure.cause == LossCause::FailedStart && failure.reason == "READY_TIMEOUT"
        ),
        "a failed start is diagnosed, then stopped: {a:?}"
    );
    let (_, a) = m.step(Event::Down { epoch: 1 }, t0);
    assert!(matches!(a.last(), Some(Action::Wait { epoch: 1, .. })), "{a:?}");
    assert_eq!(m.last_restart.as_ref().unwrap().reason, "READY_TIMEOUT");
}

#[test]
fn an_adopted_group_is_watched_without_a_start() {
    let mut m = fresh();
    let a = m.begin(Origin::Adopted { epoch: 7 }, Instant::now());
    assert_eq!(a, vec![Action::Watch { epoch: 7 }, Action::Publish]);
    assert_eq!(m.group_state(), GroupState::Ready { epoch: 7 });
    let (_, a) = m.step(
        Event::Asked(Command::Restart {
            reason: "r".into(),
            mode: None,
        }),
        Instant::now(),
    );
    assert_eq!(a, vec![Action::Publish, Action::Stop { epoch: 7 }]);
    let (_, a) = m.step(Event::Down { epoch: 7 }, Instant::now());
    assert!(a.contains(&Action::Start {
        epoch: 8,
        mode: SpecMethod::Dspark
    }));
}

#[test]
fn a_stalled_group_reports_when_it_was_last_seen() {
    let t0 = Instant::now();
    let mut m = fresh();
    m.begin(Origin::Fresh { prepared: true }, t0);
    m.step(
        Event::Up {
            epoch: 1,
            outcome: Ok(()),
        },
        t0,
    );
    m.step(
        Event::Unwell {
            epoch: 1,
            failure: Failure {
                reason: "no engine step for 10 s".into(),
                detected_in: Some(Duration::from_secs(10)),
                cause: LossCause::Unwell,
            },
        },
        t0,
    );
    m.step(Event::Down { epoch: 1 }, t0);
    assert_eq!(m.last_restart.unwrap().detected_in_s, Some(10.0));
}
