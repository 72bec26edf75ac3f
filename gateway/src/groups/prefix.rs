//! A conversation's prefix key, or the session it names, which affinity routes by.

use std::collections::HashMap;

/// Bytes of a conversation's start that name its prefix: a long system prompt and the first
/// user turn fit; what follows changes every turn.
const PREFIX_BYTES: usize = 64 * 1024;

/// The key of a conversation a client names (SESSION_HEADER, Anthropic `metadata.user_id`):
/// affinity routes it as it routes a prefix, so a named conversation stays on its group.
pub(crate) fn session_key(session: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    "session".hash(&mut h);
    session.hash(&mut h);
    h.finish()
}

/// The key of a request's conversation prefix — the model, the system prompt or instructions,
/// and the conversation up to its first user turn (chat, Anthropic messages, Responses) or the
/// prompt's start (completions) — for prefix affinity. `None` when the body has none of them.
pub(crate) fn prefix_key(body: &[u8]) -> Option<u64> {
    use serde_json::value::RawValue;
    use std::hash::{Hash, Hasher};
    let fields: HashMap<&str, &RawValue> = serde_json::from_slice(body).ok()?;
    let mut parts: Vec<&str> = Vec::new();
    for key in ["system", "instructions"] {
        parts.extend(fields.get(key).map(|v| v.get()));
    }
    for key in ["messages", "input"] {
        let Some(turns) = fields
            .get(key)
            .and_then(|v| serde_json::from_str::<Vec<&RawValue>>(v.get()).ok())
        else {
            continue;
        };
        // Up to and including the first user turn: the rest of the history grows per turn.
        for turn in turns {
            parts.push(turn.get());
            if turn.get().contains("\"user\"") {
                break;
            }
        }
    }
    parts.extend(fields.get("prompt").map(|v| v.get()));
    if parts.is_empty() {
        return None;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    fields.get("model").map(|m| m.get()).hash(&mut h);
    for p in parts {
        p.as_bytes()[..p.len().min(PREFIX_BYTES)].hash(&mut h);
    }
    Some(h.finish())
}
