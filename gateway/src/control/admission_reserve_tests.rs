//! Admission with the interactive reserve: long requests alone take every slot, leave one while
//! another client is active, and wait at most LONG_MAX_WAIT_S; the cap is never passed.

use super::tests::rt;
use super::*;
use crate::control::reserve::Rule;

fn limits() -> QueueLimits {
    QueueLimits {
        depth: 16,
        bytes: 1 << 20,
        timeout: Duration::from_secs(600),
    }
}

/// Capacity 2, one slot held back, active for 10 s, long requests wait at most 30 s.
fn admission() -> Arc<Admission> {
    let a = Admission::new(2, limits());
    a.reserve_on_runtime_clock(Rule {
        slots: 1,
        active: Duration::from_secs(10),
        max_wait: Duration::from_secs(30),
    });
    a
}

fn heavy() -> Client {
    Client::new("heavy", 1).long(true)
}

fn chat() -> Client {
    Client::new("chat", 1)
}

/// A long request of the heavy client, waiting in a task.
fn long_waiter(a: &Arc<Admission>) -> tokio::task::JoinHandle<Permit> {
    let a = a.clone();
    sparkgate_task::spawn("test", async move { a.acquire(1, 10, &heavy()).await.unwrap() })
}

#[test]
fn long_requests_alone_take_every_slot() {
    rt().block_on(async {
        let a = admission();
        let _one = a.acquire(1, 10, &heavy()).await.unwrap();
        let _two = a.acquire(1, 10, &heavy()).await.unwrap();
        assert_eq!(a.snapshot().in_use, 2, "nobody else around: both slots");
    });
}

#[test]
fn a_chat_finds_the_held_slot_and_the_long_request_waits_until_the_chats_go_quiet() {
    rt().block_on(async {
        let a = admission();
        drop(a.acquire(1, 10, &chat()).await.unwrap());
        let _one = a.acquire(1, 10, &heavy()).await.unwrap();
        let second = long_waiter(&a);
        tokio::task::yield_now().await;
        assert_eq!(
            (a.snapshot().in_use, a.snapshot().queued),
            (1, 1),
            "the last slot is held back"
        );
        let c = a.acquire(1, 10, &chat()).await.unwrap();
        assert_eq!(a.snapshot().in_use, 2, "the chat took the held slot at once");
        drop(c);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(a.snapshot().queued, 1, "the chat client is still active");
        let started = Instant::now();
        let _two = second.await.unwrap();
        let waited = started.elapsed();
        assert!(
            waited <= Duration::from_secs(2),
            "let in once the chats went quiet: {waited:?}"
        );
        assert_eq!(a.snapshot().in_use, 2);
    });
}

#[test]
fn a_long_request_waits_at_most_long_max_wait_and_the_cap_holds() {
    rt().block_on(async {
        let a = admission();
        drop(a.acquire(1, 10, &chat()).await.unwrap());
        let _one = a.acquire(1, 10, &heavy()).await.unwrap();
        let arrived = Instant::now();
        let mut second = long_waiter(&a);
        // A chat every 5 s keeps its client active; the long request still goes at 30 s.
        let granted = loop {
            tokio::select! {
                p = &mut second => break p.unwrap(),
                () = tokio::time::sleep(Duration::from_secs(5)) => {
                    let snap = a.snapshot();
                    assert!(snap.in_use <= snap.capacity);
                    // Not at 30 s itself: the long request then takes the slot the chat would wait for.
                    if snap.in_use < 2 && arrived.elapsed() < Duration::from_secs(29) {
                        drop(a.acquire(1, 10, &chat()).await.unwrap());
                    }
                }
            }
        };
        let waited = arrived.elapsed();
        assert!(
            (Duration::from_secs(30)..Duration::from_secs(31)).contains(&waited),
            "{waited:?}"
        );
        assert_eq!(a.snapshot().in_use, 2);
        drop(granted);
        let c = a.acquire(1, 10, &chat()).await.unwrap();
        assert_eq!(a.snapshot().in_use, 2, "the slot went back to the chats");
        drop(c);
    });
}

#[test]
fn a_chat_never_waits_behind_a_long_request_held_by_the_reserve() {
    rt().block_on(async {
        let a = admission();
        drop(a.acquire(1, 10, &chat()).await.unwrap());
        let _one = a.acquire(1, 10, &heavy()).await.unwrap();
        let _held = long_waiter(&a);
        tokio::task::yield_now().await;
        // Queued behind the held long request, a chat is granted the free slot.
        let c = tokio::time::timeout(Duration::from_millis(1), a.acquire(1, 10, &chat())).await;
        assert!(c.is_ok_and(|p| p.is_ok()), "the chat passes the held long request");
    });
}
