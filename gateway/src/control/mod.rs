//! The gateway's control state: admission (`admission`, its fair queue `fairq` over the clients
//! `clients` names), the upstream state, mode and lifecycle (`state`) and the speculation policy
//! runner (`spec`).

pub(crate) mod admission;
pub(crate) mod clients;
pub(crate) mod fairq;
pub(crate) mod spec;
pub(crate) mod state;
