//! sparkgate's front door: the only crate that knows OpenAI JSON. Its layers, each a folder
//! that imports only the layers listed before it (ARCHITECTURE.md):
//! `observe` (metrics, logs) → `api` (families, routes, errors, bodies, normalisation) →
//! `control` (admission, fair queue, upstream state, speculation) → `upstream` (the client to
//! rank 0, its wire, its metrics) → `groups` (rank groups, leases, the abort fence) → `quarantine`
//! (poison requests) → `app`
//! (the shared state) → `pipeline` (a request's stages) → `admin` (the gateway's own routes) →
//! `console` (the web console over them) → `http` (the connection loop, the edge steps,
//! `serve`).

mod observe;

mod api;

mod control;

mod upstream;

mod groups;

mod quarantine;

mod app;

mod pipeline;

mod admin;

mod console;

mod http;

#[doc(hidden)]
pub mod microbench;

pub use api::error::GatewayError;
pub use control::admission::{AdmissionSnapshot, QueueLimits};
pub use control::state::{GatewayControl, UpstreamState};
pub use groups::Upstreams;
pub use http::serve::{local_addr, serve};
pub use observe::init_logging;
pub use observe::logwriter::LogGuard;
