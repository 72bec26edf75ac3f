//! Admission's tests: capacity, the queue's order and limits, holds, requeues, closing, fairness
//! and waiting for a preferred group.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The only model without MODELS.
const M0: ModelId = ModelId(0);

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

/// A runtime in virtual time (the reserve's tests use it too).
pub(super) fn rt() -> tokio::runtime::Runtime {
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
            tasks.push(sparkgate_task::spawn("test", async move {
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
        let waiter = sparkgate_task::spawn("test", {
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
        let first = sparkgate_task::spawn("test", {
            let a = a.clone();
            async move { a.acquire(1, 600, &c()).await }
        });
        tokio::task::yield_now().await;
        let e = a.acquire(1, 500, &c()).await.unwrap_err();
        assert!(matches!(e, GatewayError::QueueBytesFull { limit: 1000 }), "{e}");
        assert!(e.retry_after().is_some(), "429 with Retry-After");
        first.abort();
        let _ = first.await;
        let second = sparkgate_task::spawn("test", {
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
        let gone = sparkgate_task::spawn("test", {
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
            tasks.push(sparkgate_task::spawn("test", async move {
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
            sparkgate_task::spawn("test", async move {
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
        let queued = sparkgate_task::spawn("test", {
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
            tasks.push(sparkgate_task::spawn("test", async move {
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

/// A group that is full while its flag is set, counting the slots held on it.
#[derive(Debug, Default)]
struct FakeHome(std::sync::atomic::AtomicBool, AtomicUsize);

impl Home for FakeHome {
    fn full(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn has_room(&self) -> bool {
        !self.full()
    }

    fn reserve(&self) -> bool {
        if self.full() {
            return false;
        }
        self.1.fetch_add(1, Ordering::SeqCst);
        true
    }

    fn unreserve(&self) {
        self.1.fetch_sub(1, Ordering::SeqCst);
    }

    fn index(&self) -> usize {
        0
    }
}

fn prefer(home: &Arc<FakeHome>, secs: u64) -> Option<Preference> {
    Some(Preference {
        home: home.clone(),
        wait: Duration::from_secs(secs),
    })
}

#[test]
fn a_waiter_holds_out_for_its_full_group_while_the_free_slot_goes_to_the_next() {
    rt().block_on(async {
        // Two groups of one slot; group a's is taken.
        let a = Admission::new(2, limits(10, 600));
        let home_a = Arc::new(FakeHome::default());
        let running_on_a = a.acquire(1, 10, &c()).await.unwrap();
        home_a.0.store(true, Ordering::SeqCst);
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |who: &'static str, p: Option<Preference>| {
            let (a, order) = (a.clone(), order.clone());
            sparkgate_task::spawn("test", async move {
                let permit = a.acquire_for((1, 10, M0), &c(), p).await.unwrap();
                order.lock().unwrap().push(who);
                permit
            })
        };
        let for_a = spawn("for a", prefer(&home_a, 2));
        tokio::task::yield_now().await;
        assert_eq!(a.snapshot().queued, 1, "a free slot, but not in its group");
        let other = spawn("other", None);
        let _on_b = other.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["other"], "the next waiter took b's slot");
        // Group a's request ends: its lease goes first, then its permit admits the waiter.
        home_a.0.store(false, Ordering::SeqCst);
        drop(running_on_a);
        let mut on_a = for_a.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["other", "for a"]);
        assert_eq!(
            home_a.1.load(Ordering::SeqCst),
            1,
            "a's slot is held for it until it leases"
        );
        drop(on_a.take_reservation());
        assert_eq!(home_a.1.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn a_preference_runs_out_and_then_any_free_slot_is_taken() {
    rt().block_on(async {
        let a = Admission::new(2, limits(10, 600));
        let home = Arc::new(FakeHome::default());
        let _running = a.acquire(1, 10, &c()).await.unwrap();
        home.0.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let _p = a.acquire_for((1, 10, M0), &c(), prefer(&home, 2)).await.unwrap();
        let waited = started.elapsed();
        assert!(
            (Duration::from_secs(2)..Duration::from_secs(3)).contains(&waited),
            "waited its preference out, no longer: {waited:?}"
        );
        // A preferred group with room, or one that is not full, is no reason to wait.
        home.0.store(false, Ordering::SeqCst);
        let a2 = Admission::new(1, limits(10, 600));
        let started = tokio::time::Instant::now();
        let _q = a2.acquire_for((1, 10, M0), &c(), prefer(&home, 60)).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
    });
}

#[test]
fn the_wait_counts_from_the_first_slot_let_go_not_from_arrival() {
    rt().block_on(async {
        // Both groups full; the waiter queues for 5 s with nothing free anywhere.
        let a = Admission::new(2, limits(10, 600));
        let home = Arc::new(FakeHome::default());
        let _on_home = a.acquire(1, 10, &c()).await.unwrap();
        let on_other = a.acquire(1, 10, &c()).await.unwrap();
        home.0.store(true, Ordering::SeqCst);
        let waiter = sparkgate_task::spawn("test", {
            let (a, home) = (a.clone(), home.clone());
            async move { a.acquire_for((1, 10, M0), &c(), prefer(&home, 2)).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The other group's slot frees: the waiter lets it go, for its 2 s.
        let freed = tokio::time::Instant::now();
        drop(on_other);
        tokio::task::yield_now().await;
        assert_eq!(
            a.snapshot().queued,
            1,
            "it lets the slot go although it waited 5 s already"
        );
        let _p = waiter.await.unwrap();
        assert_eq!(
            freed.elapsed(),
            Duration::from_secs(2),
            "then takes it, 2 s after it freed"
        );
    });
}

#[test]
fn a_slot_at_once_is_given_only_when_it_is_free_and_nobody_waits() {
    rt().block_on(async {
        let a = Admission::new(1, limits(10, 60));
        let first = a.try_now(1, 10, M0).expect("a free slot");
        assert!(a.try_now(1, 10, M0).is_none(), "none free");
        let queued = {
            let a = a.clone();
            sparkgate_task::spawn("test", async move { a.acquire(1, 10, &c()).await.unwrap() })
        };
        tokio::task::yield_now().await;
        assert_eq!(a.snapshot().queued, 1);
        drop(first);
        let waiter = queued.await.unwrap();
        assert!(a.try_now(1, 10, M0).is_none(), "the waiter had it first");
        drop(waiter);
        assert!(a.try_now(1, 10, M0).is_some());
        assert_eq!(a.snapshot().queued, 0, "a try never queues");
    });
}

const MIB: i64 = 1 << 20;

/// A guarded admission: a body byte is a quarter of a prompt token, each taking 4 MiB to prefill
/// (a 400-byte body needs 400 MiB).
fn guarded(capacity: u32, headroom_mib: i64) -> Arc<Admission> {
    let a = Admission::new(capacity, limits(10, 60));
    a.guard_memory(4 << 20);
    a.observe_memory(Some(headroom_mib * MIB));
    a
}

fn spawn_acquire(a: &Arc<Admission>, bytes: usize) -> tokio::task::JoinHandle<Result<Permit, GatewayError>> {
    let a = a.clone();
    sparkgate_task::spawn("test", async move { a.acquire(1, bytes, &c()).await })
}

#[test]
fn a_long_prompt_waits_for_memory_while_shorter_ones_go_ahead() {
    rt().block_on(async {
        let a = guarded(4, 300);
        let long = spawn_acquire(&a, 800);
        tokio::task::yield_now().await;
        assert_eq!(a.snapshot().queued, 1, "800 MiB does not fit in 300");
        // Behind it in the queue, a short prompt is granted at once.
        let short = a.acquire(1, 40, &c()).await.expect("40 MiB fits");
        assert_eq!((a.snapshot().queued, a.snapshot().in_use), (1, 1));
        // The memory comes back: the long prompt goes.
        a.observe_memory(Some(1000 * MIB));
        let long = long.await.unwrap().expect("granted once the memory is back");
        assert_eq!(a.snapshot().in_use, 2);
        drop((short, long));
    });
}

#[test]
fn a_prefill_holds_its_memory_until_its_first_token_and_under_the_line_nothing_starts() {
    rt().block_on(async {
        let a = guarded(4, 1000);
        let mut first = a.acquire(1, 600, &c()).await.unwrap();
        // 600 MiB outstanding: a second 600 MiB prompt waits though the sample still shows 1000.
        let second = spawn_acquire(&a, 600);
        tokio::task::yield_now().await;
        assert_eq!(a.snapshot().queued, 1);
        // The first prefill ends (its first token): its memory is back.
        first.prefilled();
        let second = second.await.unwrap().expect("granted after the first prefill");
        assert_eq!(a.snapshot().in_use, 2, "the first keeps its slot while it decodes");
        drop((first, second));
        // Under the line no prefill starts, however short.
        a.observe_memory(Some(-MIB));
        let tiny = spawn_acquire(&a, 4);
        tokio::task::yield_now().await;
        assert_eq!(a.snapshot().queued, 1);
        assert!(a.try_now(1, 4, M0).is_none(), "nor a background replay");
        a.observe_memory(Some(100 * MIB));
        drop(tiny.await.unwrap().expect("granted above the line"));
    });
}

#[test]
fn a_long_prompt_held_past_its_patience_holds_the_queue_if_waiting_would_let_it_in() {
    rt().block_on(async {
        let a = guarded(4, 1000);
        let running = a.acquire(1, 600, &c()).await.unwrap();
        let long = spawn_acquire(&a, 800);
        tokio::task::yield_now().await;
        // Shorter prompts keep going ahead while its patience lasts.
        drop(a.acquire(1, 40, &c()).await.expect("a short one goes ahead"));
        tokio::time::advance(MEMORY_PATIENCE).await;
        a.observe_memory(Some(1000 * MIB));
        let short = spawn_acquire(&a, 40);
        tokio::task::yield_now().await;
        assert_eq!(a.snapshot().queued, 2, "the long prompt holds the queue for itself now");
        drop(running);
        let long = long.await.unwrap().expect("the long prompt goes first");
        drop(short.await.unwrap().expect("then the short one"));
        drop(long);
    });
}

#[test]
fn a_prompt_that_can_never_fit_lets_others_by_and_its_deadline_names_the_memory() {
    rt().block_on(async {
        let a = guarded(4, 300);
        let huge = spawn_acquire(&a, 800);
        tokio::task::yield_now().await;
        tokio::time::advance(MEMORY_PATIENCE).await;
        a.observe_memory(Some(300 * MIB));
        // Past its patience, but the node never has 800 MiB: it does not hold the queue.
        drop(a.acquire(1, 40, &c()).await.expect("others are not held for it"));
        let e = huge.await.unwrap().unwrap_err();
        assert!(matches!(e, GatewayError::MemoryHeld { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("0.78 GiB") && text.contains("0.29 GiB"), "{text}");
        assert_eq!(e.status().as_u16(), 503);
        assert_eq!(a.snapshot().queued, 0);
    });
}

#[test]
fn a_model_not_loaded_waits_without_holding_up_the_loaded_ones_and_goes_first_when_loaded() {
    rt().block_on(async {
        let a = Admission::new(1, limits(10, 30));
        let b = ModelId(1);
        let running = a.acquire(1, 10, &c()).await.unwrap();
        // A request for model 1 queues first, then one for model 0.
        let for_b = sparkgate_task::spawn("test", {
            let a = a.clone();
            async move { a.acquire_for((1, 10, b), &c(), None).await }
        });
        tokio::task::yield_now().await;
        let for_a = sparkgate_task::spawn("test", {
            let a = a.clone();
            async move { a.acquire_for((1, 10, M0), &c(), None).await }
        });
        tokio::task::yield_now().await;
        drop(running);
        // Model 1 is not loaded: the slot goes to the later request for model 0.
        let second = for_a.await.unwrap().unwrap();
        assert!(!for_b.is_finished());
        assert_eq!(a.waiting()[1].count, 1);
        drop(second);
        // A swap: nothing loaded, then model 1; its waiter is granted.
        a.load(0);
        a.load(b.bit());
        assert!(for_b.await.unwrap().is_ok());
    });
}

#[test]
fn the_wait_for_a_swap_does_not_count_against_the_queue_timeout() {
    rt().block_on(async {
        let a = Admission::new(1, limits(10, 30));
        let waiter = sparkgate_task::spawn("test", {
            let a = a.clone();
            async move { a.acquire_for((1, 10, ModelId(1)), &c(), None).await }
        });
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!waiter.is_finished(), "model 1 is not loaded: no QUEUE_TIMEOUT yet");
        // Loaded but held (its group restarting): its QUEUE_TIMEOUT runs from now.
        a.pause(Hold::Group);
        a.load(ModelId(1).bit());
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!waiter.is_finished());
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(matches!(waiter.await.unwrap(), Err(GatewayError::QueueTimeout { .. })));
    });
}

#[test]
fn a_failed_swap_answers_its_models_waiters_with_the_reason() {
    rt().block_on(async {
        let a = Admission::new(1, limits(10, 30));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let a = a.clone();
                sparkgate_task::spawn(
                    "test",
                    async move { a.acquire_for((1, 10, ModelId(1)), &c(), None).await },
                )
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(a.refuse(ModelId(1), "GLM", "its ranks failed to start"), 3);
        for w in waiters {
            let e = w.await.unwrap().unwrap_err();
            assert_eq!(
                e.to_string(),
                "the model `GLM` could not be loaded: its ranks failed to start; retry later"
            );
            assert_eq!(e.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        }
        assert_eq!(a.snapshot().queued, 0, "the refused left the queue");
        assert!(a.acquire(1, 10, &c()).await.is_ok());
    });
}
