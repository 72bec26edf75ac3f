//! The gateway's control state: admission (`admission`, its fair queue `fairq` over the clients
//! `clients` names, by the keys `keys` accepts, its memory guard `memory`, a waiter's preferred group `prefer`), per-key quotas (`quota`) and usage (`ledger`,
//! written to the store `storage` opens), the upstream state, mode and lifecycle (`state`) and the speculation policy
//! runner (`spec`), the generations in flight (`inflight`, for diagnostics bundles) and the
//! console's sign-ins (`sessions`).

pub(crate) mod admission;
pub(crate) mod clients;
pub(crate) mod fairq;
pub(crate) mod inflight;
pub(crate) mod keys;
pub(crate) mod ledger;
pub(crate) mod memory;
mod prefer;
pub(crate) mod quota;
pub(crate) mod reserve;
pub(crate) mod sessions;
pub(crate) mod spec;
pub(crate) mod state;
pub(crate) mod storage;
