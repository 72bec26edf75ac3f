//! What the gateway knows about its upstream: whether rank 0 is ready, restarting or gone, the
//! active speculation mode, and the admission controller — one cloneable `GatewayControl` the
//! supervisor (or, in gateway-only mode, a health prober) drives — and the count of tokens the
//! gateway delivered, which the speculation policy learns from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;
use sparkgate_config::SpecMethod;

use crate::control::admission::{Admission, AdmissionSnapshot, QueueLimits};
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
    /// The group has requests pending and its engine makes no step (requests are held).
    Stalled(String),
    Unreachable(String),
    /// The supervisor gave up.
    Failed(String),
    /// An operator stopped the ranks.
    Stopped,
}

/// Where the gateway is in its life (DESIGN.md's shutdown contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    Serving,
    /// Shutting down: queued and new requests are refused (503 + Retry-After), in-flight ones
    /// get DRAIN_TIMEOUT to finish.
    Draining,
    /// Past DRAIN_TIMEOUT: every open stream ends with its route's error event and every
    /// unanswered request with 503.
    Closing,
}

#[derive(Debug)]
struct Inner {
    lifecycle: tokio::sync::watch::Sender<Lifecycle>,
    upstream: RwLock<UpstreamState>,
    mode: RwLock<SpecMethod>,
    admission: Arc<Admission>,
    delivered_tokens: AtomicU64,
    /// `delivered_tokens` sampled once a second, the last `RATE_WINDOW_S` + 1 samples.
    rate: std::sync::Mutex<std::collections::VecDeque<u64>>,
}

/// Seconds the reported tokens/s averages over.
const RATE_WINDOW_S: usize = 10;

/// The handle through which the gateway's admission and readiness are driven.
#[derive(Debug, Clone)]
pub struct GatewayControl {
    inner: Arc<Inner>,
}

impl GatewayControl {
    /// The control state before any group is known: no capacity and no mode until `serve`
    /// seeds both from the groups (`groups::seed`), which then keep them current.
    pub fn new(limits: QueueLimits) -> Self {
        Self {
            inner: Arc::new(Inner {
                lifecycle: tokio::sync::watch::Sender::new(Lifecycle::Serving),
                upstream: RwLock::new(UpstreamState::Starting),
                mode: RwLock::new(SpecMethod::None),
                admission: Admission::new(0, limits),
                delivered_tokens: AtomicU64::new(0),
                rate: std::sync::Mutex::new(std::collections::VecDeque::new()),
            }),
        }
    }

    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    /// Sets the upstream's state; true when it became another state (not only another detail,
    /// such as a stall's seconds). Logged at DEBUG: what changed it logs the event (the
    /// supervisor's table, or the gateway-only prober's).
    pub fn set_upstream(&self, state: UpstreamState) -> bool {
        let mut s = self.inner.upstream.write().expect("state lock");
        if *s == state {
            return false;
        }
        let changed = std::mem::discriminant(&*s) != std::mem::discriminant(&state);
        if changed {
            tracing::debug!(upstream = ?state, "upstream state changed");
        }
        *s = state;
        changed
    }

    pub fn upstream(&self) -> UpstreamState {
        self.inner.upstream.read().expect("state lock").clone()
    }

    pub fn set_mode(&self, mode: SpecMethod) {
        *self.inner.mode.write().expect("state lock") = mode;
    }

    pub fn mode(&self) -> SpecMethod {
        *self.inner.mode.read().expect("state lock")
    }

    /// Ready to serve: the upstream answers, admission is open and the gateway is not exiting.
    /// Why the gateway is ready or not, in one word (what `/ready` tells anyone): the
    /// upstream's state, else the gateway's own hold (`draining` before a restart, `closing`
    /// while it shuts down).
    pub fn readiness(&self) -> &'static str {
        if *self.inner.lifecycle.borrow() != Lifecycle::Serving {
            return "shutting_down";
        }
        match self.upstream() {
            UpstreamState::Ready if self.inner.admission.snapshot().paused => "draining",
            UpstreamState::Ready => "ready",
            UpstreamState::Starting => "starting",
            UpstreamState::Restarting(_) => "restarting",
            UpstreamState::Stalled(_) => "stalled",
            UpstreamState::Unreachable(_) => "unreachable",
            UpstreamState::Failed(_) => "failed",
            UpstreamState::Stopped => "stopped",
        }
    }

    pub fn is_ready(&self) -> bool {
        self.upstream() == UpstreamState::Ready
            && !self.inner.admission.snapshot().paused
            && *self.inner.lifecycle.borrow() == Lifecycle::Serving
    }

    /// Shutdown begins: queued requests are answered 503 at once, new ones too.
    pub fn begin_drain(&self) {
        self.inner.lifecycle.send_replace(Lifecycle::Draining);
        self.inner.admission.close();
    }

    /// DRAIN_TIMEOUT passed: what still runs is ended with an explicit error.
    pub fn close(&self) {
        self.inner.lifecycle.send_replace(Lifecycle::Closing);
    }

    /// Where the gateway is in its life now.
    pub(crate) fn lifecycle_now(&self) -> Lifecycle {
        *self.inner.lifecycle.borrow()
    }

    pub(crate) fn lifecycle(&self) -> tokio::sync::watch::Receiver<Lifecycle> {
        self.inner.lifecycle.subscribe()
    }

    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.inner.admission.snapshot()
    }

    /// Counts completion tokens a finished request delivered (from upstream usage) under the
    /// mode it ran in.
    pub(crate) fn count_tokens(&self, mode: SpecMethod, tokens: u64) {
        observe::tokens(mode, tokens);
        self.inner.delivered_tokens.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Completion tokens delivered since start, all modes.
    pub(crate) fn delivered_tokens(&self) -> u64 {
        self.inner.delivered_tokens.load(Ordering::Relaxed)
    }

    /// This second's sample of the tokens delivered (a one-second ticker calls it).
    pub(crate) fn sample_rate(&self) {
        let mut r = self.inner.rate.lock().expect("rate lock");
        r.push_back(self.delivered_tokens());
        if r.len() > RATE_WINDOW_S + 1 {
            r.pop_front();
        }
    }

    /// Completion tokens delivered per second over the last `RATE_WINDOW_S` seconds.
    pub(crate) fn tokens_per_s(&self) -> f64 {
        let r = self.inner.rate.lock().expect("rate lock");
        match (r.front(), r.back()) {
            (Some(a), Some(b)) if r.len() > 1 => (b - a) as f64 / (r.len() - 1) as f64,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_per_second_average_the_last_ten_samples() {
        let limits = QueueLimits {
            depth: 4,
            bytes: 1 << 20,
            timeout: std::time::Duration::from_secs(1),
        };
        let c = GatewayControl::new(limits);
        c.admission().set_capacity(2);
        c.set_mode(SpecMethod::Dspark);
        assert_eq!(c.tokens_per_s(), 0.0, "no sample yet");
        c.sample_rate();
        c.count_tokens(SpecMethod::Dspark, 50);
        c.sample_rate();
        assert_eq!(c.tokens_per_s(), 50.0);
        for _ in 0..20 {
            c.count_tokens(SpecMethod::Dspark, 30);
            c.sample_rate();
        }
        assert_eq!(c.tokens_per_s(), 30.0, "the older seconds left the window");
    }
}
