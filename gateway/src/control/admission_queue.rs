//! Admission's queue: the waiters, the order they are granted in (`dispatch`), and where an
//! arriving request stands. A waiter is granted only while its model is loaded (MODELS; the
//! only model always is), passed over otherwise without holding up those behind it; a long
//! request held by the interactive reserve (`reserve`) is passed over the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Entry, QueueLimits, MEMORY_PATIENCE};
use crate::api::error::GatewayError;
use crate::api::models::{ModelId, MAX_MODELS};
use crate::control::fairq::{FairQueue, Place};
use crate::control::memory::{MemoryGuard, Short};
use crate::control::prefer::{reserve, Preference, Reservation};
use crate::control::reserve::Reserve;

#[derive(Debug, PartialEq)]
pub(super) enum Slot {
    Waiting,
    Granted,
    /// Its model (served name) could not be loaded (MODELS): the waiter is answered with the
    /// reason.
    Refused(Arc<(String, String)>),
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) n: u32,
    pub(super) bytes: usize,
    pub(super) place: Place,
    pub(super) slot: Slot,
    pub(super) wake: Option<oneshot::Sender<()>>,
    pub(super) prefer: Option<Preference>,
    /// The model it is for: granted only while that model is loaded.
    pub(super) model: ModelId,
    /// When it joined the queue.
    pub(super) arrived: Instant,
    /// When it first let a free slot go for its preferred group.
    pub(super) passed_at: Option<Instant>,
    /// The slot of its preferred group held for it since its grant.
    pub(super) reservation: Option<Reservation>,
    /// Its prompt's prefill's transient memory (bytes).
    pub(super) need: u64,
    /// When the memory guard first held it, and by how much it fell short the last time.
    pub(super) memory_held: Option<(Instant, Short)>,
    /// Who it is for (`Client::id`), and whether it is long (the interactive reserve).
    pub(super) client: u64,
    pub(super) long: bool,
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
pub(super) struct State {
    pub(super) capacity: u32,
    pub(super) in_use: u32,
    /// Why admission is held (`Hold` bits); nobody is admitted while any is set.
    pub(super) holds: u8,
    /// The gateway is shutting down: nobody is admitted again.
    pub(super) closed: bool,
    pub(super) order: FairQueue,
    pub(super) waiters: HashMap<u64, Waiter>,
    pub(super) next_id: u64,
    /// Body bytes of the requests still waiting.
    pub(super) queued_bytes: usize,
    pub(super) memory: MemoryGuard,
    /// The models whose waiters may be granted (`ModelId::bit`s): the one loaded, none while a
    /// swap runs; the only model, always, without MODELS.
    pub(super) loaded: u8,
    /// Since when each loaded model is (a waiter's QUEUE_TIMEOUT runs from then: the wait for
    /// a swap is not the queue's).
    pub(super) loaded_since: [Option<Instant>; MAX_MODELS],
    pub(super) reserve: Reserve,
}

