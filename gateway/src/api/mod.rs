//! What the APIs are, below everything that serves them: the families and their framing
//! (`family`), the route table (`routes`), each family's error forms (`openai`, `anthropic`),
//! errors rendered in them (`error`), reading a body (`body`) in the encodings vLLM reads
//! (`encoding`), its values as vLLM's models coerce them (`lax`), normalising it
//! (`normalize`), the rules that differ by vLLM release (`releases`), and what continuing a cut
//! stream needs of the APIs (`resume`), and the Responses API's stored state (`stored`).

pub(crate) mod anthropic;
pub(crate) mod body;
pub(crate) mod catalog;
pub(crate) mod encoding;
pub(crate) mod error;
pub(crate) mod family;
pub(crate) mod lax;
pub(crate) mod models;
pub(crate) mod normalize;
pub(crate) mod openai;
pub(crate) mod releases;
pub(crate) mod resume;
pub(crate) mod routes;
pub(crate) mod stored;
