//! Admission = MAX_NUM_SEQS: a generation holds `n` permits of the current capacity until its
//! response body ends. Waiters queue with a deadline, in the order `fairq` gives them (a
//! weighted fair queue over clients, or FIFO); the queue is bounded in entries and
//! in the bytes of the bodies it holds (so the gateway's memory is bounded by its limits, not its
//! clients); capacity can change at run time and admission can pause (ranks restarting) —
//! waiters are then held, not failed, until their deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::GatewayError;
use crate::fairq::{Client, FairQueue, Place};

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
}

impl State {
    /// Grants waiters in the queue's order while they fit (a large head blocks: nobody
    /// overtakes it).
    fn dispatch(&mut self) {
        while self.holds == 0 && !self.closed {
            let Some(id) = self.order.first() else { break };
            let w = self.waiters.get_mut(&id).expect("queued ids have waiters");
            if self.in_use + w.n > self.capacity {
                break;
            }
            self.order.pop_first();
            self.in_use += w.n;
            self.queued_bytes -= w.bytes;
            w.slot = Slot::Granted;
            if let Some(tx) = w.wake.take() {
                let _ = tx.send(());
            }
        }
    }
}

/// The admission controller; share it behind an `Arc`.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
    limits: QueueLimits,
}

/// `n` slots held; released on drop (the response body's end or a client disconnect).
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    n: u32,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(self.n);
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
        if let Some(w) = s.waiters.remove(&self.id) {
            match w.slot {
                Slot::Waiting => {
                    s.order.remove(w.place);
                    s.queued_bytes -= w.bytes;
                }
                Slot::Granted => {
                    s.in_use -= w.n;
                    s.dispatch();
                }
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
            }),
            limits,
        })
    }

    /// Waits for `n` slots, in `client`'s place in the queue, with a body of `bytes` held
    /// meanwhile. Errors: `n` above capacity (400), queue full in entries or bytes (429),
    /// deadline passed (503). Dropping the future leaves the queue at once.
    pub async fn acquire(self: &Arc<Self>, n: u32, bytes: usize, client: &Client) -> Result<Permit, GatewayError> {
        self.enter(n, bytes, Entry::New(client)).await
    }

    /// A request that was admitted but never reached a rank (its group went down) waits again
    /// at the head of the queue: it was in line before everyone now queued, and it is never
    /// refused for a full queue.
    pub async fn requeue(self: &Arc<Self>, n: u32, bytes: usize) -> Result<Permit, GatewayError> {
        self.enter(n, bytes, Entry::Requeued).await
    }

    async fn enter(self: &Arc<Self>, n: u32, bytes: usize, entry: Entry<'_>) -> Result<Permit, GatewayError> {
        let started = Instant::now();
        let (id, rx) = {
            let mut s = self.state.lock().expect("admission lock");
            if n > s.capacity {
                return Err(GatewayError::bad_request(
                    format!(
                        "n={n} needs more sequences than the model runs at once (MAX_NUM_SEQS={})",
                        s.capacity
                    ),
                    "n",
                ));
            }
            if s.closed {
                return Err(GatewayError::ShuttingDown);
            }
            if s.holds == 0 && s.order.is_empty() && s.in_use + n <= s.capacity {
                // Nobody waits: there is no order to take a place in.
                s.in_use += n;
                return Ok(Permit {
                    admission: self.clone(),
                    n,
                });
            }
            let place = match entry {
                Entry::New(client) => {
                    if s.order.len() >= self.limits.depth {
                        return Err(GatewayError::QueueFull {
                            depth: self.limits.depth,
                        });
                    }
                    if s.queued_bytes + bytes > self.limits.bytes {
                        return Err(GatewayError::QueueBytesFull {
                            limit: self.limits.bytes,
                        });
                    }
                    s.order.tag(client, n)
                }
                Entry::Requeued => s.order.back(),
            };
            s.queued_bytes += bytes;
            let id = s.next_id;
            s.next_id += 1;
            let (tx, rx) = oneshot::channel();
            s.waiters.insert(
                id,
                Waiter {
                    n,
                    bytes,
                    place,
                    slot: Slot::Waiting,
                    wake: Some(tx),
                },
            );
            s.order.push(place, id);
            (id, rx)
        };
        let mut queued = Queued {
            admission: self,
            id,
            armed: true,
        };
        let _ = tokio::time::timeout(self.limits.timeout, rx).await;
        let mut s = self.state.lock().expect("admission lock");
        let granted = s.waiters.get(&id).is_some_and(|w| w.slot == Slot::Granted);
        if granted {
            s.waiters.remove(&id);
            queued.armed = false;
            return Ok(Permit {
                admission: self.clone(),
                n,
            });
        }
        let closed = s.closed;
        drop(s);
        // Still waiting: the deadline passed, or the gateway is shutting down. The guard
        // removes it from the queue.
        drop(queued);
        if closed {
            return Err(GatewayError::ShuttingDown);
        }
        Err(GatewayError::QueueTimeout {
            waited: started.elapsed(),
        })
    }

    fn release(&self, n: u32) {
        let mut s = self.state.lock().expect("admission lock");
        s.in_use -= n;
        s.dispatch();
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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The one client of the tests that are not about fairness.
    fn c() -> Client {
        Client::new("t", 1)
    }

    fn limits(depth: usize, timeout_s: u64) -> QueueLimits {
        QueueLimits {
            depth,
            bytes: 1000,
            timeout: Duration::from_secs(timeout_s),
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    #[test]
    fn grants_up_to_capacity_then_queues_fifo() {
        rt().block_on(async {
            let a = Admission::new(2, limits(10, 60));
            let p1 = a.acquire(1, 10, &c()).await.unwrap();
            let _p2 = a.acquire(1, 10, &c()).await.unwrap();
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for i in 0..3 {
                let (a, order) = (a.clone(), order.clone());
                tasks.push(tokio::spawn(async move {
                    let p = a.acquire(1, 10, &c()).await.unwrap();
                    order.lock().unwrap().push(i);
                    p
                }));
                tokio::task::yield_now().await;
            }
            assert_eq!(a.snapshot().queued, 3);
            drop(p1);
            let p3 = tasks.remove(0).await.unwrap();
            assert_eq!(*order.lock().unwrap(), vec![0]);
            drop(p3);
            let _p4 = tasks.remove(0).await.unwrap();
            assert_eq!(*order.lock().unwrap(), vec![0, 1], "first in, first out");
            assert_eq!(a.snapshot().in_use, 2);
        });
    }

    #[test]
    fn full_queue_and_deadline_and_oversized_n() {
        rt().block_on(async {
            let a = Admission::new(1, limits(1, 5));
            let _p = a.acquire(1, 10, &c()).await.unwrap();
            let waiter = tokio::spawn({
                let a = a.clone();
                async move { a.acquire(1, 10, &c()).await }
            });
            tokio::task::yield_now().await;
            assert!(matches!(
                a.acquire(1, 10, &c()).await,
                Err(GatewayError::QueueFull { depth: 1 })
            ));
            let e = waiter.await.unwrap().unwrap_err();
            assert!(matches!(e, GatewayError::QueueTimeout { .. }), "{e}");
            assert_eq!(a.snapshot().queued, 0, "a timed-out waiter leaves the queue");
            assert_eq!(a.acquire(2, 10, &c()).await.unwrap_err().param(), Some("n"));
        });
    }

    #[test]
    fn the_queue_holds_at_most_its_byte_budget() {
        rt().block_on(async {
            let a = Admission::new(1, limits(10, 60));
            let _running = a.acquire(1, 900, &c()).await.unwrap();
            let first = tokio::spawn({
                let a = a.clone();
                async move { a.acquire(1, 600, &c()).await }
            });
            tokio::task::yield_now().await;
            let e = a.acquire(1, 500, &c()).await.unwrap_err();
            assert!(matches!(e, GatewayError::QueueBytesFull { limit: 1000 }), "{e}");
            assert!(e.retry_after().is_some(), "429 with Retry-After");
            first.abort();
            let _ = first.await;
            let second = tokio::spawn({
                let a = a.clone();
                async move { a.acquire(1, 900, &c()).await }
            });
            tokio::task::yield_now().await;
            assert_eq!(a.snapshot().queued, 1, "a departed waiter's bytes are free again");
            second.abort();
        });
    }

    #[test]
    fn a_waiter_that_goes_away_frees_its_place() {
        rt().block_on(async {
            let a = Admission::new(1, limits(10, 60));
            let p = a.acquire(1, 10, &c()).await.unwrap();
            let gone = tokio::spawn({
                let a = a.clone();
                async move { a.acquire(1, 10, &c()).await }
            });
            tokio::task::yield_now().await;
            assert_eq!(a.snapshot().queued, 1);
            gone.abort();
            let _ = gone.await;
            assert_eq!(a.snapshot().queued, 0);
            drop(p);
            assert_eq!(a.snapshot().in_use, 0, "nothing was granted to the departed waiter");
            let _p = a.acquire(1, 10, &c()).await.unwrap();
        });
    }

    #[test]
    fn pause_holds_and_capacity_changes_apply() {
        rt().block_on(async {
            let a = Admission::new(1, limits(10, 600));
            a.pause(Hold::Group);
            a.pause(Hold::Drain);
            a.resume(Hold::Group);
            let granted = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let (a, g) = (a.clone(), granted.clone());
                tasks.push(tokio::spawn(async move {
                    let p = a.acquire(1, 10, &c()).await.unwrap();
                    g.fetch_add(1, Ordering::SeqCst);
                    p
                }));
            }
            tokio::time::sleep(Duration::from_secs(300)).await;
            assert_eq!(granted.load(Ordering::SeqCst), 0, "held while paused, not failed");
            assert_eq!(a.snapshot().queued, 4);
            a.set_capacity(4);
            assert_eq!(a.snapshot().queued, 4, "the drain still holds them");
            a.resume(Hold::Drain);
            for t in tasks {
                let _ = t.await.unwrap();
            }
            assert_eq!(granted.load(Ordering::SeqCst), 4, "all admitted with the new capacity");
        });
    }

    #[test]
    fn a_requeued_request_goes_first_even_into_a_full_queue() {
        rt().block_on(async {
            let a = Admission::new(1, limits(1, 60));
            let running = a.acquire(1, 10, &c()).await.unwrap();
            let order = Arc::new(std::sync::Mutex::new(Vec::new()));
            let waiter = |name: &'static str, requeued: bool| {
                let (a, order) = (a.clone(), order.clone());
                tokio::spawn(async move {
                    let p = if requeued {
                        a.requeue(1, 10).await
                    } else {
                        a.acquire(1, 10, &c()).await
                    };
                    order.lock().unwrap().push(name);
                    drop(p);
                })
            };
            let queued = waiter("queued", false);
            tokio::task::yield_now().await;
            assert!(a.acquire(1, 10, &c()).await.is_err(), "the queue (depth 1) is full");
            let back = waiter("requeued", true);
            tokio::task::yield_now().await;
            assert_eq!(a.snapshot().queued, 2, "a requeue is never refused for a full queue");
            drop(running);
            queued.await.unwrap();
            back.await.unwrap();
            assert_eq!(*order.lock().unwrap(), vec!["requeued", "queued"]);
        });
    }

    #[test]
    fn closing_answers_the_queue_at_once_and_refuses_newcomers() {
        rt().block_on(async {
            let a = Admission::new(1, limits(10, 600));
            let running = a.acquire(1, 10, &c()).await.unwrap();
            let queued = tokio::spawn({
                let a = a.clone();
                async move { a.acquire(1, 10, &c()).await }
            });
            tokio::task::yield_now().await;
            let before = tokio::time::Instant::now();
            a.close();
            let e = queued.await.unwrap().unwrap_err();
            assert!(matches!(e, GatewayError::ShuttingDown), "{e}");
            assert!(
                before.elapsed() < Duration::from_secs(1),
                "at once, not after the queue timeout"
            );
            assert!(e.retry_after().is_some(), "503 with Retry-After");
            assert!(matches!(a.acquire(1, 10, &c()).await, Err(GatewayError::ShuttingDown)));
            assert_eq!(a.snapshot().queued, 0);
            drop(running);
            assert_eq!(
                a.snapshot().in_use,
                0,
                "the running request keeps its slot until it ends"
            );
        });
    }

    #[test]
    fn a_lone_client_is_served_before_another_clients_burst_drains() {
        rt().block_on(async {
            let a = Admission::new(4, limits(100, 600));
            let (burst, lone) = (Client::new("burst", 1), Client::new("lone", 1));
            let served = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            let mut spawn = |who: &'static str, client: Client| {
                let (a, served) = (a.clone(), served.clone());
                tasks.push(tokio::spawn(async move {
                    let p = a.acquire(1, 10, &client).await.unwrap();
                    served.lock().unwrap().push(who);
                    p
                }));
            };
            for _ in 0..16 {
                spawn("burst", burst);
            }
            tokio::task::yield_now().await;
            assert_eq!((a.snapshot().in_use, a.snapshot().queued), (4, 12));
            spawn("lone", lone);
            tokio::task::yield_now().await;
            // The running requests end one at a time; each time the next in the queue's order
            // takes the freed slot (and records itself) before the next one ends.
            let mut held: Vec<Permit> = Vec::new();
            while !tasks.is_empty() || !held.is_empty() {
                let mut i = 0;
                while i < tasks.len() {
                    if tasks[i].is_finished() {
                        held.push(tasks.remove(i).await.unwrap());
                    } else {
                        i += 1;
                    }
                }
                drop(held.pop());
                tokio::task::yield_now().await;
            }
            let order = served.lock().unwrap().clone();
            let lone_at = order
                .iter()
                .position(|w| *w == "lone")
                .expect("the lone client was served");
            assert_eq!(
                lone_at, 5,
                "one burst request after the four running, then the lone one: {order:?}"
            );
            assert_eq!(order.len(), 17);
        });
    }
}
