//! Usage per API key, model and route (docs/keys.md), added to the store's per-minute rows by one
//! writer task with group commit: each finished generation's counts are handed over with a
//! `Committed` ticket, the writer writes everything that arrived together in one transaction
//! (one WAL commit on SQLite) and answers every ticket of it once that transaction is durable.
//! The request path waits on its ticket before its answer's last byte (a whole answer before its
//! head, a stream before its final event), so a gateway killed at any moment loses no usage of
//! an answer a client received whole. A write that fails is kept and tried again; its tickets
//! wait for it (their waiters give up at `COMMIT_WAIT`), and while writes fail new answers do not
//! wait at all. A `flush` returns once everything handed
//! over before it is written — `/admin/usage` flushes before it reads, and the gateway flushes
//! before it exits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sparkgate_store::{Usage, UsageKey};
use tokio::sync::{mpsc, oneshot};

use crate::api::error::GatewayError;
use crate::control::storage::StoreSlot;

/// The name usage of requests without an API key is kept under (a bounded label).
pub(crate) const ANONYMOUS: &str = "anonymous";

/// The longest an answer's end waits for its usage to be durable: a store that cannot be written
/// delays answers by this much, then lets them end (the usage stays queued and is tried again).
const COMMIT_WAIT: Duration = Duration::from_secs(5);
/// How long the writer waits before trying a failed write again.
const RETRY_AFTER: Duration = Duration::from_millis(200);

enum Msg {
    Add {
        at: i64,
        who: UsageKey,
        usage: Box<Usage>,
        done: oneshot::Sender<()>,
    },
    Flush(oneshot::Sender<()>),
}

/// Rows waiting to be written: by minute and whose.
type Batch = HashMap<(i64, UsageKey), Usage>;

/// A request's usage on its way to the store: `durable` resolves once it is committed.
#[derive(Debug)]
pub(crate) struct Committed(Option<oneshot::Receiver<()>>);

impl Committed {
    /// Nothing to wait for (no store, or nothing recorded).
    pub(crate) fn now() -> Committed {
        Committed(None)
    }

    /// Whether there is nothing to wait for.
    pub(crate) fn is_now(&self) -> bool {
        self.0.is_none()
    }

    /// Returns once the usage is durable, or after `COMMIT_WAIT` (a WARN: the answer ends
    /// before its usage is on disk).
    pub(crate) async fn durable(self) {
        let Some(rx) = self.0 else { return };
        if tokio::time::timeout(COMMIT_WAIT, rx).await.is_err() {
            metrics::counter!(crate::observe::usage::USAGE_COMMIT_TIMEOUTS).increment(1);
            tracing::warn!(
                waited_s = COMMIT_WAIT.as_secs(),
                "usage not durable yet: the answer ends anyway (its row is still queued)"
            );
        }
    }
}

