//! One rank group as the gateway sees it (`Group`: its upstream, supervisor, view and slots)
//! and a request's hold on some of its slots (`Lease`); `Fenced` is what the abort fence keeps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sparkgate_config::SpecMethod;
use sparkgate_supervisor::{GroupState, LossCause, Status, SupervisorHandle};

use crate::control::admission::Reservation;
use crate::control::state::UpstreamState;
use crate::upstream::Upstream;

/// What the gateway knows of one group: its supervisor's state as admission sees it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct View {
    pub(super) state: UpstreamState,
    pub(super) mode: SpecMethod,
    pub(super) capacity: u32,
}

/// How a serving group was lost, as its supervisor published it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// A failure, and what ended the group.
    Failed(LossCause),
    /// Stopped on purpose: an operator's restart, stop or mode switch, or the gateway's exit.
    Stopped,
}

impl Lost {
    /// The loss a status published after the serving one tells: the state under way, else (the
    /// watch kept only a later state) the last restart's cause.
    fn of(s: &Status) -> Lost {
        match &s.state {
            GroupState::Restarting { cause: Some(c), .. } => Lost::Failed(*c),
            GroupState::Restarting { cause: None, .. }
            | GroupState::Stopping
            | GroupState::Stopped
            | GroupState::ShuttingDown => Lost::Stopped,
            _ => s
                .last_restart
                .as_ref()
                .and_then(|r| r.cause)
                .map_or(Lost::Stopped, Lost::Failed),
        }
    }
}

/// One rank group.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) upstream: Upstream,
    pub(crate) supervisor: Option<SupervisorHandle>,
    /// Its rank 0's `/metrics`, cached for a second.
    pub(crate) metrics: crate::upstream::exposition::UpstreamMetrics,
    pub(super) view: RwLock<View>,
    /// Its slots in use, in one word so both counts change together: leases in the low half,
    /// slots held for admitted requests that prefer it (until they lease them) in the high half.
    pub(super) slots: AtomicU64,
    pub(super) routed: AtomicU64,
    /// `sparkgate_group_requests_total{group}`, looked up once: a lease is on every request's path.
    pub(super) requests: metrics::Counter,
    /// An operator drains it before restarting it alone: no new leases.
    pub(super) drained: AtomicBool,
    /// Slots of generations cut before vLLM's answer ended, kept until vLLM has let go of them.
    pub(super) fence: Mutex<Vec<Fenced>>,
    /// One permit: a request lost under twice (`quarantine`) runs with no other such suspect
    /// beside it, so a third loss names one request.
    pub(super) probation: Arc<tokio::sync::Semaphore>,
    /// Suspects' leases (`quarantine`): in flight now, and ever given.
    pub(super) suspects_in_flight: AtomicU64,
    pub(super) suspects_routed: AtomicU64,
    /// Its supervisor's last memory headroom (GiB above MEM_GUARD_GIB on its tightest node).
    pub(super) headroom_gib: Mutex<Option<f64>>,
    /// The model it serves (MODELS: one group per model; else every group the one model).
    pub(crate) model: crate::api::models::ModelId,
}

impl Group {
    /// A group; one without a supervisor (gateway-only mode) is always open to leases — its
    /// health is probed into the gateway's state instead.
    pub(crate) fn new(
        name: &str,
        upstream: Upstream,
        supervisor: Option<SupervisorHandle>,
        mode: SpecMethod,
        capacity: u32,
    ) -> Group {
        let state = match supervisor {
            Some(_) => UpstreamState::Starting,
            None => UpstreamState::Ready,
        };
        Group {
            name: name.to_owned(),
            upstream,
            supervisor,
            metrics: Default::default(),
            view: RwLock::new(View { state, mode, capacity }),
            slots: AtomicU64::new(0),
            routed: AtomicU64::new(0),
            requests: metrics::counter!(crate::observe::GROUP_REQUESTS, "group" => name.to_owned()),
            drained: AtomicBool::new(false),
            probation: Arc::new(tokio::sync::Semaphore::new(1)),
            suspects_in_flight: AtomicU64::new(0),
            suspects_routed: AtomicU64::new(0),
            fence: Mutex::new(Vec::new()),
            headroom_gib: Mutex::new(None),
            model: crate::api::models::ModelId::default(),
        }
    }