impl State {
    /// Grants waiters in the queue's order while they fit (a large head blocks: nobody
    /// overtakes it); a waiter holding out for its full preferred group is passed over.
    pub(super) fn dispatch(&mut self) {
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
            // Its model is not loaded: it waits for the swap, and does not block those behind.
            if self.loaded & w.model.bit() == 0 {
                passed = Some(place);
                continue;
            }
            if self.in_use + w.n > self.capacity {
                break;
            }
            if w.long
                && !self.reserve.admits(
                    (w.client, w.n),
                    self.capacity,
                    w.arrived,
                    *now.get_or_insert_with(Instant::now),
                )
            {
                passed = Some(place);
                continue;
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
            if w.long {
                self.reserve.take(w.n);
            }
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
pub(super) enum Arrival {
    /// Admitted at once: nobody waits, it fits (in slots and memory), and the group it prefers
    /// (if any) is not full (its slot there is held).
    Granted(Option<Reservation>, u64),
    /// In the queue under this id; the receiver hears its grant.
    Queued(u64, oneshot::Receiver<()>),
}

impl State {
    /// Admits an arriving request at once, or queues it. Errors: `n` above capacity (400),
    /// shutting down (503), queue full in entries or bytes (429; never for a requeue).
    pub(super) fn arrive(
        &mut self,
        (n, bytes, model): (u32, usize, ModelId),
        entry: Entry<'_>,
        prefer: &Option<Preference>,
        limits: &QueueLimits,
    ) -> Result<Arrival, GatewayError> {
        // A model not loaded has its own capacity, checked before the queue (`prepare`).
        if n > self.capacity && self.loaded & model.bit() != 0 {
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
        let (client, long) = entry.who();
        let mut now = None;
        let reserved = self.held_back((client, n, long), entry, &mut now);
        if self.free_now(n, need, model) && !full && !reserved {
            // Nobody waits: there is no order to take a place in.
            self.in_use += n;
            self.memory.take(need);
            if long {
                self.reserve.take(n);
            }
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
            model,
            arrived: now.unwrap_or_else(Instant::now),
            passed_at: None,
            reservation: None,
            need,
            memory_held: None,
            client,
            long,
        };
        self.waiters.insert(id, waiter);
        self.order.push(place, id);
        // A slot may be free while the waiters before this one hold out for their groups.
        self.dispatch();
        Ok(Arrival::Queued(id, rx))
    }

    /// Whether a request could be granted at once: not held, its model loaded, nobody waits,
    /// its sequences fit and so does its prefill's memory.
    pub(super) fn free_now(&self, n: u32, need: u64, model: ModelId) -> bool {
        self.holds == 0
            && !self.closed
            && self.loaded & model.bit() != 0
            && self.order.is_empty()
            && self.in_use + n <= self.capacity
            && self.memory.fits(need).is_ok()
    }

    /// The interactive reserve at an arrival: told of a new request that is not long (its coarse
    /// clock), or asked whether a long one is held back (the clock read).
    fn held_back(&mut self, (client, n, long): (u64, u32, bool), entry: Entry<'_>, now: &mut Option<Instant>) -> bool {
        if !self.reserve.on() {
            return false;
        }
        if long {
            let t = *now.get_or_insert_with(Instant::now);
            return !self.reserve.admits((client, n), self.capacity, t, t);
        }
        if matches!(entry, Entry::New(_)) {
            self.reserve.saw(client);
        }
        false
    }

    /// `n` slots and `need` bytes given back by a request of `client`, long or not.
    pub(super) fn release(&mut self, (n, need): (u32, u64), (client, long): (u64, bool)) {
        self.in_use -= n;
        self.memory.give(need);
        if long {
            self.reserve.give(n);
        } else if n > 0 {
            // A request that ended keeps its client active for INTERACTIVE_ACTIVE_S.
            self.reserve.saw(client);
        }
        self.dispatch();
    }
}

impl State {
    /// Loads the models of `mask` (a swap's end, or none while it runs); each newly loaded one's
    /// waiters' QUEUE_TIMEOUT runs from now.
    pub(super) fn load(&mut self, mask: u8) {
        let now = Instant::now();
        for (i, since) in self.loaded_since.iter_mut().enumerate() {
            let bit = 1u8 << i;
            *since = match (mask & bit != 0, self.loaded & bit != 0) {
                (true, true) => *since,
                (true, false) => Some(now),
                (false, _) => None,
            };
        }
        self.loaded = mask;
        self.dispatch();
    }

    /// Answers every waiter for `model` with `reason` (its swap failed).
    pub(super) fn refuse(&mut self, model: ModelId, served: &str, reason: &str) -> usize {
        let reason = Arc::new((served.to_owned(), reason.to_owned()));
        let mut refused = 0;
        for w in self.waiters.values_mut() {
            if w.model == model && w.slot == Slot::Waiting {
                w.slot = Slot::Refused(reason.clone());
                if let Some(tx) = w.wake.take() {
                    let _ = tx.send(());
                }
                refused += 1;
            }
        }
        refused
    }

    /// When a waiting long request should be looked at again without a release (`None`: it is
    /// not long, granted, or the reserve is off).
    pub(super) fn recheck_long(&self, id: u64) -> Option<Instant> {
        let w = self.waiters.get(&id).filter(|w| w.long && w.slot == Slot::Waiting)?;
        let now = Instant::now();
        let at = self.reserve.recheck_at(w.client, w.arrived, now)?;
        // Never a busy loop: at least a few milliseconds apart.
        Some(at.max(now + Duration::from_millis(5)))
    }

    /// When waiter `id`'s QUEUE_TIMEOUT ends: `timeout` after its arrival or after its model
    /// was loaded, whichever is later; `None` while its model is not loaded (a swap is its wait,
    /// and the swap's end or failure answers it).
    pub(super) fn deadline(&self, id: u64, timeout: std::time::Duration) -> Option<Instant> {
        let w = self.waiters.get(&id)?;
        let since = self.loaded_since[w.model.index()]?;
        Some(w.arrived.max(since) + timeout)
    }

    /// The waiters for each model: how many, and since when the oldest waits.
    pub(super) fn waiting(&self) -> [ModelWaiting; MAX_MODELS] {
        let mut out = [ModelWaiting::default(); MAX_MODELS];
        for w in self.waiters.values().filter(|w| w.slot == Slot::Waiting) {
            let m = &mut out[w.model.index()];
            m.count += 1;
            m.oldest = Some(m.oldest.map_or(w.arrived, |o| o.min(w.arrived)));
        }
        out
    }
}

/// The requests waiting for one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ModelWaiting {
    pub(crate) count: usize,
    pub(crate) oldest: Option<Instant>,
}
