//! The speculation policy, used by the gateway (which samples demand and switches the mode) and
//! by the evaluation harness (which replays traces in virtual time): `policy` is the `auto` rule
//! for one group, `split` the same rule over several groups.

pub mod policy;
pub mod split;
