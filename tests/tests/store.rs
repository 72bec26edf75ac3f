//! The store (`sparkgate-store`) held to the same suite on both backends — an embedded SQLite
//! file and a real PostgreSQL server (Debian's, started per test): a record read back only by
//! its owner, another owner's id never overwritten, deletes, the TTL and the size cap evicting
//! the oldest first, what one handle wrote read by another (a restarted gateway, or a
//! second gateway on the same database), per-key usage rows summed by minute, window and key
//! (one at a time, or a batch in one transaction), and quarantined request bodies.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sparkgate_store::{Location, Retention, Store, Stored, Usage, UsageKey};
use sparkgate_tests::postgres::Postgres;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn record(id: &str, owner: &str, size: usize) -> Stored {
    Stored {
        id: id.into(),
        owner: owner.into(),
        created_at: 1_700_000_000,
        response: format!("{{\"id\":\"{id}\",\"pad\":\"{}\"}}", "x".repeat(size)),
        input: "[{\"role\":\"user\",\"content\":\"hi\"}]".into(),
    }
}

/// A store at `at` whose clock the test moves.
async fn open(at: &Location, retention: Retention, now: &Arc<AtomicI64>) -> Store {
    let now = now.clone();
    Store::open_with_clock(at, retention, Arc::new(move || now.load(Ordering::SeqCst)))
        .await
        .unwrap()
}

async fn suite(at: Location) {
    let now = Arc::new(AtomicI64::new(1_000));
    let store = open(&at, Retention::default(), &now).await;
    // Owners.
    assert!(store.put(record("resp_1", "alice", 10)).await.unwrap());
    let got = store.get("resp_1", "alice").await.unwrap().expect("the owner reads it");
    assert_eq!(got, record("resp_1", "alice", 10));
    assert_eq!(
        store.get("resp_1", "bob").await.unwrap(),
        None,
        "another key sees nothing"
    );
    assert!(
        !store.put(record("resp_1", "bob", 3)).await.unwrap(),
        "another owner's id is not taken"
    );
    assert_eq!(
        store.get("resp_1", "alice").await.unwrap(),
        Some(record("resp_1", "alice", 10))
    );
    assert!(!store.delete("resp_1", "bob").await.unwrap());
    // Another handle on the same location (a restarted gateway, or a second one) reads it.
    let other = open(&at, Retention::default(), &now).await;
    assert!(other.get("resp_1", "alice").await.unwrap().is_some());
    assert!(store.delete("resp_1", "alice").await.unwrap());
    assert_eq!(other.get("resp_1", "alice").await.unwrap(), None);
    // The TTL.
    let ttl = Retention {
        ttl: Some(Duration::from_secs(10)),
        max_bytes: None,
    };
    let store = open(&at, ttl, &now).await;
    store.put(record("resp_old", "alice", 10)).await.unwrap();
    now.store(1_005, Ordering::SeqCst);
    store.put(record("resp_new", "alice", 10)).await.unwrap();
    now.store(1_011, Ordering::SeqCst);
    assert_eq!(store.get("resp_old", "alice").await.unwrap(), None, "expired");
    assert!(store.get("resp_new", "alice").await.unwrap().is_some());
    assert_eq!(store.sweep().await.unwrap(), 1);
    assert_eq!(store.evicted(), 1);
    assert_eq!(store.stats().await.unwrap().records, 1);
    store.delete("resp_new", "alice").await.unwrap();
    // The size cap: the newest records within it are kept.
    let one = record("resp_c0", "alice", 1000);
    let size = (one.id.len() + one.owner.len() + one.response.len() + one.input.len()) as u64;
    let capped = Retention {
        ttl: None,
        max_bytes: Some(size * 3),
    };
    let store = open(&at, capped, &now).await;
    for i in 0..5 {
        now.store(2_000 + i, Ordering::SeqCst);
        store.put(record(&format!("resp_c{i}"), "alice", 1000)).await.unwrap();
    }
    store.sweep().await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.records, 3, "{stats:?}");
    assert!(stats.bytes <= size * 3, "{stats:?}");
    for (i, kept) in [(0, false), (1, false), (2, true), (3, true), (4, true)] {
        let id = format!("resp_c{i}");
        assert_eq!(store.get(&id, "alice").await.unwrap().is_some(), kept, "{id}");
    }
    assert!(store.evicted() >= 2);
    usage(&at, &now).await;
}

