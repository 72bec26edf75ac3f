//! The store's slot (STORE_URL, docs/store.md): the store opened at the start (the quarantine's
//! record is read from it) or, if it could not be then, when a request first needs it, and what
//! its last sweep found.

use serde_json::{json, Value};

/// The store, opened at the start or when a request first needs it (tried again by each): a
/// gateway whose store is down at its start still serves.
#[derive(Debug)]
pub(crate) struct StoreSlot {
    at: sparkgate_store::Location,
    retention: sparkgate_store::Retention,
    cell: tokio::sync::OnceCell<sparkgate_store::Store>,
    /// What the last sweep found (`sparkgate status`).
    last: std::sync::Mutex<Option<sparkgate_store::Stats>>,
}

impl StoreSlot {
    pub(crate) fn new(at: sparkgate_store::Location, retention: sparkgate_store::Retention) -> StoreSlot {
        StoreSlot {
            at,
            retention,
            cell: tokio::sync::OnceCell::new(),
            last: std::sync::Mutex::new(None),
        }
    }

    /// Records what a sweep found.
    pub(crate) fn saw(&self, stats: sparkgate_store::Stats) {
        *self.last.lock().expect("store stats") = Some(stats);
    }

    /// The store in `/admin/status`: where (redacted), whether a request opened it, and what
    /// the last sweep found.
    pub(crate) fn status_json(&self) -> Value {
        let last = *self.last.lock().expect("store stats");
        let evicted = self.opened().map_or(0, sparkgate_store::Store::evicted);
        json!({
            "url": self.at.to_string(),
            "open": self.opened().is_some(),
            "records": last.map(|s| s.records),
            "bytes": last.map(|s| s.bytes),
            "evicted": evicted,
        })
    }

    /// The store, opened now if it was not yet; a store that cannot be opened is a 503 that
    /// names why (and is tried again by the next request).
    pub(crate) async fn get(&self) -> Result<&sparkgate_store::Store, crate::api::error::GatewayError> {
        self.cell
            .get_or_try_init(|| async {
                let store = sparkgate_store::Store::open(&self.at, self.retention).await?;
                tracing::info!(store = %self.at, "response store open");
                // Its size from the start, not only from the first sweep.
                if let Some(stats) = crate::observe::store::publish(&store).await {
                    self.saw(stats);
                }
                Ok(store)
            })
            .await
            .map_err(|e: sparkgate_store::StoreError| crate::api::error::GatewayError::StoreFailed(e.to_string()))
    }

    /// The store, if a request opened it.
    pub(crate) fn opened(&self) -> Option<&sparkgate_store::Store> {
        self.cell.get()
    }
}
