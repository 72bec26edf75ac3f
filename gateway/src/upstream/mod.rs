//! Talking to a rank group's rank 0: the HTTP/1.1 client and its pool (`client`), its wire
//! (`wire`) and rank 0's metrics merged into the gateway's (`exposition`).

pub(crate) mod client;
pub(crate) mod exposition;
pub(crate) mod wire;

pub(crate) use client::{is_hop_by_hop, Upstream, UpstreamBody, UpstreamError};