#[derive(Debug)]
pub(crate) struct Ledger {
    slot: Option<Arc<StoreSlot>>,
    /// The writer's queue, started with the first record.
    tx: OnceLock<mpsc::UnboundedSender<Msg>>,
    /// The writer's last write failed: answers do not wait for their usage until one succeeds
    /// (a store that is down must not add COMMIT_WAIT to every answer).
    failing: Arc<AtomicBool>,
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Ledger {
    pub(crate) fn new(slot: Option<Arc<StoreSlot>>) -> Ledger {
        Ledger {
            slot,
            tx: OnceLock::new(),
            failing: Arc::default(),
        }
    }

    fn writer(&self) -> Option<&mpsc::UnboundedSender<Msg>> {
        let slot = self.slot.clone()?;
        Some(self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            sparkgate_task::spawn("usage-writer", write(slot, rx, self.failing.clone()));
            tx
        }))
    }

    /// Adds one request's counts to `who`'s row for this minute; the ticket says when it is
    /// durable.
    pub(crate) fn add(&self, who: UsageKey, usage: Usage) -> Committed {
        let Some(tx) = self.writer() else {
            return Committed::now();
        };
        let (done, durable) = oneshot::channel();
        let msg = Msg::Add {
            at: now_secs(),
            who,
            usage: Box::new(usage),
            done,
        };
        if tx.send(msg).is_err() {
            return Committed::now();
        }
        if self.failing.load(Ordering::Relaxed) {
            metrics::counter!(crate::observe::usage::USAGE_COMMIT_TIMEOUTS).increment(1);
            return Committed::now();
        }
        Committed(Some(durable))
    }

    /// Returns once every record added before it is written (or its write failed).
    pub(crate) async fn flush(&self) {
        let Some(tx) = self.writer() else { return };
        let (done, written) = oneshot::channel();
        if tx.send(Msg::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }

    /// Usage since `since` (seconds) by key, model and route, of `key` or everyone, with
    /// everything finished until now written first.
    pub(crate) async fn since(&self, since: i64, key: Option<&str>) -> Result<Vec<(UsageKey, Usage)>, GatewayError> {
        let Some(slot) = &self.slot else { return Ok(Vec::new()) };
        self.flush().await;
        let store = slot.get().await?;
        store
            .usage_since(since, key)
            .await
            .map_err(|e| GatewayError::StoreFailed(e.to_string()))
    }

    /// Each key's use in buckets of `step` seconds since `since`, of `key` or everyone, with
    /// everything finished until now written first (the console's charts).
    pub(crate) async fn series(
        &self,
        (since, step): (i64, i64),
        key: Option<&str>,
    ) -> Result<Vec<sparkgate_store::SeriesPoint>, GatewayError> {
        let Some(slot) = &self.slot else { return Ok(Vec::new()) };
        self.flush().await;
        let store = slot.get().await?;
        store
            .usage_series(since, step, key)
            .await
            .map_err(|e| GatewayError::StoreFailed(e.to_string()))
    }

    /// Tokens by key and minute since `since` (seconds), from the store.
    pub(crate) async fn tokens_by_minute(&self, since: i64) -> Result<Vec<(String, i64, u64)>, GatewayError> {
        let Some(slot) = &self.slot else { return Ok(Vec::new()) };
        let store = slot.get().await?;
        store
            .tokens_by_minute(since)
            .await
            .map_err(|e| GatewayError::StoreFailed(e.to_string()))
    }
}

/// What the writer holds between two writes.
#[derive(Default)]
struct Pending {
    batch: Batch,
    /// Answered once the batch holding their rows is durable.
    tickets: Vec<oneshot::Sender<()>>,
    /// Answered after the next write, whether it succeeded or not.
    flushes: Vec<oneshot::Sender<()>>,
}

impl Pending {
    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Add { at, who, usage, done } => {
                self.batch.entry((at - at.rem_euclid(60), who)).or_default().add(&usage);
                self.tickets.push(done);
            }
            Msg::Flush(done) => self.flushes.push(done),
        }
    }
}

/// The writer: takes what arrived together, writes it in one transaction, answers its tickets
/// and the flushes among it.
async fn write(slot: Arc<StoreSlot>, mut rx: mpsc::UnboundedReceiver<Msg>, failing: Arc<AtomicBool>) {
    let mut pending = Pending::default();
    while let Some(first) = rx.recv().await {
        pending.take(first);
        while let Ok(more) = rx.try_recv() {
            pending.take(more);
        }
        loop {
            match write_batch(&slot, &pending.batch).await {
                Ok(()) => {
                    failing.store(false, Ordering::Relaxed);
                    pending.batch.clear();
                    for done in pending.tickets.drain(..) {
                        let _ = done.send(());
                    }
                }
                Err(e) => {
                    failing.store(true, Ordering::Relaxed);
                    metrics::counter!(crate::observe::usage::USAGE_WRITE_FAILURES).increment(1);
                    tracing::warn!(error = %e, rows = pending.batch.len(), "usage not written yet; kept to try again");
                }
            }
            for done in pending.flushes.drain(..) {
                let _ = done.send(());
            }
            if pending.batch.is_empty() {
                break;
            }
            tokio::time::sleep(RETRY_AFTER).await;
            while let Ok(more) = rx.try_recv() {
                pending.take(more);
            }
        }
    }
}

/// Writes the batch's rows in one transaction.
async fn write_batch(slot: &StoreSlot, batch: &Batch) -> Result<(), GatewayError> {
    if batch.is_empty() {
        return Ok(());
    }
    let store = slot.get().await?;
    let rows: Vec<(i64, UsageKey, Usage)> = batch
        .iter()
        .map(|((at, who), usage)| (*at, who.clone(), *usage))
        .collect();
    store
        .add_usage_all(&rows)
        .await
        .map_err(|e| GatewayError::StoreFailed(e.to_string()))
}
