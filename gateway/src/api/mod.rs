//! What the APIs are, below everything that serves them: the families and their framing
//! (`family`), the route table (`routes`), errors in each family's envelope (`error`), reading a
//! body (`body`) and normalising it (`normalize`).

pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod family;
pub(crate) mod normalize;
pub(crate) mod routes;
