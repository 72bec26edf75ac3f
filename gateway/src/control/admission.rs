//! Admission = MAX_NUM_SEQS: a generation holds `n` permits of the current capacity until its
//! response body ends. Waiters queue with a deadline, in the order `fairq` gives them (a
//! weighted fair queue over clients, or FIFO); the queue is bounded in entries and
//! in the bytes of the bodies it holds (so the gateway's memory is bounded by its limits, not its
//! clients); capacity can change at run time and admission can pause (ranks restarting) —
//! waiters are then held, not failed, until their deadline. A waiter may prefer one group (its
//! conversation's prefix is cached there): while that group is full it lets a free slot go to
//! the waiters behind it, for its preference's wait counted from the first slot it let go —
//! not from its arrival, so a long queue does not use the wait up (delay scheduling). A waiter
//! whose prompt's prefill would take a node under the memory line (`memory`) is passed over the
//! same way until the memory is back; held past `MEMORY_PATIENCE`, it holds the queue for itself
//! if the memory of the prefills now running would let it in (so a stream of short prompts
//! cannot starve a long one). Long requests leave the interactive reserve's slots free while
//! other clients are active (`reserve`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::oneshot;

use crate::api::error::GatewayError;
use crate::api::models::ModelId;
use crate::control::fairq::{Client, FairQueue};
use crate::control::memory::MemoryGuard;
pub(crate) use crate::control::prefer::{Home, Preference, Reservation};

#[path = "admission_queue.rs"]
mod queue;
pub(crate) use queue::ModelWaiting;
use queue::{Arrival, Slot, State};

const GIB: f64 = (1u64 << 30) as f64;

/// How long a waiter held for memory lets others by before it holds the queue for itself.
pub(super) const MEMORY_PATIENCE: Duration = Duration::from_secs(10);

/// A point-in-time view for `/ready`, `/admin/status` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSnapshot {
    pub capacity: u32,
    pub in_use: u32,
    pub queued: usize,
    pub paused: bool,
}

/// How much may wait: entries, body bytes, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub depth: usize,
    pub bytes: usize,
    pub timeout: Duration,
}

/// The admission controller; share it behind an `Arc`.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
    limits: QueueLimits,
}

/// `n` slots held, and the memory of its prompt's prefill until that ends; released on drop (the
/// response body's end or a client disconnect).
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    n: u32,
    reservation: Option<Reservation>,
    need: u64,
    /// Who it is for (`Client::id`) and whether it is long (the interactive reserve).
    who: (u64, bool),
}

impl Permit {
    /// The slot of its preferred group held for it since its grant, to lease.
    pub(crate) fn take_reservation(&mut self) -> Option<Reservation> {
        self.reservation.take()
    }

    /// Whether it still holds its prompt's prefill's memory.
    pub(crate) fn prefilling(&self) -> bool {
        self.need > 0
    }

    /// Its prompt's prefill is over (the first token came): its memory goes back to the guard,
    /// its slots stay held.
    pub(crate) fn prefilled(&mut self) {
        let need = std::mem::take(&mut self.need);
        if need > 0 {
            self.admission
                .state
                .lock()
                .expect("admission lock")
                .release((0, need), (0, false));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The held slot first: the release's dispatch then sees the group's slot free.
        drop(self.reservation.take());
        self.admission
            .state
            .lock()
            .expect("admission lock")
            .release((self.n, self.need), self.who);
    }
}

/// Removes a queued waiter whose request went away, or returns a grant it never collected.
struct Queued<'a> {
    admission: &'a Admission,
    id: u64,
    armed: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut s = self.admission.state.lock().expect("admission lock");
        if let Some(mut w) = s.waiters.remove(&self.id) {
            // The held slot first: the dispatch then sees the group's slot free.
            drop(w.reservation.take());
            match w.slot {
                Slot::Waiting | Slot::Refused(_) => {
                    s.order.remove(w.place);
                    s.queued_bytes -= w.bytes;
                }
                Slot::Granted => s.release((w.n, w.need), (w.client, w.long)),
            }
        }
    }
}

