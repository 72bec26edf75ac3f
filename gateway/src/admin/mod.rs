//! The gateway's own routes: health, readiness and metrics (`probes`) and the operator's
//! `/admin/*` (`ops`; per-key usage: `usage`), behind one axum router (`routes`).

pub(crate) mod ops;
mod probes;
pub(crate) mod routes;
mod usage;
