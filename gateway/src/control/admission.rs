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
//! cannot starve a long one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::oneshot;

use crate::api::error::GatewayError;
use crate::control::fairq::{Client, FairQueue, Place};
use crate::control::memory::{MemoryGuard, Short};
use crate::control::prefer::reserve;
pub(crate) use crate::control::prefer::{Home, Preference, Reservation};

const GIB: f64 = (1u64 << 30) as f64;

/// How long a waiter held for memory lets others by before it holds the queue for itself.
const MEMORY_PATIENCE: Duration = Duration::from_secs(10);

/// A point-in-time view for `/ready`, `/admin/status` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSnapshot {
    pub capacity: u32,
    pub in_use: u32,
    pub queued: usize,
    pub paused: bool,
}

#[derive(Debug, PartialEq)]
enum Slot {
    Waiting,
    Granted,
}

/// How much may wait: entries, body bytes, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub depth: usize,
    pub bytes: usize,
    pub timeout: Duration,
}

#[derive(Debug)]
struct Waiter {
    n: u32,
    bytes: usize,
    place: Place,
    slot: Slot,
    wake: Option<oneshot::Sender<()>>,
    prefer: Option<Preference>,
    /// When it first let a free slot go for its preferred group.
    passed_at: Option<Instant>,
    /// The slot of its preferred group held for it since its grant.
    reservation: Option<Reservation>,
    /// Its prompt's prefill's transient memory (bytes).
    need: u64,
    /// When the memory guard first held it, and by how much it fell short the last time.
    memory_held: Option<(Instant, Short)>,
}

impl Waiter {
    /// Whether it lets a free slot go now: its preferred group is full and its wait, counted
    /// from the first slot it let go, lasts.
    fn defers(&mut self, now: &mut Option<Instant>) -> bool {
        let Some(p) = self.prefer.as_ref().filter(|p| p.home.full()) else {
            return false;
        };
        let now = *now.get_or_insert_with(Instant::now);
        now < *self.passed_at.get_or_insert(now) + p.wait
    }

    /// Held for memory: whether it holds the queue for itself (patience run out, and the
    /// prefills now running would leave it room) rather than let others by.
    fn holds_for_memory(&mut self, short: Short, memory: &MemoryGuard, now: &mut Option<Instant>) -> bool {
        let now = *now.get_or_insert_with(Instant::now);
        let since = match self.memory_held {
            Some((since, _)) => since,
            None => {
                metrics::counter!(crate::observe::MEMORY_HOLDS).increment(1);
                now
            }
        };
        self.memory_held = Some((since, short));
        now >= since + MEMORY_PATIENCE && memory.fits_when_idle(self.need)
    }
}

#[derive(Debug)]
struct State {
    capacity: u32,
    in_use: u32,
    /// Why admission is held (`Hold` bits); nobody is admitted while any is set.
    holds: u8,
    /// The gateway is shutting down: nobody is admitted again.
    closed: bool,
    order: FairQueue,
    waiters: HashMap<u64, Waiter>,
    next_id: u64,
    /// Body bytes of the requests still waiting.
    queued_bytes: usize,
    memory: MemoryGuard,
}