    pub(super) fn view(&self) -> View {
        self.view.read().expect("group view").clone()
    }

    /// The speculation mode the group runs.
    pub(crate) fn mode(&self) -> SpecMethod {
        self.view().mode
    }

    pub(crate) fn state(&self) -> UpstreamState {
        self.view().state
    }

    /// Serving and not drained: it takes new requests up to its capacity.
    pub(super) fn open(&self) -> bool {
        self.open_in(&self.view.read().expect("group view"))
    }

    pub(super) fn open_in(&self, view: &View) -> bool {
        !self.drained.load(Ordering::Relaxed) && view.state == UpstreamState::Ready
    }

    /// Its capacity while open, else 0.
    pub(super) fn open_capacity(&self) -> u32 {
        let view = self.view.read().expect("group view");
        if self.open_in(&view) {
            view.capacity
        } else {
            0
        }
    }

    pub(crate) fn in_use(&self) -> u32 {
        leases(self.slots.load(Ordering::Relaxed))
    }

    /// The epoch its supervisor serves now (none without a supervisor).
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.supervisor.as_ref().map(|s| s.status().epoch)
    }

    pub(crate) fn set_drained(&self, drained: bool) {
        self.drained.store(drained, Ordering::Relaxed);
    }

    /// Adds `step` to its slots if `need` slots are free (leased and held slots both count as
    /// taken).
    pub(super) fn take_slot(&self, step: u64, need: u32) -> bool {
        let capacity = self.open_capacity();
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (u64::from(leases(s)) + u64::from(held(s)) + u64::from(need) <= u64::from(capacity)).then_some(s + step)
            })
            .is_ok()
    }

    /// Takes `seqs` of its slots (one per sequence), unless it is closed or lacks the room.
    pub(super) fn try_lease(self: &Arc<Self>, seqs: u32) -> Option<Lease> {
        self.take_slot(LEASE * u64::from(seqs), seqs).then(|| self.leased(seqs))
    }

    /// Turns the slot `reservation` holds for this request into its lease of `seqs` slots,
    /// while the group is open and has room for the rest (in one step: the slot never looks free
    /// in between).
    pub(super) fn take_held(self: &Arc<Self>, reservation: Reservation, seqs: u32) -> Option<Lease> {
        let capacity = self.open_capacity();
        let step = LEASE * u64::from(seqs);
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let after = u64::from(leases(s)) + u64::from(held(s)) - 1 + u64::from(seqs);
                (capacity > 0 && after <= u64::from(capacity)).then(|| s - HELD + step)
            })
            .ok()?;
        reservation.settle();
        Some(self.leased(seqs))
    }

    pub(super) fn leased(self: &Arc<Self>, seqs: u32) -> Lease {
        self.routed.fetch_add(1, Ordering::Relaxed);
        self.requests.increment(1);
        Lease {
            group: self.clone(),
            seqs,
            probation: None,
            suspect: false,
        }
    }

    /// The supervisor is (re)starting the group: the one answer to "is it restarting", read
    /// from the supervisor's status directly, which changes before the ranks go down, so no
    /// request races the gateway's mirror of it. Without a supervisor: never.
    pub(crate) fn restarting(&self) -> bool {
        self.supervisor.as_ref().is_some_and(|s| {
            matches!(
                s.status().state,
                GroupState::Starting { .. } | GroupState::Restarting { .. } | GroupState::Backoff { .. }
            )
        })
    }

    /// Waits (at most a second) until the group is no longer the serving group of `epoch` —
    /// its supervisor noticed its loss — so a retry is not sent into the same dead rank; how it
    /// was lost, if it was. Without a supervisor nothing judges a loss: never.
    pub(crate) async fn lost_since(&self, epoch: Option<u64>) -> Option<Lost> {
        let sup = self.supervisor.as_ref()?;
        let mut status = sup.subscribe();
        let changed = status.wait_for(|s| !(s.is_serving() && Some(s.epoch) == epoch));
        let lost = match tokio::time::timeout(Duration::from_secs(1), changed).await {
            Ok(Ok(seen)) => Some(Lost::of(&seen)),
            _ => None,
        };
        lost
    }

    /// Suspects' leases in flight now, and given ever.
    pub(crate) fn suspects(&self) -> (u64, u64) {
        (
            self.suspects_in_flight.load(Ordering::Acquire),
            self.suspects_routed.load(Ordering::Acquire),
        )
    }

    /// Waits until no suspect runs on it (`Lease::on_probation`).
    pub(crate) async fn probation_over(&self) {
        let _ = self.probation.acquire().await;
    }

    /// Leases it has given, ever: a change means another request was sent to it.
    pub(crate) fn routed(&self) -> u64 {
        self.routed.load(Ordering::Relaxed)
    }

    /// Its MAX_NUM_SEQS as last seen (open or not).
    pub(crate) fn capacity(&self) -> u32 {
        self.view.read().expect("group view").capacity
    }

    /// Free slots as a share of its capacity (0 when closed).
    pub(super) fn room(&self) -> f64 {
        let s = self.slots.load(Ordering::Acquire);
        match self.open_capacity() {
            0 => 0.0,
            capacity => f64::from(capacity.saturating_sub(leases(s) + held(s))) / f64::from(capacity),
        }
    }
}

