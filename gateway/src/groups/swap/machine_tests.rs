//! The swap machine in virtual time: a swap's whole way, the dwell and the spacing of swaps,
//! idle unloads, a model that would not fit, memory that does not come back, ranks that fail
//! to start, an operator's asks and a stop.

use super::*;
use sparkgate_config::SwapPolicy;

const A: ModelId = ModelId(0);
const B: ModelId = ModelId(1);

fn settings() -> Settings {
    Settings {
        policy: SwapPolicy::OnDemand,
        drain: Duration::from_secs(30),
        dwell: Duration::from_secs(60),
        idle_unload: None,
        margin_gib: 4.0,
        release_timeout: Duration::from_secs(120),
        needs: vec![None, None],
        names: vec!["A".into(), "B".into()],
    }
}

/// A test world: the machine and what it sees.
struct World {
    m: Machine,
    t0: Instant,
    now: Instant,
    waiting: [ModelWaiting; 2],
    running: u32,
    groups: [GroupIs; 2],
}

impl World {
    fn serving(settings: Settings) -> World {
        let t0 = Instant::now();
        let (m, actions) = Machine::new(settings, A, true, t0);
        assert_eq!(actions, [Action::Load(A.bit())]);
        World {
            m,
            t0,
            now: t0,
            waiting: [ModelWaiting::default(); 2],
            running: 0,
            groups: [GroupIs::Ready, GroupIs::Stopped],
        }
    }

    fn at(&mut self, s: u64) -> &mut Self {
        self.now = self.t0 + Duration::from_secs(s);
        self
    }

    fn wait(&mut self, m: ModelId, count: usize) -> &mut Self {
        self.waiting[m.index()] = ModelWaiting {
            count,
            oldest: (count > 0).then_some(self.t0),
        };
        self
    }

    fn tick(&mut self) -> Vec<Action> {
        let seen = Seen {
            now: self.now,
            waiting: &self.waiting,
            running: self.running,
            groups: &self.groups,
        };
        self.m.step(Event::Tick(seen)).1
    }

    fn memory(&mut self, head: f64) -> Vec<Action> {
        let nodes = vec![NodeMemory {
            node: "head".into(),
            mem_available_gib: Some(head),
        }];
        self.m.step(Event::Memory(nodes, self.now)).1
    }

    fn ask(&mut self, m: ModelId) -> (Answer, Vec<Action>) {
        let (answer, actions) = self.m.step(Event::Asked(m, self.now));
        (answer.expect("an ask is answered"), actions)
    }
}

fn began(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::Began(_)))
}

#[test]
fn a_swap_drains_stops_confirms_the_memory_then_starts_the_other_model() {
    let mut w = World::serving(settings());
    // The start's reading: nothing loaded yet, 120 GiB free.
    w.m.baseline = Some(vec![NodeMemory {
        node: "head".into(),
        mem_available_gib: Some(120.0),
    }]);
    w.wait(B, 3).running = 2;
    // A has work: it keeps the pair for the dwell.
    assert!(w.at(30).tick().is_empty());
    let actions = w.at(60).tick();
    assert!(began(&actions), "{actions:?}");
    assert!(
        actions.contains(&Action::Load(0)) && actions.contains(&Action::Drain(A, true)),
        "{actions:?}"
    );
    // Admitted requests finish first.
    assert!(w.at(61).tick().is_empty());
    w.running = 0;
    assert_eq!(w.at(62).tick(), [Action::Stop(A), Action::Drain(A, false)]);
    // Until A's ranks are down nothing else happens.
    assert!(w.at(63).tick().is_empty());
    w.groups[0] = GroupIs::Stopped;
    assert_eq!(w.at(70).tick(), [Action::ReadMemory]);
    // Memory still held by A's ranks: not yet.
    assert!(w.memory(20.0).is_empty());
    assert_eq!(w.at(72).tick(), [Action::ReadMemory]);
    assert_eq!(w.memory(117.0), [Action::Start(B)]);
    w.groups[1] = GroupIs::Busy;
    assert!(w.at(80).tick().is_empty());
    w.groups[1] = GroupIs::Ready;
    let actions = w.at(90).tick();
    assert_eq!(actions[..2], [Action::Load(B.bit()), Action::Note(None)]);
    assert!(
        matches!(actions[2], Action::Done(s, d) if s.from == Some(A) && s.to == Some(B) && d == Duration::from_secs(30))
    );
    assert_eq!(w.m.loaded(), Some(B));
}

#[test]
fn swaps_start_at_most_once_per_dwell_and_at_once_when_the_loaded_model_is_idle() {
    let mut w = World::serving(settings());
    w.wait(B, 1);
    // A has nothing to do: B's waiter swaps it out at once.
    assert!(began(&w.at(1).tick()));
    w.running = 0;
    w.at(2).tick();
    w.groups = [GroupIs::Stopped, GroupIs::Stopped];
    w.at(3).tick();
    assert_eq!(w.memory(100.0), [Action::Start(B)]);
    w.groups[1] = GroupIs::Ready;
    w.wait(B, 0).wait(A, 1);
    w.at(4).tick();
    assert_eq!(w.m.loaded(), Some(B));
    // B idle, A waiting: but the last swap began at 1 s, so not before 61 s.
    assert!(!began(&w.at(30).tick()));
    assert!(began(&w.at(61).tick()));
}

#[test]
fn the_manual_policy_never_swaps_on_demand_but_an_operator_does() {
    let mut w = World::serving(Settings {
        policy: SwapPolicy::Manual,
        ..settings()
    });
    w.wait(B, 5);
    assert!(w.at(1000).tick().is_empty());
    assert_eq!(w.ask(A).0, Answer::Loaded);
    let (answer, actions) = w.ask(B);
    assert_eq!(answer, Answer::Accepted);
    assert!(began(&actions));
    // Asked again while it runs: under way; the other model: busy.
    assert_eq!(w.ask(B).0, Answer::Accepted);
    assert_eq!(w.ask(A).0, Answer::Busy(B));
}

