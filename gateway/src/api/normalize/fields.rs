//! Request fields looked up by scan (`Fields`), not by hash.

use serde_json::{Map, Value};

/// Lookups by scan, not by hash: a request's top-level fields here are the few `TOUCHED` ones
/// and a kwargs object holds at most KWARGS_MAX_KEYS, so comparing keys costs less than the
/// SipHash of the one looked for (IndexMap's `get`: ~150 instructions, a dozen times a request).
pub(crate) trait Fields {
    fn field(&self, key: &str) -> Option<&Value>;
    fn field_mut(&mut self, key: &str) -> Option<&mut Value>;
    fn has(&self, key: &str) -> bool {
        self.field(key).is_some()
    }
}

impl Fields for Map<String, Value> {
    fn field(&self, key: &str) -> Option<&Value> {
        self.iter().find_map(|(k, v)| (k == key).then_some(v))
    }
    fn field_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.iter_mut().find_map(|(k, v)| (k == key).then_some(v))
    }
}