impl State {
    /// Grants waiters in the queue's order while they fit (a large head blocks: nobody
    /// overtakes it); a waiter holding out for its full preferred group is passed over.
    fn dispatch(&mut self) {
        // Nobody queued (most releases): nothing to walk, not even the order's first entry.
        if self.order.is_empty() {
            return;
        }
        // The clock is read only when a waiter has a preference to weigh.
        let mut now = None;
        let mut passed = None;
        while self.holds == 0 && !self.closed {
            let Some((place, id)) = self.order.after(passed) else {
                break;
            };
            let w = self.waiters.get_mut(&id).expect("queued ids have waiters");
            if self.in_use + w.n > self.capacity {
                break;
            }
            if w.defers(&mut now) {
                passed = Some(place);
                continue;
            }
            if let Err(short) = self.memory.fits(w.need) {
                if w.holds_for_memory(short, &self.memory, &mut now) {
                    break;
                }
                passed = Some(place);
                continue;
            }
            if let (Some(_), Some(p)) = (w.passed_at, &w.prefer) {
                use crate::observe::Affinity;
                let outcome = if p.home.has_room() {
                    Affinity::Home
                } else {
                    Affinity::Elsewhere
                };
                metrics::counter!(crate::observe::AFFINITY_WAITS, "outcome" => outcome.label()).increment(1);
            }
            self.order.admit(place);
            self.in_use += w.n;
            self.memory.take(w.need);
            self.queued_bytes -= w.bytes;
            w.slot = Slot::Granted;
            w.reservation = reserve(w.prefer.as_ref());
            if let Some(tx) = w.wake.take() {
                let _ = tx.send(());
            }
        }
    }
}

/// Where an arriving request stands.
enum Arrival {
    /// Admitted at once: nobody waits, it fits (in slots and memory), and the group it prefers
    /// (if any) is not full (its slot there is held).
    Granted(Option<Reservation>, u64),
    /// In the queue under this id; the receiver hears its grant.
    Queued(u64, oneshot::Receiver<()>),
}

