//! What the gateway knows about its upstream: whether rank 0 is ready, restarting or gone, the
//! active speculation mode, and the admission controller — one cloneable `GatewayControl` the
//! supervisor (or, in gateway-only mode, a health prober) drives — and the count of tokens the
//! gateway delivered, which the speculation policy learns from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::admission::{Admission, AdmissionSnapshot, QueueLimits};
use crate::observe;

/// The upstream's condition as the gateway reports it on `/ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "detail", rename_all = "snake_case")]
pub enum UpstreamState {
    /// Not probed yet.
    Starting,
    Ready,
    /// The ranks are being restarted on purpose (requests are held, not failed).
    Restarting(String),
    Unreachable(String),
    /// The supervisor gave up.
    Failed(String),
    /// An operator stopped the ranks.
    Stopped,
}

#[derive(Debug)]
struct Inner {
    upstream: RwLock<UpstreamState>,
    mode: RwLock<String>,
    admission: Arc<Admission>,
    delivered_tokens: AtomicU64,
}

/// The handle through which the gateway's admission and readiness are driven.
#[derive(Debug, Clone)]
pub struct GatewayControl {
    inner: Arc<Inner>,
}

impl GatewayControl {
    pub fn new(capacity: u32, limits: QueueLimits, mode: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                upstream: RwLock::new(UpstreamState::Starting),
                mode: RwLock::new(mode.to_owned()),
                admission: Admission::new(capacity, limits),
                delivered_tokens: AtomicU64::new(0),
            }),
        }
    }

    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    pub fn set_upstream(&self, state: UpstreamState) {
        let mut s = self.inner.upstream.write().expect("state lock");
        if *s != state {
            tracing::info!(upstream = ?state, "upstream state changed");
            *s = state;
        }
    }

    pub fn upstream(&self) -> UpstreamState {
        self.inner.upstream.read().expect("state lock").clone()
    }

    pub fn set_mode(&self, mode: &str) {
        *self.inner.mode.write().expect("state lock") = mode.to_owned();
    }

    pub fn mode(&self) -> String {
        self.inner.mode.read().expect("state lock").clone()
    }

    /// Ready to serve: the upstream answers and admission is open.
    pub fn is_ready(&self) -> bool {
        self.upstream() == UpstreamState::Ready && !self.inner.admission.snapshot().paused
    }

    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.inner.admission.snapshot()
    }

    /// Counts completion tokens a finished request delivered (from upstream usage) under the
    /// mode it ran in.
    pub(crate) fn count_tokens(&self, mode: &str, tokens: u64) {
        metrics::counter!(observe::TOKENS, "mode" => mode.to_owned()).increment(tokens);
        self.inner.delivered_tokens.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Completion tokens delivered since start, all modes.
    pub(crate) fn delivered_tokens(&self) -> u64 {
        self.inner.delivered_tokens.load(Ordering::Relaxed)
    }
}
