//! The families of swapping models (MODELS): which model is loaded, swaps by their ends and
//! trigger, how long a swap took and how long a request waited for one.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

pub(crate) const MODEL_LOADED: &str = "sparkgate_model_loaded";
pub(crate) const MODEL_SWAPS: &str = "sparkgate_model_swaps_total";
pub(crate) const MODEL_SWAP_FAILURES: &str = "sparkgate_model_swap_failures_total";
pub(crate) const MODEL_SWAP_SECONDS: &str = "sparkgate_model_swap_seconds";
pub(crate) const MODEL_SWAP_WAIT_SECONDS: &str = "sparkgate_model_swap_wait_seconds";

/// Swaps take minutes on the pair (seconds on the simulator): buckets up to an hour.
pub(crate) const SWAP_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0,
];

pub(crate) fn describe() {
    describe_gauge!(MODEL_LOADED, "1 for the model whose ranks serve now (MODELS), 0 for the others; all 0 while a swap runs or after an idle unload.");
    describe_counter!(
        MODEL_SWAPS,
        "Swaps between models that finished, by the model left (`none`: nothing was loaded), the model loaded (`none`: an idle unload) and trigger (demand, operator, idle, revert)."
    );
    describe_counter!(
        MODEL_SWAP_FAILURES,
        "Swaps that did not happen or did not finish (the model would not fit, the memory did not come back, its ranks failed to start), by the model asked for."
    );
    describe_histogram!(
        MODEL_SWAP_SECONDS,
        Unit::Seconds,
        "How long a swap took, from its start (the drain) to the new model serving."
    );
    describe_histogram!(
        MODEL_SWAP_WAIT_SECONDS,
        Unit::Seconds,
        "How long a generation for a model that was not loaded when it arrived waited for its slot (the swap included)."
    );
}
