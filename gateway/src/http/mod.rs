//! The front door, the top layer: the connection loop (`listen`; `client_io` its streams,
//! `tls` and `cert_dates` HTTPS), what is read again while it runs (`reload`), what systemd is told
//! (`systemd`), the tower stack every request goes through (`stack`: its layers and their order), the edge's own steps (`step`, `ids`,
//! `access`, `edge`, `body_guard`, `contain`) and `serve`, which starts it all.

mod access;
mod body_guard;
mod cert_dates;
mod client_io;
mod contain;
mod edge;
mod ids;
mod listen;
mod reload;
pub(crate) mod serve;
mod stack;
mod step;
mod systemd;
mod tls;
