//! Usage per API key, model and route (docs/keys.md), added to the store's per-minute rows by one
//! writer task: each finished generation's counts are handed over at once (the request never
//! waits on the store), the writer folds what arrived together into one upsert per row, and a
//! `flush` returns once everything handed over before it is written — `/admin/usage` flushes
//! before it reads, and the gateway flushes before it exits. A write that fails is kept and
//! tried again.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sparkgate_store::{Usage, UsageKey};
use tokio::sync::{mpsc, oneshot};

use crate::api::error::GatewayError;
use crate::control::storage::StoreSlot;

/// The name usage of requests without an API key is kept under (a bounded label).
pub(crate) const ANONYMOUS: &str = "anonymous";

enum Msg {
    Add { at: i64, who: UsageKey, usage: Box<Usage> },
    Flush(oneshot::Sender<()>),
}

/// Rows waiting to be written: by minute and whose.
type Batch = HashMap<(i64, UsageKey), Usage>;

#[derive(Debug)]
pub(crate) struct Ledger {
    slot: Option<Arc<StoreSlot>>,
    /// The writer's queue, started with the first record.
    tx: OnceLock<mpsc::UnboundedSender<Msg>>,
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
        }
    }

    fn writer(&self) -> Option<&mpsc::UnboundedSender<Msg>> {
        let slot = self.slot.clone()?;
        Some(self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            sparkgate_task::spawn("usage-writer", write(slot, rx));
            tx
        }))
    }

    /// Adds one request's counts to `who`'s row for this minute.
    pub(crate) fn add(&self, who: UsageKey, usage: Usage) {
        if let Some(tx) = self.writer() {
            let _ = tx.send(Msg::Add {
                at: now_secs(),
                who,
                usage: Box::new(usage),
            });
        }
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
}

/// The writer: takes what arrived together, writes it, answers the flushes among it.
async fn write(slot: Arc<StoreSlot>, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut batch = Batch::new();
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv().await {
        take(first, &mut batch, &mut flushes);
        while let Ok(more) = rx.try_recv() {
            take(more, &mut batch, &mut flushes);
        }
        if let Err(e) = write_batch(&slot, &mut batch).await {
            metrics::counter!(crate::observe::usage::USAGE_WRITE_FAILURES).increment(1);
            tracing::warn!(error = %e, rows = batch.len(), "usage not written yet; kept to try again");
            if flushes.is_empty() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

fn take(msg: Msg, batch: &mut Batch, flushes: &mut Vec<oneshot::Sender<()>>) {
    match msg {
        Msg::Add { at, who, usage } => batch.entry((at - at.rem_euclid(60), who)).or_default().add(&usage),
        Msg::Flush(done) => flushes.push(done),
    }
}

/// Writes the batch's rows, each removed once written.
async fn write_batch(slot: &StoreSlot, batch: &mut Batch) -> Result<(), GatewayError> {
    if batch.is_empty() {
        return Ok(());
    }
    let store = slot.get().await?;
    let rows: Vec<(i64, UsageKey)> = batch.keys().cloned().collect();
    for row in rows {
        let usage = batch[&row];
        store
            .add_usage(row.0, &row.1, &usage)
            .await
            .map_err(|e| GatewayError::StoreFailed(e.to_string()))?;
        batch.remove(&row);
    }
    Ok(())
}
