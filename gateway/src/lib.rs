//! sparkgate's front door: the only crate that knows OpenAI JSON. The HTTP
//! server (`server`), request normalisation (`normalize`), admission (`admission`), the upstream
//! client, its wire and the SSE relay (`upstream`, `wire`, `relay`), edge layers (`edge`), errors (`error`) and
//! observability (`observe`).

mod admin;
mod admission;
mod app;
mod body;
mod clients;
mod decimal;
mod dispatch;
mod edge;
mod error;
mod exposition;
mod fairq;
mod groups;
mod listen;
mod logline;
mod logwriter;
#[doc(hidden)]
pub mod microbench;
mod normalize;
mod observe;
mod quarantine;
mod relay;
mod routes;
mod server;
mod spec;
mod state;
mod upstream;
mod wire;

pub use admission::{AdmissionSnapshot, QueueLimits};
pub use error::GatewayError;
pub use groups::Upstreams;
pub use logwriter::LogGuard;
pub use observe::init_logging;
pub use server::{local_addr, serve};
pub use state::{GatewayControl, UpstreamState};
