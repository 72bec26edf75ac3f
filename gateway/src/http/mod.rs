//! The front door, the top layer: the connection loop (`listen`), one request's walk through the
//! edge steps to its handler (`dispatch`, `edge`) and `serve`, which starts it all.

mod dispatch;
mod edge;
mod listen;
pub(crate) mod serve;