/// Why admission holds requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Hold {
    /// The rank group is not serving (starting, restarting, stalled, stopped, failed).
    Group = 1,
    /// An operator's (or the policy's) drain before a restart.
    Drain = 2,
}

/// How a waiter joins the queue.
#[derive(Debug, Clone, Copy)]
pub(super) enum Entry<'a> {
    /// A new request: its client's place in the queue's order.
    New(&'a Client),
    /// Admitted once, back because its group went down: first, uncharged.
    Requeued,
}

impl Entry<'_> {
    /// Who it is for (`Client::id`) and whether it is long (the interactive reserve); a requeued
    /// request is nobody's and never long.
    pub(super) fn who(self) -> (u64, bool) {
        match self {
            Entry::New(c) => (c.id(), c.long),
            Entry::Requeued => (0, false),
        }
    }
}

impl Admission {
    pub fn new(capacity: u32, limits: QueueLimits) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                capacity,
                in_use: 0,
                holds: 0,
                closed: false,
                order: FairQueue::default(),
                waiters: HashMap::new(),
                next_id: 0,
                queued_bytes: 0,
                memory: MemoryGuard::default(),
                loaded: ModelId::default().bit(),
                loaded_since: {
                    let mut since = [None; crate::api::models::MAX_MODELS];
                    since[0] = Some(Instant::now());
                    since
                },
                reserve: crate::control::reserve::Reserve::default(),
            }),
            limits,
        })
    }

    /// Guards memory: a prompt's prefill takes `per_token` bytes per prompt token (0: no guard).
    pub fn guard_memory(&self, per_token: u64) {
        self.state.lock().expect("admission lock").memory = MemoryGuard::new(per_token);
    }

    /// Holds `rule.slots` back from long requests while others are active (INTERACTIVE_RESERVE;
    /// 0: off), their activity on the coarse clock.
    pub(crate) fn reserve_for_interactive(&self, rule: crate::control::reserve::Rule) {
        let coarse = crate::control::reserve::Clock::Coarse;
        self.state.lock().expect("admission lock").reserve.set(rule, coarse);
    }

    /// [`reserve_for_interactive`](Self::reserve_for_interactive) on the runtime's clock (tests
    /// in virtual time).
    #[cfg(test)]
    pub(crate) fn reserve_on_runtime_clock(&self, rule: crate::control::reserve::Rule) {
        let clock = crate::control::reserve::Clock::Runtime;
        self.state.lock().expect("admission lock").reserve.set(rule, clock);
    }

    /// A new reading of the open groups' memory: bytes above the line on their tightest node
    /// (`None`: no reading). Waiters held for memory are looked at again.
    pub fn observe_memory(&self, headroom: Option<i64>) {
        let mut s = self.state.lock().expect("admission lock");
        s.memory.observe(headroom);
        s.dispatch();
    }

    /// Waits for `n` slots, in `client`'s place in the queue, with a body of `bytes` held
    /// meanwhile. Errors: `n` above capacity (400), queue full in entries or bytes (429),
    /// deadline passed (503). Dropping the future leaves the queue at once.
    pub async fn acquire(self: &Arc<Self>, n: u32, bytes: usize, client: &Client) -> Result<Permit, GatewayError> {
        self.enter((n, bytes, ModelId::default()), Entry::New(client), None)
            .await
    }

    /// [`acquire`](Self::acquire) for a request that prefers a group: while that group is full
    /// and its preference lasts it waits, letting others take a slot elsewhere.
    /// It waits for `model` too: while that model is not loaded, others go ahead.
    pub(crate) async fn acquire_for(
        self: &Arc<Self>,
        (n, bytes, model): (u32, usize, ModelId),
        client: &Client,
        prefer: Option<Preference>,
    ) -> Result<Permit, GatewayError> {
        self.enter((n, bytes, model), Entry::New(client), prefer).await
    }

    /// Charges `client` `tokens` more (or fewer) than it was charged at admission
    /// (FAIR_CHARGE=tokens: its output as it streams, then the real usage).
    pub(crate) fn charge(&self, client: &Client, tokens: i64) {
        self.state.lock().expect("admission lock").order.charge(client, tokens);
    }

    /// A slot granted at once, or none: nobody waits and one is free, and so is the memory of
    /// a prompt carried by `bytes` (a background task's request, which never takes a place in
    /// the queue).
    pub(crate) fn try_now(self: &Arc<Self>, n: u32, bytes: usize, model: ModelId) -> Option<Permit> {
        let mut state = self.state.lock().expect("admission lock");
        let need = state.memory.need(bytes);
        if !state.free_now(n, need, model) {
            return None;
        }
        state.in_use += n;
        state.memory.take(need);
        drop(state);
        Some(Permit {
            admission: self.clone(),
            n,
            reservation: None,
            need,
            who: (0, false),
        })
    }

    /// A request that was admitted but never reached a rank (its group went down) waits again
    /// at the head of the queue: it was in line before everyone now queued, and it is never
    /// refused for a full queue.
    pub async fn requeue(self: &Arc<Self>, n: u32, bytes: usize) -> Result<Permit, GatewayError> {
        self.requeue_for(n, bytes, ModelId::default()).await
    }

    /// [`requeue`](Self::requeue) for a request of `model` (a stream cut by a swap waits for
    /// its model to be loaded again).
    pub(crate) async fn requeue_for(
        self: &Arc<Self>,
        n: u32,
        bytes: usize,
        model: ModelId,
    ) -> Result<Permit, GatewayError> {
        self.enter((n, bytes, model), Entry::Requeued, None).await
    }

    async fn enter(
        self: &Arc<Self>,
        (n, bytes, model): (u32, usize, ModelId),
        entry: Entry<'_>,
        prefer: Option<Preference>,
    ) -> Result<Permit, GatewayError> {
        let who = entry.who();
        let (id, mut rx) =
            match self
                .state
                .lock()
                .expect("admission lock")
                .arrive((n, bytes, model), entry, &prefer, &self.limits)?
            {
                Arrival::Granted(reservation, need) => {
                    return Ok(Permit {
                        admission: self.clone(),
                        n,
                        reservation,
                        need,
                        who,
                    });
                }
                Arrival::Queued(id, rx) => (id, rx),
            };
        // Only a queued request reads the clock (for its deadline's message).
        let started = Instant::now();
        let mut queued = Queued {
            admission: self,
            id,
            armed: true,
        };
        self.wait_within_deadline(id, &mut rx, prefer.map(|p| p.wait), started)
            .await;
        let mut s = self.state.lock().expect("admission lock");
        if let Some(Slot::Refused(why)) = s.waiters.get(&id).map(|w| &w.slot) {
            let (model, reason) = (why.0.clone(), why.1.clone());
            drop(s);
            // The guard takes it out of the queue.
            drop(queued);
            return Err(GatewayError::SwapFailed { model, reason });
        }
        let granted = s.waiters.get(&id).is_some_and(|w| w.slot == Slot::Granted);
        if let Some(w) = granted.then(|| s.waiters.remove(&id)).flatten() {
            queued.armed = false;
            return Ok(Permit {
                admission: self.clone(),
                n,
                reservation: w.reservation,
                need: w.need,
                who,
            });
        }
        let closed = s.closed;
        let memory = s.waiters.get(&id).and_then(|w| w.memory_held).map(|(_, short)| short);
        drop(s);
        // Still waiting: the deadline passed, or the gateway is shutting down. The guard
        // removes it from the queue.
        drop(queued);
        if closed {
            return Err(GatewayError::ShuttingDown);
        }
        let waited = started.elapsed();
        Err(match memory {
            Some(short) => GatewayError::MemoryHeld {
                waited,
                need_gib: short.need as f64 / GIB,
                room_gib: short.room as f64 / GIB,
            },
            None => GatewayError::QueueTimeout { waited },
        })
    }

    /// Waits for waiter `id`'s grant until its QUEUE_TIMEOUT. Past the deadline, a waiter whose
    /// model was loaded since (or is not loaded yet: a swap is its wait) waits on; the queue's
    /// own timeout counts only its model's time.
    async fn wait_within_deadline(
        &self,
        id: u64,
        rx: &mut oneshot::Receiver<()>,
        wait: Option<Duration>,
        started: Instant,
    ) {
        let mut deadline = started + self.limits.timeout;
        while tokio::time::timeout_at(deadline, self.wait(id, rx, wait))
            .await
            .is_err()
        {
            let s = self.state.lock().expect("admission lock");
            match s.deadline(id, self.limits.timeout) {
                Some(d) if d <= Instant::now() => break,
                Some(d) => deadline = d,
                None => deadline = Instant::now() + self.limits.timeout,
            }
        }
    }

    /// Waits for waiter `id`'s grant. A long request the interactive reserve holds back looks
    /// again when the reserve could let it in without a release (its LONG_MAX_WAIT_S, or nobody
    /// else active any more). One that prefers a group and let a slot go looks again
    /// when its `wait` runs out and dispatches the queue, as no release may come to do it (it now
    /// takes any group's slot); until it has let one go it looks every `wait`.
    async fn wait(&self, id: u64, rx: &mut oneshot::Receiver<()>, wait: Option<Duration>) {
        loop {
            let recheck = self.state.lock().expect("admission lock").recheck_long(id);
            let Some(at) = recheck else { break };
            tokio::select! {
                _ = &mut *rx => return,
                () = tokio::time::sleep_until(at) => self.state.lock().expect("admission lock").dispatch(),
            }
        }
        let Some(wait) = wait else {
            let _ = rx.await;
            return;
        };
        loop {
            let passed_at = |s: &State| s.waiters.get(&id).and_then(|w| w.passed_at);
            let since = passed_at(&self.state.lock().expect("admission lock"));
            let next = since.unwrap_or_else(Instant::now) + wait;
            tokio::select! {
                _ = &mut *rx => return,
                () = tokio::time::sleep_until(next) => {}
            }
            let ran_out = {
                let mut s = self.state.lock().expect("admission lock");
                let ran_out = passed_at(&s).is_some_and(|t| t + wait <= Instant::now());
                if ran_out {
                    s.dispatch();
                }
                ran_out
            };
            if ran_out {
                let _ = rx.await;
                return;
            }
        }
    }

    /// Changes the capacity (a mode switch); running requests keep their permits.
    pub fn set_capacity(&self, capacity: u32) {
        let mut s = self.state.lock().expect("admission lock");
        s.capacity = capacity;
        s.dispatch();
    }

    /// The gateway is shutting down: every queued request is answered at once (their waits end
    /// with `ShuttingDown`), and so is every later one.
    pub fn close(&self) {
        let mut s = self.state.lock().expect("admission lock");
        s.closed = true;
        for w in s.waiters.values_mut() {
            if w.slot == Slot::Waiting {
                w.wake = None;
            }
        }
    }

    /// Holds every new and queued request for `why` until `resume(why)`; each reason is lifted
    /// on its own, so a group that turns ready again does not end an operator's drain.
    pub fn pause(&self, why: Hold) {
        self.state.lock().expect("admission lock").holds |= why as u8;
    }

    pub fn resume(&self, why: Hold) {
        let mut s = self.state.lock().expect("admission lock");
        s.holds &= !(why as u8);
        s.dispatch();
    }

    /// Loads the models of `mask` (`ModelId::bit`s): their waiters may be granted; the others
    /// wait. A swap loads none while it runs.
    pub(crate) fn load(&self, mask: u8) {
        self.state.lock().expect("admission lock").load(mask);
    }

    /// Answers every request waiting for `model` 503 with `reason` (its swap failed); how many.
    pub(crate) fn refuse(&self, model: ModelId, served: &str, reason: &str) -> usize {
        self.state.lock().expect("admission lock").refuse(model, served, reason)
    }

    /// The requests waiting for each model.
    pub(crate) fn waiting(&self) -> [ModelWaiting; crate::api::models::MAX_MODELS] {
        self.state.lock().expect("admission lock").waiting()
    }

    pub fn snapshot(&self) -> AdmissionSnapshot {
        let s = self.state.lock().expect("admission lock");
        AdmissionSnapshot {
            capacity: s.capacity,
            in_use: s.in_use,
            queued: s.order.len(),
            paused: s.holds != 0,
        }
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "admission_reserve_tests.rs"]
mod reserve_tests;
