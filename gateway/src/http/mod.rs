//! The front door, the top layer: the connection loop (`listen`), the tower stack every request
//! goes through (`stack`: its layers and their order), the edge's own steps (`step`, `ids`,
//! `access`, `edge`, `body_guard`, `contain`) and `serve`, which starts it all.

mod access;
mod body_guard;
mod contain;
mod edge;
mod ids;
mod listen;
pub(crate) mod serve;
mod stack;
mod step;