/// Per-key usage rows: a minute's counts add up, windows and keys filter, another handle (a
/// second gateway) adds to the same rows.
async fn usage(at: &Location, now: &Arc<AtomicI64>) {
    let store = open(at, Retention::default(), now).await;
    let who = |key: &str, route: &str| UsageKey {
        key: key.into(),
        model: "m".into(),
        route: route.into(),
    };
    let one = |prompt, completion, wait_ms| {
        let mut u = Usage {
            requests: 1,
            prompt,
            completion,
            ..Usage::default()
        };
        u.waited(wait_ms);
        u
    };
    store
        .add_usage(6_000, &who("alice", "chat"), &one(10, 5, 5))
        .await
        .unwrap();
    store
        .add_usage(6_059, &who("alice", "chat"), &one(20, 7, 400))
        .await
        .unwrap();
    let other = open(at, Retention::default(), now).await;
    other
        .add_usage(6_030, &who("alice", "chat"), &one(1, 1, 20))
        .await
        .unwrap();
    store
        .add_usage(6_130, &who("alice", "messages"), &one(3, 2, 0))
        .await
        .unwrap();
    store
        .add_usage(6_130, &who("bob", "chat"), &one(100, 50, 0))
        .await
        .unwrap();
    let all = store.usage_since(0, None).await.unwrap();
    assert_eq!(all.len(), 3, "{all:?}");
    let (key, chat) = &all[0];
    assert_eq!(key, &who("alice", "chat"));
    assert_eq!(
        (chat.requests, chat.prompt, chat.completion, chat.wait_ms),
        (3, 31, 13, 425)
    );
    assert_eq!(chat.wait_percentile(0.5), Some(50));
    let later = store.usage_since(6_100, Some("alice")).await.unwrap();
    assert_eq!(later.len(), 1, "only the later minute, only alice: {later:?}");
    assert_eq!(later[0].0, who("alice", "messages"));
    assert!(store.usage_since(6_180, None).await.unwrap().is_empty());
    // A batch in one transaction adds to the same rows; tokens by key and minute rebuild quotas.
    let batch = [
        (6_010, who("alice", "chat"), one(4, 4, 0)),
        (6_190, who("bob", "chat"), one(1, 2, 0)),
    ];
    store.add_usage_all(&batch).await.unwrap();
    let minutes = other.tokens_by_minute(6_000).await.unwrap();
    assert_eq!(
        minutes,
        vec![
            ("alice".to_owned(), 6_000, 31 + 13 + 8),
            ("alice".to_owned(), 6_120, 5),
            ("bob".to_owned(), 6_120, 150),
            ("bob".to_owned(), 6_180, 3),
        ]
    );
    assert_eq!(other.tokens_by_minute(6_150).await.unwrap().len(), 3, "from 6_120 on");
    // The console's series: buckets of two minutes from 6_000 (6_180 falls in 6_120's).
    let point = |key: &str, at, (prompt, completion, requests)| sparkgate_store::SeriesPoint {
        key: key.into(),
        at,
        prompt,
        completion,
        requests,
    };
    assert_eq!(
        other.usage_series(6_000, 120, None).await.unwrap(),
        vec![
            point("alice", 6_000, (35, 17, 4)),
            point("alice", 6_120, (3, 2, 1)),
            point("bob", 6_120, (101, 52, 2)),
        ]
    );
    assert_eq!(
        other.usage_series(6_030, 60, Some("bob")).await.unwrap().len(),
        2,
        "bob only"
    );
    quarantine(at, now).await;
}

/// Quarantined bodies: verdicts counted under one id, the latest first, seen by another handle,
/// expired past their TTL (and counted from one again), released.
async fn quarantine(at: &Location, now: &Arc<AtomicI64>) {
    use sparkgate_store::Verdict;
    let store = open(at, Retention::default(), now).await;
    let other = open(at, Retention::default(), now).await;
    let v = |id, request_id| Verdict {
        id,
        reason: "crashed alone",
        key: "alice",
        request_id,
        ttl: 100,
    };
    now.store(10_000, Ordering::SeqCst);
    store.quarantine(v("00000000000000aa", "r1")).await.unwrap();
    now.store(10_050, Ordering::SeqCst);
    other.quarantine(v("00000000000000aa", "r2")).await.unwrap();
    store.quarantine(v("00000000000000bb", "r3")).await.unwrap();
    let listed = other.quarantined().await.unwrap();
    let ids: Vec<(&str, u64)> = listed.iter().map(|q| (q.id.as_str(), q.quarantines)).collect();
    assert_eq!(ids, [("00000000000000aa", 2), ("00000000000000bb", 1)], "{listed:?}");
    let aa = &listed[0];
    assert_eq!(
        (aa.first_at, aa.last_at, aa.expires_at, aa.request_id.as_str()),
        (10_000, 10_050, 10_150, "r2")
    );
    now.store(10_150, Ordering::SeqCst);
    assert!(store.quarantined().await.unwrap().is_empty(), "expired past its TTL");
    store.quarantine(v("00000000000000aa", "r4")).await.unwrap();
    assert_eq!(
        store.quarantined().await.unwrap()[0].quarantines,
        1,
        "an expired body starts again"
    );
    assert_eq!(store.expire_quarantine().await.unwrap(), 1, "bb's row removed");
    assert!(other.release("00000000000000aa").await.unwrap());
    assert!(!other.release("00000000000000aa").await.unwrap(), "released once");
    assert!(store.quarantined().await.unwrap().is_empty());
}

#[test]
fn the_sqlite_store_keeps_owns_expires_and_caps() {
    let dir = tempfile::tempdir().unwrap();
    let at = Location::parse(&dir.path().join("state/store.sqlite").display().to_string()).unwrap();
    rt().block_on(suite(at));
}

#[test]
fn the_postgres_store_passes_the_same_suite() {
    let pg = Postgres::start();
    let at = Location::parse(&pg.database("sparkgate")).unwrap();
    rt().block_on(suite(at));
}

#[test]
fn an_unreachable_or_unknown_store_is_a_clear_error() {
    let err = Location::parse("redis://x").unwrap_err().to_string();
    assert!(err.contains("unknown scheme"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let at = Location::parse(&format!(
        "postgresql://sparkgate:pw@localhost/none?host={}",
        dir.path().display()
    ))
    .unwrap();
    let err = rt()
        .block_on(Store::open(&at, Retention::default()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("could not be opened") && !err.contains("pw@"), "{err}");
}