impl Group {
    pub(super) fn full(&self) -> bool {
        self.open_capacity() > 0 && !self.has_room()
    }

    pub(super) fn has_room(&self) -> bool {
        let s = self.slots.load(Ordering::Acquire);
        leases(s) + held(s) < self.open_capacity()
    }

    /// Open with nothing running and nothing held.
    pub(super) fn idle(&self) -> bool {
        self.open() && self.slots.load(Ordering::Acquire) == 0
    }
}

/// One lease, and one held slot, in a group's `slots`.
pub(super) const LEASE: u64 = 1;
pub(super) const HELD: u64 = 1 << 32;

pub(super) fn leases(slots: u64) -> u32 {
    (slots & 0xffff_ffff) as u32
}

pub(super) fn held(slots: u64) -> u32 {
    (slots >> 32) as u32
}

/// A request's hold on its slots of a group (one per sequence), released when dropped (with
/// its answer).
#[derive(Debug)]
pub(crate) struct Lease {
    pub(super) group: Arc<Group>,
    pub(super) seqs: u32,
    /// The group's probation, held by a suspect for as long as its lease.
    pub(super) probation: Option<tokio::sync::OwnedSemaphorePermit>,
    /// It is a suspect's (counted in the group's `suspects`).
    pub(super) suspect: bool,
}

impl Lease {
    pub(crate) fn group(&self) -> &Group {
        &self.group
    }

    /// Marks it a suspect's lease, counted while it lasts.
    pub(crate) fn mark_suspect(&mut self) {
        if !std::mem::replace(&mut self.suspect, true) {
            self.group.suspects_routed.fetch_add(1, Ordering::AcqRel);
            self.group.suspects_in_flight.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Puts a suspect on probation on its group: false while another suspect runs there.
    pub(crate) fn on_probation(&mut self) -> bool {
        match self.group.probation.clone().try_acquire_owned() {
            Ok(permit) => {
                self.probation = Some(permit);
                true
            }
            Err(_) => false,
        }
    }

    /// The group, to consult after the lease is given back (a retry's verdict).
    pub(crate) fn shared(&self) -> Arc<Group> {
        self.group.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.suspect {
            self.group.suspects_in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.group
            .slots
            .fetch_sub(LEASE * u64::from(self.seqs), Ordering::AcqRel);
    }
}

/// A cut generation's slots and what holds them (its lease and admission permit), kept by the
/// abort fence (`fence.rs`).
pub(crate) struct Fenced {
    pub(super) seqs: u32,
    pub(super) since: Instant,
    pub(super) until: Instant,
    pub(super) _held: Box<dyn Send>,
}

impl std::fmt::Debug for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fenced")
            .field("seqs", &self.seqs)
            .finish_non_exhaustive()
    }
}
