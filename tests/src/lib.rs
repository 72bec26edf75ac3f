//! Test support for sparkgate: `vllm-sim` (the simulator of a vLLM 0.33 rank) and the helpers
//! the integration tests share.

pub mod conformance;
pub mod cutproxy;
pub mod difffuzz;
pub mod faults;
pub mod harness;
pub mod hosts;
pub mod http;
pub mod load;
pub mod logevents;
pub mod memreplay;
pub mod otlp;
pub mod overhead;
pub mod postgres;
pub mod python;
pub mod realvllm;
pub mod registry;
pub mod sim;
pub mod snapshot;
pub mod spec_eval;
mod spec_replay;
pub mod spec_split_eval;
pub mod sse;
pub mod supervised;
pub mod swapload;
pub mod systemd;
pub mod test_gateway;
pub mod tidy;
pub mod warm;
