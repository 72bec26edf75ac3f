//! Whole runs of the state machine against a fake backend in virtual time: the actions it
//! returns are carried out as the actor carries them out (a start reports `Up` after it took
//! its time unless a stop cancels it, a stop reports `Down` at once, a wait reports `RetryDue`
//! after its delay, a watched group's rank exits when the script says), on a virtual clock that
//! jumps from one due event to the next — hours of crash loops and backoffs run in
//! microseconds, and every start's time is exact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sparkgate_config::SpecMethod;

use super::*;

const START_TAKES: Duration = Duration::from_secs(40);
const PREPARE_TAKES: Duration = Duration::from_secs(5);

/// How the fake ranks behave.
#[derive(Debug, Default)]
struct Script {
    /// Epochs whose start fails (a rank exits during the start).
    failing_starts: Vec<u64>,
    /// A rank of every group exits this long after the group is up.
    crash_after: Option<Duration>,
}

/// What the run saw, at which virtual time.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Start { epoch: u64, mode: SpecMethod },
    Stop { epoch: u64 },
    Wait { delay: Duration },
    Release { epoch: u64 },
    Exit,
}

struct Run {
    m: Machine,
    t0: Instant,
    now: Duration,
    /// Due events by (virtual time, order of scheduling).
    due: BTreeMap<(Duration, u64), Event>,
    scheduled: u64,
    script: Script,
    seen: Vec<(Duration, Seen)>,
}

impl Run {
    /// A fresh machine (restart budget `budget`, backoff 10 s doubling to 300 s, reset after
    /// 600 s healthy) begun at virtual time 0.
    fn new(script: Script, budget: u32) -> Run {
        let backoff = Backoff::seeded(
            Duration::from_secs(10),
            Duration::from_secs(300),
            Duration::from_secs(600),
            budget,
            7,
        );
        let mut run = Run {
            m: Machine::new(SpecMethod::Dspark, backoff, false),
            t0: Instant::now(),
            now: Duration::ZERO,
            due: BTreeMap::new(),
            scheduled: 0,
            script,
            seen: Vec::new(),
        };
        let actions = run.m.begin(Origin::Fresh { prepared: false }, run.t0);
        run.execute(actions);
        run
    }

    fn schedule(&mut self, after: Duration, event: Event) {
        self.scheduled += 1;
        self.due.insert((self.now + after, self.scheduled), event);
    }

    /// Drops the due events `which` matches (what a stop or a cancel takes away).
    fn cancel(&mut self, which: impl Fn(&Event) -> bool) {
        self.due.retain(|_, e| !which(e));
    }