#[test]
fn a_model_that_would_not_fit_is_refused_and_the_loaded_one_stays() {
    let mut w = World::serving(Settings {
        needs: vec![None, Some(111.5)],
        ..settings()
    });
    w.m.baseline = Some(vec![NodeMemory {
        node: "head".into(),
        mem_available_gib: Some(100.0),
    }]);
    w.wait(B, 2);
    let actions = w.at(1).tick();
    assert!(
        matches!(&actions[0], Action::Refuse(m, why) if *m == B && why.contains("needs 111.5 GiB") && why.contains("head has 100.0 GiB")),
        "{actions:?}"
    );
    assert!(matches!(actions[1], Action::Failed(..)));
    assert_eq!(w.m.phase, Phase::Serving { model: A, since: w.t0 });
    assert!(matches!(w.ask(B).0, Answer::Refused(_)));
}

#[test]
fn memory_that_does_not_come_back_starts_the_old_model_again() {
    let mut w = World::serving(settings());
    w.m.baseline = Some(vec![NodeMemory {
        node: "head".into(),
        mem_available_gib: Some(120.0),
    }]);
    w.wait(B, 1);
    w.at(1).tick();
    w.at(2).tick();
    w.groups[0] = GroupIs::Stopped;
    w.at(3).tick();
    assert!(w.memory(50.0).is_empty());
    let actions = w.at(200).tick();
    assert!(
        matches!(&actions[0], Action::Refuse(m, why) if *m == B && why.contains("did not come back")),
        "{actions:?}"
    );
    assert_eq!(actions.last(), Some(&Action::Start(A)));
    w.groups[0] = GroupIs::Ready;
    let actions = w.at(210).tick();
    assert!(matches!(actions.last(), Some(Action::Done(s, _)) if s.trigger == Trigger::Revert && s.to == Some(A)));
    assert_eq!(w.m.loaded(), Some(A));
}

#[test]
fn ranks_that_fail_to_start_are_stopped_their_waiters_answered_and_the_old_model_reloaded() {
    let mut w = World::serving(settings());
    w.wait(B, 4);
    w.at(1).tick();
    w.at(2).tick();
    w.groups[0] = GroupIs::Stopped;
    w.at(3).tick();
    assert_eq!(w.memory(100.0), [Action::Start(B)]);
    w.groups[1] = GroupIs::Backoff("rank 0 exited (code 1)".into());
    let actions = w.at(10).tick();
    assert_eq!(actions[0], Action::Stop(B));
    assert!(matches!(&actions[1], Action::Refuse(m, why) if *m == B && why.contains("failed to start: rank 0 exited")));
    // B's ranks go first, then the memory is checked, then A starts again.
    assert!(w.at(11).tick().is_empty());
    w.groups[1] = GroupIs::Stopped;
    assert_eq!(w.at(12).tick(), [Action::ReadMemory]);
    assert_eq!(w.memory(100.0), [Action::Start(A)]);
}

#[test]
fn an_idle_model_is_unloaded_and_the_next_request_loads_its_own() {
    let mut w = World::serving(Settings {
        idle_unload: Some(Duration::from_secs(300)),
        ..settings()
    });
    assert!(w.at(299).tick().is_empty());
    let actions = w.at(300).tick();
    assert!(
        actions.contains(&Action::Drain(A, true)) && !began(&actions),
        "{actions:?}"
    );
    assert_eq!(w.at(301).tick(), [Action::Stop(A), Action::Drain(A, false)]);
    w.groups[0] = GroupIs::Stopped;
    assert!(matches!(w.at(302).tick()[0], Action::Unloaded(m, _) if m == A));
    assert!(matches!(w.m.phase, Phase::Idle { .. }));
    w.wait(B, 1);
    let actions = w.at(400).tick();
    assert!(began(&actions) && actions.contains(&Action::ReadMemory), "{actions:?}");
    assert_eq!(w.memory(120.0), [Action::Start(B)]);
}

#[test]
fn a_stop_by_an_operator_halts_swaps_and_answers_the_other_models_waiters() {
    let mut w = World::serving(settings());
    w.running = 1;
    w.wait(B, 2);
    w.groups[0] = GroupIs::Stopped;
    let actions = w.at(5).tick();
    assert!(
        matches!(&actions[..], [Action::Refuse(m, why)] if *m == B && why.contains("was stopped")),
        "{actions:?}"
    );
    assert!(w.at(500).tick().is_empty(), "no swap while halted");
    // An operator's start serves A again.
    w.groups[0] = GroupIs::Ready;
    assert_eq!(w.at(501).tick(), [Action::Load(A.bit()), Action::Note(None)]);
}

#[test]
fn the_start_reads_the_memory_then_loads_the_default() {
    let t0 = Instant::now();
    let (mut m, actions) = Machine::new(settings(), A, false, t0);
    assert_eq!(actions, [Action::Load(0), Action::ReadMemory]);
    let nodes = vec![NodeMemory {
        node: "head".into(),
        mem_available_gib: Some(120.0),
    }];
    assert_eq!(m.step(Event::Memory(nodes, t0)).1, [Action::Start(A)]);
    let groups = [GroupIs::Ready, GroupIs::Stopped];
    let waiting = [ModelWaiting::default(); 2];
    let seen = Seen {
        now: t0,
        waiting: &waiting,
        running: 0,
        groups: &groups,
    };
    // The start is no swap: no `Done`.
    assert_eq!(m.step(Event::Tick(seen)).1, [Action::Load(A.bit()), Action::Note(None)]);
}
