//! A generation whose answer has not begun, and where it waits: what the log and
//! `sparkgate_client_gone_total` say when its client leaves first.

use std::time::Instant;

use metrics::counter;

use crate::observe;

/// Where a generation waits for its answer to begin.
pub(super) use crate::observe::Waiting;

/// A generation whose answer has not begun: if its client leaves first (hyper drops the
/// handler), the drop says so in the log and in `sparkgate_client_gone_total{stage}`.
pub(super) struct Pending<'a> {
    request_id: &'a str,
    route: &'static str,
    pub(super) started: Instant,
    /// A `Waiting` (atomics: the handler's future moves between threads).
    at: std::sync::atomic::AtomicU8,
    open: std::sync::atomic::AtomicBool,
}

impl<'a> Pending<'a> {
    pub(super) fn new(request_id: &'a str, route: &'static str, started: Instant) -> Self {
        Pending {
            request_id,
            route,
            started,
            at: std::sync::atomic::AtomicU8::new(Waiting::Request as u8),
            open: std::sync::atomic::AtomicBool::new(true),
        }
    }

    pub(super) fn at(&self, waiting: Waiting) {
        self.at.store(waiting as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// The handler returned: its own line says how it ended.
    pub(super) fn answered(&self) {
        self.open.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.open.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let stage = Waiting::ALL[usize::from(self.at.load(std::sync::atomic::Ordering::Relaxed))].label();
        counter!(observe::CLIENT_GONE, "stage" => stage).increment(1);
        tracing::info!(
            request_id = self.request_id,
            route = self.route,
            stage,
            waited_ms = self.started.elapsed().as_millis() as u64,
            "the client left before its answer began"
        );
    }
}
