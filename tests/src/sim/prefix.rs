//! vLLM's automatic prefix caching, modelled: a prompt's tokens in full blocks of
//! `--block-size` (16), each block named by a hash chained over the blocks before it, kept in
//! an LRU set as big as the KV cache. A request's cached tokens are its longest run of known
//! blocks from the start — never the whole prompt, as vLLM always computes the last token — and
//! only the rest is prefilled. Queries and hits count tokens, as vLLM's
//! `prefix_cache_queries_total` and `prefix_cache_hits_total` do. Blocks are known from the
//! moment the engine takes a request (vLLM caches them as they are computed: two identical
//! requests at the same instant both miss there; here the second hits).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

#[derive(Debug, Default)]
struct Lru {
    /// Block hash → the tick of its last use.
    used: HashMap<u64, u64>,
    /// Tick → block hash, oldest first.
    by_age: BTreeMap<u64, u64>,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, block: u64, capacity: usize) {
        self.tick += 1;
        if let Some(old) = self.used.insert(block, self.tick) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(self.tick, block);
        while self.used.len() > capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.used.remove(&oldest);
        }
    }
}

/// The engine's prefix cache.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    block_size: usize,
    /// Blocks the KV cache holds; 0 when prefix caching is off.
    capacity: usize,
    blocks: Mutex<Lru>,
}

impl PrefixCache {
    pub(crate) fn new(block_size: usize, capacity_blocks: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            capacity: capacity_blocks,
            blocks: Mutex::new(Lru::default()),
        }
    }

    /// The chained hashes of `tokens`' full blocks.
    fn hashes(&self, tokens: &[u32]) -> Vec<u64> {
        let mut parent = 0u64;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                parent.hash(&mut h);
                block.hash(&mut h);
                parent = h.finish();
                parent
            })
            .collect()
    }

    /// Whether the cache is on (a KV cache of any blocks).
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// How many of `tokens` are cached (a whole number of blocks, less than all of them), and
    /// the blocks to `keep` once the engine took the request. Nothing changes yet: a refused
    /// request leaves no trace.
    pub(crate) fn lookup(&self, tokens: &[u32]) -> Lookup {
        if !self.enabled() || tokens.is_empty() {
            return Lookup::default();
        }
        let blocks = self.hashes(tokens);
        let lru = self.blocks.lock().expect("prefix cache lock");
        let hit_blocks = blocks.iter().take_while(|h| lru.used.contains_key(h)).count();
        let computable = (tokens.len() - 1) / self.block_size * self.block_size;
        Lookup {
            cached: (hit_blocks * self.block_size).min(computable),
            blocks,
        }
    }

    /// The prompt's blocks are known from now on; its first block is the most recently used,
    /// so eviction takes a prompt's tail before its head (a head evicted first would leave
    /// the blocks after it unreachable).
    pub(crate) fn keep(&self, lookup: &Lookup) {
        let mut lru = self.blocks.lock().expect("prefix cache lock");
        for h in lookup.blocks.iter().rev() {
            lru.touch(*h, self.capacity);
        }
    }
}

/// What the cache holds of one prompt.
#[derive(Debug, Default)]
pub(crate) struct Lookup {
    pub(crate) cached: usize,
    blocks: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    impl PrefixCache {
        /// Looks `tokens` up and keeps them, as an accepted request does.
        fn admit(&self, tokens: &[u32]) -> usize {
            let l = self.lookup(tokens);
            self.keep(&l);
            l.cached
        }
    }

    #[test]
    fn a_shared_prefix_is_cached_in_whole_blocks_and_never_the_last_token() {
        let cache = PrefixCache::new(4, 100);
        let system: Vec<u32> = (0..10).collect();
        let first: Vec<u32> = system.iter().copied().chain([100, 101, 102]).collect();
        assert_eq!(cache.admit(&first), 0, "a cold cache");
        let second: Vec<u32> = system.iter().copied().chain([200, 201]).collect();
        assert_eq!(cache.admit(&second), 8, "the two full blocks of the shared 10 tokens");
        assert_eq!(cache.admit(&first), 12, "all of its three blocks");
        let exact: Vec<u32> = (0..8).collect();
        assert_eq!(cache.admit(&exact), 4, "the last token is always computed");
        let shifted: Vec<u32> = (1..13).collect();
        assert_eq!(cache.admit(&shifted), 0, "blocks are chained from the start");
    }

    #[test]
    fn the_oldest_blocks_are_evicted_and_a_cache_of_none_is_off() {
        let cache = PrefixCache::new(2, 3);
        let a: Vec<u32> = (0..7).collect();
        let b: Vec<u32> = (50..57).collect();
        cache.admit(&a);
        cache.admit(&b);
        assert_eq!(cache.admit(&a), 0, "b's three blocks pushed a's out");
        // A prompt's head outlives its tail: with room for two blocks, a 3-block prompt keeps
        // its first two.
        let small = PrefixCache::new(2, 2);
        small.admit(&a);
        assert_eq!(small.admit(&a), 4, "the head blocks stayed");
        let off = PrefixCache::new(16, 0);
        off.admit(&a);
        assert_eq!(off.admit(&a), 0);
    }
}