impl State {
    /// Admits an arriving request at once, or queues it. Errors: `n` above capacity (400),
    /// shutting down (503), queue full in entries or bytes (429; never for a requeue).
    fn arrive(
        &mut self,
        n: u32,
        bytes: usize,
        entry: Entry<'_>,
        prefer: &Option<Preference>,
        limits: &QueueLimits,
    ) -> Result<Arrival, GatewayError> {
        if n > self.capacity {
            return Err(GatewayError::OverCapacity {
                asked: n,
                capacity: self.capacity,
            });
        }
        if self.closed {
            return Err(GatewayError::ShuttingDown);
        }
        // One whose preferred group is full queues; its wait starts when dispatch lets a slot go.
        let full = prefer.as_ref().is_some_and(|p| p.home.full());
        let need = self.memory.need(bytes);
        if self.free_now(n, need) && !full {
            // Nobody waits: there is no order to take a place in.
            self.in_use += n;
            self.memory.take(need);
            return Ok(Arrival::Granted(reserve(prefer.as_ref()), need));
        }
        let place = match entry {
            Entry::New(client) => {
                if self.order.len() >= limits.depth {
                    return Err(GatewayError::QueueFull { depth: limits.depth });
                }
                if self.queued_bytes + bytes > limits.bytes {
                    return Err(GatewayError::QueueBytesFull { limit: limits.bytes });
                }
                self.order.tag(client, n)
            }
            Entry::Requeued => self.order.back(),
        };
        self.queued_bytes += bytes;
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            n,
            bytes,
            place,
            slot: Slot::Waiting,
            wake: Some(tx),
            prefer: prefer.clone(),
            passed_at: None,
            reservation: None,
            need,
            memory_held: None,
        };
        self.waiters.insert(id, waiter);
        self.order.push(place, id);
        // A slot may be free while the waiters before this one hold out for their groups.
        self.dispatch();
        Ok(Arrival::Queued(id, rx))
    }

    /// Whether a request could be granted at once: not held, nobody waits, its sequences fit
    /// and so does its prefill's memory.
    fn free_now(&self, n: u32, need: u64) -> bool {
        self.holds == 0
            && !self.closed
            && self.order.is_empty()
            && self.in_use + n <= self.capacity
            && self.memory.fits(need).is_ok()
    }

    fn release(&mut self, n: u32, need: u64) {
        self.in_use -= n;
        self.memory.give(need);
        self.dispatch();
    }
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
            self.admission.state.lock().expect("admission lock").release(0, need);
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
            .release(self.n, self.need);
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
                Slot::Waiting => {
                    s.order.remove(w.place);
                    s.queued_bytes -= w.bytes;
                }
                Slot::Granted => s.release(w.n, w.need),
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
enum Entry<'a> {
    /// A new request: its client's place in the queue's order.
    New(&'a Client),
    /// Admitted once, back because its group went down: first, uncharged.
    Requeued,
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
            }),
            limits,
        })
    }

    /// Guards memory: a prompt's prefill takes `per_token` bytes per prompt token (0: no guard).
    pub fn guard_memory(&self, per_token: u64) {
        self.state.lock().expect("admission lock").memory = MemoryGuard::new(per_token);
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
        self.enter(n, bytes, Entry::New(client), None).await
    }

    /// [`acquire`](Self::acquire) for a request that prefers a group: while that group is full
    /// and its preference lasts it waits, letting others take a slot elsewhere.
    pub(crate) async fn acquire_for(
        self: &Arc<Self>,
        n: u32,
        bytes: usize,
        client: &Client,
        prefer: Option<Preference>,
    ) -> Result<Permit, GatewayError> {
        self.enter(n, bytes, Entry::New(client), prefer).await
    }

    /// Charges `client` `tokens` more (or fewer) than it was charged at admission
    /// (FAIR_CHARGE=tokens: its output as it streams, then the real usage).
    pub(crate) fn charge(&self, client: &Client, tokens: i64) {
        self.state.lock().expect("admission lock").order.charge(client, tokens);
    }

    /// A slot granted at once, or none: nobody waits and one is free, and so is the memory of
    /// a prompt carried by `bytes` (a background task's request, which never takes a place in
    /// the queue).
    pub(crate) fn try_now(self: &Arc<Self>, n: u32, bytes: usize) -> Option<Permit> {
        let mut state = self.state.lock().expect("admission lock");
        let need = state.memory.need(bytes);
        if !state.free_now(n, need) {
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
        })
    }

    /// A request that was admitted but never reached a rank (its group went down) waits again
    /// at the head of the queue: it was in line before everyone now queued, and it is never
    /// refused for a full queue.
    pub async fn requeue(self: &Arc<Self>, n: u32, bytes: usize) -> Result<Permit, GatewayError> {
        self.enter(n, bytes, Entry::Requeued, None).await
    }

    async fn enter(
        self: &Arc<Self>,
        n: u32,
        bytes: usize,
        entry: Entry<'_>,
        prefer: Option<Preference>,
    ) -> Result<Permit, GatewayError> {
        let (id, rx) =
            match self
                .state
                .lock()
                .expect("admission lock")
                .arrive(n, bytes, entry, &prefer, &self.limits)?
            {
                Arrival::Granted(reservation, need) => {
                    return Ok(Permit {
                        admission: self.clone(),
                        n,
                        reservation,
                        need,
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
        let wait = prefer.map(|p| p.wait);
        let _ = tokio::time::timeout(self.limits.timeout, self.wait(id, rx, wait)).await;
        let mut s = self.state.lock().expect("admission lock");
        let granted = s.waiters.get(&id).is_some_and(|w| w.slot == Slot::Granted);
        if let Some(w) = granted.then(|| s.waiters.remove(&id)).flatten() {
            queued.armed = false;
            return Ok(Permit {
                admission: self.clone(),
                n,
                reservation: w.reservation,
                need: w.need,
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

    /// Waits for waiter `id`'s grant. One that prefers a group and let a slot go looks again
    /// when its `wait` runs out and dispatches the queue, as no release may come to do it (it now
    /// takes any group's slot); until it has let one go it looks every `wait`.
    async fn wait(&self, id: u64, mut rx: oneshot::Receiver<()>, wait: Option<Duration>) {
        let Some(wait) = wait else {
            let _ = rx.await;
            return;
        };
        loop {
            let passed_at = |s: &State| s.waiters.get(&id).and_then(|w| w.passed_at);
            let since = passed_at(&self.state.lock().expect("admission lock"));
            let next = since.unwrap_or_else(Instant::now) + wait;
            tokio::select! {
                _ = &mut rx => return,
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
