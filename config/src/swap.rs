//! How models are swapped (MODELS): SWAP_POLICY and the SWAP_* settings, as the gateway reads
//! them.

use std::time::Duration;

use crate::choice::choice;

choice! {
    /// SWAP_POLICY: what a request for the model not loaded does.
    pub enum SwapPolicy {
        /// It waits while the loaded model drains and the other is swapped in.
        OnDemand = "on_demand",
        /// It is refused (503 + Retry-After); an operator swaps with `sparkgate model NAME`.
        Manual = "manual",
    }
}

/// How models are swapped (the SWAP_* settings and IDLE_UNLOAD_S).
#[derive(Debug, Clone, PartialEq)]
pub struct Swap {
    pub policy: SwapPolicy,
    /// How long the loaded model's admitted requests may finish before its ranks stop.
    pub drain: Duration,
    /// How long a model with work stays loaded; also the least time between two swaps' starts.
    pub min_dwell: Duration,
    /// Nothing running or waiting for this long unloads the model; `None`: never.
    pub idle_unload: Option<Duration>,
    /// How close to its figure before the load each node's MemAvailable must come back.
    pub memory_margin_gib: f64,
    /// How long a swap waits for that.
    pub release_timeout: Duration,
}
