//! What the APIs are, below everything that serves them: the families and their framing
//! (`family`), the route table (`routes`), each family's error forms (`openai`, `anthropic`),
//! errors rendered in them (`error`), reading a body (`body`) and normalising it (`normalize`).

pub(crate) mod anthropic;
pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod family;
pub(crate) mod normalize;
pub(crate) mod openai;
pub(crate) mod routes;
