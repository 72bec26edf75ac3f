//! The gateway's own routes: health, readiness and metrics (`probes`) and the operator's
//! `/admin/*` (`ops`; per-key usage: `usage`; diagnostics bundles: `diagnostics`; poisonous
//! bodies: `quarantine`; events, requests in flight and settings: `views`), behind one axum
//! router (`routes`).

mod diagnostics;
mod models;
pub(crate) mod ops;
mod probes;
mod quarantine;
pub(crate) mod routes;
pub(crate) mod usage;
mod views;