    /// Carries out `actions` in order, as `actor::execute` does.
    fn execute(&mut self, actions: Vec<Action>) {
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            let now = self.now;
            match action {
                Action::Prepare => self.schedule(PREPARE_TAKES, Event::Prepared(Ok(()))),
                Action::CancelPrepare => self.cancel(|e| matches!(e, Event::Prepared(_))),
                Action::Start { epoch, mode } => {
                    self.seen.push((now, Seen::Start { epoch, mode }));
                    let outcome = if self.script.failing_starts.contains(&epoch) {
                        Err(format!("rank 1 exited during start (epoch {epoch})"))
                    } else {
                        Ok(())
                    };
                    self.schedule(START_TAKES, Event::Up { epoch, outcome });
                }
                Action::Watch { epoch } => {
                    if let Some(after) = self.script.crash_after {
                        let reason = format!("rank 1 exited (signal 9), epoch {epoch}");
                        self.schedule(
                            after,
                            Event::RankExited {
                                epoch,
                                reason,
                                cause: LossCause::Crashed,
                            },
                        );
                    }
                }
                Action::Diagnose { .. } => {}
                Action::Stop { epoch } => {
                    self.seen.push((now, Seen::Stop { epoch }));
                    // The start task is cancelled and the ranks are gone: nothing of this
                    // epoch reports again.
                    self.cancel(
                        |e| matches!(e, Event::Up { epoch: x, .. } | Event::RankExited { epoch: x, .. } if *x == epoch),
                    );
                    let (_, next) = self.m.step(Event::Down { epoch }, self.t0 + now);
                    queue.extend(next);
                }
                Action::Release { epoch } => self.seen.push((now, Seen::Release { epoch })),
                Action::Wait { epoch, delay } => {
                    self.seen.push((now, Seen::Wait { delay }));
                    self.schedule(delay, Event::RetryDue { epoch });
                }
                Action::Publish => {}
                Action::Exit => self.seen.push((now, Seen::Exit)),
            }
        }
    }

    /// An operator's command at the current virtual time.
    fn ask(&mut self, command: Command) -> Answer {
        let (answer, actions) = self.m.step(Event::Asked(command), self.t0 + self.now);
        self.execute(actions);
        answer.expect("a command is answered")
    }

    /// Delivers every event due until `until` (virtual), in order.
    fn run_until(&mut self, until: Duration) {
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > until {
                break;
            }
            let ((at, _), event) = entry.remove_entry();
            self.now = at;
            let (_, actions) = self.m.step(event, self.t0 + at);
            self.execute(actions);
        }
        self.now = self.now.max(until);
    }

    fn starts(&self) -> Vec<(Duration, u64, SpecMethod)> {
        self.seen
            .iter()
            .filter_map(|(t, s)| match s {
                Seen::Start { epoch, mode } => Some((*t, *epoch, *mode)),
                _ => None,
            })
            .collect()
    }

    fn ready(&self) -> Option<u64> {
        match self.m.phase {
            Phase::Ready { epoch } => Some(epoch),
            _ => None,
        }
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn the_first_start_follows_preparation_and_the_group_is_ready_when_its_ranks_are() {
    let mut run = Run::new(Script::default(), 3);
    run.run_until(secs(3600));
    assert_eq!(run.starts(), vec![(PREPARE_TAKES, 1, SpecMethod::Dspark)]);
    assert_eq!(run.ready(), Some(1));
    assert!(run.due.is_empty(), "nothing else is pending: {:?}", run.due);
}

#[test]
fn a_crash_loop_backs_off_exactly_as_waited_then_gives_up_and_never_starts_again() {
    let crash = secs(1);
    let mut run = Run::new(
        Script {
            crash_after: Some(crash),
            ..Script::default()
        },
        3,
    );
    run.run_until(secs(24 * 3600));
    let starts = run.starts();
    assert_eq!(
        starts.len(),
        4,
        "the first start and one per unit of budget: {:?}",
        run.seen
    );
    assert!(matches!(run.m.phase, Phase::Failed { .. }), "{:?}", run.m.phase);
    let waits: Vec<Duration> = run
        .seen
        .iter()
        .filter_map(|(_, s)| match s {
            Seen::Wait { delay } => Some(*delay),
            _ => None,
        })
        .collect();
    assert_eq!(waits.len(), 3);
    for (i, pair) in starts.windows(2).enumerate() {
        // Up after START_TAKES, the crash `crash` later, the stop at once, then the wait.
        assert_eq!(pair[1].0 - pair[0].0, START_TAKES + crash + waits[i], "start {}", i + 2);
        assert_eq!(pair[1].1, pair[0].1 + 1, "one epoch per start");
    }
    assert!(waits.windows(2).all(|w| w[1] > w[0]), "the backoff grows: {waits:?}");
    // An operator's start leaves Failed with a clean budget.
    assert_eq!(run.ask(Command::Start), Answer::Accepted);
    run.run_until(run.now + START_TAKES);
    assert_eq!(run.starts().len(), 5);
}

#[test]
fn a_group_healthy_past_the_reset_never_runs_out_of_budget() {
    let mut run = Run::new(
        Script {
            crash_after: Some(secs(700)),
            ..Script::default()
        },
        2,
    );
    run.run_until(secs(7 * 24 * 3600));
    assert!(
        !matches!(run.m.phase, Phase::Failed { .. }),
        "a week of crashes 700 s apart"
    );
    assert!(run.starts().len() > 500, "{}", run.starts().len());
    let longest = run
        .seen
        .iter()
        .filter_map(|(_, s)| match s {
            Seen::Wait { delay } => Some(*delay),
            _ => None,
        })
        .max()
        .expect("waits");
    assert!(
        longest <= secs(11),
        "each failure is the first in a row again: {longest:?}"
    );
}

#[test]
fn a_mode_switch_during_backoff_starts_that_mode_at_once_and_the_stale_retry_starts_nothing() {
    let mut run = Run::new(
        Script {
            failing_starts: vec![1],
            ..Script::default()
        },
        3,
    );
    run.run_until(PREPARE_TAKES + START_TAKES + secs(1));
    assert!(matches!(run.m.phase, Phase::Backoff { .. }), "{:?}", run.m.phase);
    let asked = run.ask(Command::Restart {
        reason: "operator".into(),
        mode: Some(SpecMethod::None),
    });
    assert_eq!(asked, Answer::Accepted);
    run.run_until(secs(3600));
    let starts = run.starts();
    assert_eq!(starts.len(), 2, "{:?}", run.seen);
    assert_eq!(starts[1].1, 2);
    assert_eq!(starts[1].2, SpecMethod::None);
    assert_eq!(
        starts[1].0,
        PREPARE_TAKES + START_TAKES + secs(1),
        "at once, not after the backoff"
    );
    assert_eq!(run.ready(), Some(2), "the old backoff's retry came and changed nothing");
}

#[test]
fn a_mode_switch_during_a_start_stops_that_start_and_starts_the_mode() {
    let mut run = Run::new(Script::default(), 3);
    run.run_until(PREPARE_TAKES + secs(10));
    let asked = run.ask(Command::Restart {
        reason: "spec".into(),
        mode: Some(SpecMethod::Mtp),
    });
    assert_eq!(asked, Answer::Accepted);
    run.run_until(secs(3600));
    let starts = run.starts();
    assert_eq!(starts.last().map(|s| s.2), Some(SpecMethod::Mtp), "{:?}", run.seen);
    assert_eq!(run.ready(), Some(starts.last().unwrap().1));
    assert_eq!(run.m.mode, SpecMethod::Mtp);
}

#[test]
fn a_shutdown_in_any_phase_of_a_run_never_starts_anything_again() {
    let script = || Script {
        failing_starts: vec![1],
        ..Script::default()
    };
    // During preparation, the first start, the backoff, the second start, and when ready.
    for at in [secs(1), secs(20), secs(50), secs(70), secs(200)] {
        let mut run = Run::new(script(), 3);
        run.run_until(at);
        let phase = format!("{:?}", run.m.phase);
        let started_before = run.starts().len();
        assert_eq!(run.ask(Command::Shutdown), Answer::Accepted, "{phase}");
        run.run_until(secs(24 * 3600));
        assert_eq!(
            run.starts().len(),
            started_before,
            "shutdown in {phase}: {:?}",
            run.seen
        );
        assert_eq!(run.seen.last().map(|s| &s.1), Some(&Seen::Exit), "{phase}");
        assert_eq!(run.ask(Command::Start), Answer::ShuttingDown, "{phase}");
    }
}

#[test]
fn start_on_a_running_group_leaves_it_alone_for_the_rest_of_the_run() {
    let mut run = Run::new(Script::default(), 3);
    run.run_until(secs(100));
    let before = run.seen.clone();
    assert_eq!(run.ask(Command::Start), Answer::AlreadyRunning);
    run.run_until(secs(3600));
    assert_eq!(run.seen, before, "no stop, no start");
    assert_eq!(run.ready(), Some(1));
}

#[test]
fn a_stop_during_a_start_cancels_it_and_a_later_start_is_a_new_epoch() {
    let mut run = Run::new(Script::default(), 3);
    run.run_until(PREPARE_TAKES + secs(10));
    assert_eq!(run.ask(Command::Stop), Answer::Accepted);
    run.run_until(secs(600));
    assert_eq!(run.m.phase, Phase::Stopped, "the cancelled start never came up");
    assert_eq!(run.ask(Command::Start), Answer::Accepted);
    run.run_until(secs(1200));
    assert_eq!(run.ready(), Some(2));
    let seen: Vec<&Seen> = run.seen.iter().map(|(_, s)| s).collect();
    assert_eq!(
        seen,
        [
            &Seen::Start {
                epoch: 1,
                mode: SpecMethod::Dspark
            },
            &Seen::Stop { epoch: 1 },
            &Seen::Start {
                epoch: 2,
                mode: SpecMethod::Dspark
            },
        ]
    );
}
