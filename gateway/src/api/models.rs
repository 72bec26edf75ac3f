//! A model's place among those a gateway serves (MODELS: several, one loaded at a time; else
//! one): the one fact admission, routing and normalisation share about it (`catalog.rs` holds
//! the models themselves).

/// A model's place in the catalog (the order of MODELS; 0 is the default, the only one
/// without MODELS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub(crate) struct ModelId(pub(crate) u8);

impl ModelId {
    /// Admission's bit for it.
    pub(crate) fn bit(self) -> u8 {
        1 << self.0
    }

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The first `n` models, in order.
    pub(crate) fn all(n: usize) -> impl Iterator<Item = ModelId> {
        (0..n.min(MAX_MODELS)).map(|i| ModelId(i as u8))
    }
}

/// The most models one gateway serves (admission keeps them as bits of one byte).
pub(crate) const MAX_MODELS: usize = 8;

/// Whether `model` is the alias `pattern`: an exact name, or a pattern with one `*` standing
/// for any run of characters (`claude-*` takes every model name Claude Code sends).
pub(crate) fn alias_matches(pattern: &str, model: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == model,
        Some((head, tail)) => {
            model.len() >= head.len() + tail.len() && model.starts_with(head) && model.ends_with(tail)
        }
    }
}
