//! The response store seen from `/metrics` and status: its records and bytes, and what the TTL
//! and the size cap evicted, refreshed by the sweep that enforces them.

use metrics::{counter, gauge};

pub(crate) const STORE_RECORDS: &str = "sparkgate_store_records";
pub(crate) const STORE_BYTES: &str = "sparkgate_store_bytes";
pub(crate) const STORE_EVICTIONS: &str = "sparkgate_store_evictions_total";

pub(super) fn describe() {
    use metrics::{describe_counter, describe_gauge, Unit};
    describe_gauge!(STORE_RECORDS, "Responses in the response store (STORE_URL).");
    describe_gauge!(
        STORE_BYTES,
        Unit::Bytes,
        "Bytes of the responses in the response store."
    );
    describe_counter!(
        STORE_EVICTIONS,
        "Stored responses removed by STORE_TTL or STORE_MAX_BYTES (oldest first)."
    );
    counter!(STORE_EVICTIONS).absolute(0);
}

/// Enforces the store's TTL and size cap (run once a minute), and publishes what it holds;
/// what it holds, when it could be read.
pub(crate) async fn sweep(store: &sparkgate_store::Store) -> Option<sparkgate_store::Stats> {
    if let Err(e) = store.sweep().await {
        tracing::warn!(error = %e, "response store sweep failed");
    }
    publish(store).await
}

/// The store's size into the gauges and its evictions into the counter.
pub(crate) async fn publish(store: &sparkgate_store::Store) -> Option<sparkgate_store::Stats> {
    counter!(STORE_EVICTIONS).absolute(store.evicted());
    match store.stats().await {
        Ok(stats) => {
            gauge!(STORE_RECORDS).set(stats.records as f64);
            gauge!(STORE_BYTES).set(stats.bytes as f64);
            Some(stats)
        }
        Err(e) => {
            tracing::warn!(error = %e, "response store size unreadable");
            None
        }
    }
}
