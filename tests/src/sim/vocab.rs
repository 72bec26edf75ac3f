//! The simulated model's tokenizer: a fixed vocabulary (specials, punctuation, the numbers up
//! to 1000, the words it speaks — each plain and with a leading space — then the later
//! markers), text split into those tokens, unknown text as raw bytes.

/// Words the simulated model speaks. Each (with and without a leading space) is one token.
pub(crate) const WORDS: &[&str] = &[
    "the",
    "a",
    "model",
    "tensor",
    "parallel",
    "rank",
    "node",
    "token",
    "stream",
    "batch",
    "cache",
    "memory",
    "weights",
    "layer",
    "expert",
    "attention",
    "decode",
    "prefill",
    "step",
    "draft",
    "accept",
    "speculative",
    "throughput",
    "latency",
    "request",
    "response",
    "gateway",
    "server",
    "client",
    "queue",
    "limit",
    "context",
    "length",
    "sequence",
    "value",
    "result",
    "answer",
    "question",
    "first",
    "second",
    "then",
    "next",
    "because",
    "therefore",
    "so",
    "and",
    "or",
    "but",
    "with",
    "without",
    "for",
    "of",
    "in",
    "on",
    "to",
    "from",
    "by",
    "is",
    "are",
    "was",
    "be",
    "it",
    "this",
    "that",
    "each",
    "every",
    "all",
    "one",
    "two",
    "four",
    "many",
    "more",
    "less",
    "fast",
    "slow",
    "large",
    "small",
    "split",
    "across",
    "between",
    "over",
    "under",
    "shared",
    "local",
    "remote",
    "compute",
    "send",
    "receive",
    "wait",
    "check",
    "keep",
    "hold",
    "run",
    "runs",
    "uses",
    "makes",
    "works",
    "holds",
    "moves",
    "careful",
    "simple",
    "clear",
    "Considering",
    "Looking",
    "Checking",
    "Weighing",
    "Noting",
    "Recalling",
    "step",
    "by",
    "options",
    "carefully",
    "Reasoning",
    "Effort",
    "High",
    "Low",
    "Max",
    "The",
    "In",
    "Each",
    "When",
    "This",
    "Tensor",
    "A",
    "We",
    "weather",
    "Paris",
    "sunny",
    "degrees",
    "tool",
    "returned",
    "called",
    "Calling",
    "function",
    "Done",
    "result",
];

/// Markers of the rendered chat prompt; each is one token.
const SPECIALS: &[&str] = &[
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<think>",
    "</think>",
];

/// Markers added after the words, so every earlier id stays what it was: the end of a
/// sequence, the prompt's tools and effort sections, and the profiles' tool-call markup
/// (GLM's tags; DeepSeek's DSML tags).
const LATE_SPECIALS: &[&str] = &[
    EOS,
    TOOLS,
    EFFORT,
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<\u{ff5c}DSML\u{ff5c} calls>",
    "</\u{ff5c}DSML\u{ff5c} calls>",
    "<\u{ff5c}DSML\u{ff5c} invoke name=",
    "</\u{ff5c}DSML\u{ff5c} invoke>",
    "<\u{ff5c}DSML\u{ff5c} parameter name=",
    "</\u{ff5c}DSML\u{ff5c} parameter>",
    " string=",
];

/// The end-of-sequence token's text.
pub(crate) const EOS: &str = "<|endoftext|>";
/// Opens the prompt's tools section (a JSON object).
pub(crate) const TOOLS: &str = "<|tools|>";
/// Opens the prompt's effort section (the label the template rendered).
pub(crate) const EFFORT: &str = "<|effort|>";

const PUNCT: &[&str] = &[".", ",", ":", ";", "?", "!", "\n", "(", ")", "-", "*", "'", "\""];

const BYTE_IDS: u32 = 256;

/// The fixed vocabulary: specials, punctuation, numbers 0..=1000, words; each plain and with a
/// leading space. Token id = 256 + index; ids below 256 are raw bytes (anything unknown).
struct Vocab {
    entries: Vec<String>,
    index: std::collections::HashMap<String, u32>,
}

fn vocab() -> &'static Vocab {
    static VOCAB: std::sync::OnceLock<Vocab> = std::sync::OnceLock::new();
    VOCAB.get_or_init(|| {
        let mut entries: Vec<String> = SPECIALS.iter().map(|s| (*s).to_owned()).collect();
        let numbers: Vec<String> = (0..=1000).map(|n| n.to_string()).collect();
        for w in PUNCT
            .iter()
            .map(|s| (*s).to_owned())
            .chain(numbers)
            .chain(WORDS.iter().map(|s| (*s).to_owned()))
        {
            entries.push(format!(" {w}"));
            entries.push(w);
        }
        entries.dedup();
        entries.extend(LATE_SPECIALS.iter().map(|s| (*s).to_owned()));
        let mut index = std::collections::HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            index.entry(e.clone()).or_insert(BYTE_IDS + i as u32);
        }
        Vocab { entries, index }
    })
}

/// Splits text into token strings: specials, then an optional single space followed by a run of
/// letters/digits or one other character.
pub(crate) fn split_tokens(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(s) = SPECIALS.iter().chain(LATE_SPECIALS).find(|s| rest.starts_with(**s)) {
            out.push(&rest[..s.len()]);
            rest = &rest[s.len()..];
            continue;
        }
        let mut chars = rest.char_indices();
        let (_, first) = chars.next().expect("non-empty");
        let body_start = if first == ' ' && rest.len() > 1 { 1 } else { 0 };
        let body = &rest[body_start..];
        let c0 = body.chars().next().expect("non-empty");
        let len = if c0.is_alphanumeric() {
            body.char_indices()
                .find(|(_, c)| !c.is_alphanumeric())
                .map(|(i, _)| i)
                .unwrap_or(body.len())
        } else {
            c0.len_utf8()
        };
        let end = body_start + len;
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

pub(crate) fn tokenize(text: &str) -> Vec<u32> {
    let v = vocab();
    let mut ids = Vec::new();
    for t in split_tokens(text) {
        match v.index.get(t) {
            Some(id) => ids.push(*id),
            None => ids.extend(t.bytes().map(u32::from)),
        }
    }
    ids
}

pub(crate) fn count_tokens(text: &str) -> usize {
    let v = vocab();
    split_tokens(text)
        .iter()
        .map(|t| if v.index.contains_key(*t) { 1 } else { t.len() })
        .sum()
}

/// Inverse of [`tokenize`]; `None` for an id outside the vocabulary.
pub(crate) fn detokenize(ids: &[u64]) -> Option<String> {
    let v = vocab();
    let mut bytes = Vec::new();
    for &id in ids {
        let id = u32::try_from(id).ok().filter(|id| *id < vocab_size())?;
        match raw_bytes(id) {
            Some(b) => bytes.extend(b),
            None if id == pad_id() => {}
            None => bytes.extend(v.entries.get((id - BYTE_IDS) as usize)?.as_bytes()),
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The id of a vocabulary entry (a special, a word, …).
pub(crate) fn id_of(token: &str) -> Option<u32> {
    vocab().index.get(token).copied()
}

/// The id of a marker the vocabulary always has (0 would only come from a broken table).
fn marker(token: &str) -> u32 {
    id_of(token).unwrap_or(0)
}

/// The end-of-sequence token.
pub(crate) fn eos_id() -> u32 {
    marker(EOS)
}

/// `<think>`, which opens the reasoning.
pub(crate) fn think_id() -> u32 {
    marker("<think>")
}

/// `</think>`, which ends the reasoning.
pub(crate) fn think_end_id() -> u32 {
    marker("</think>")
}

/// `<|assistant|>`, the assistant's header.
pub(crate) fn assistant_id() -> u32 {
    marker("<|assistant|>")
}

/// The first id of a chat prompt's text pieces: after the vocabulary, the GLM fixture
/// tokenizer's ids (`bpe.rs`), then the padding id.
fn pieces_base() -> u32 {
    BYTE_IDS + vocab().entries.len() as u32
}

/// The padding id a chat prompt's ids start with (it stands for no text).
fn pad_id() -> u32 {
    pieces_base() + super::bpe::glm().len() as u32
}

/// How many ids the tokenizer has (bytes, words, markers, prompt pieces and padding).
pub(crate) fn vocab_size() -> u32 {
    pad_id() + 1
}

/// A chat prompt's ids, `len` of them when its text takes no more: the markers as the
/// vocabulary's ids, the text between them as the real tokenizer's pieces, and padding in
/// front for the framing the real render has and the simulator's does not. So a prompt shows
/// as many ids as the real frontend counts, and reads back (`text_of`) as its text.
pub(crate) fn prompt_ids(text: &str, len: usize) -> Vec<u32> {
    let (v, base) = (vocab(), pieces_base());
    let mut ids = Vec::new();
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let next = SPECIALS
            .iter()
            .chain(LATE_SPECIALS)
            .filter_map(|s| rest.find(*s).map(|at| (at, *s)))
            .min_by_key(|(at, s)| (*at, std::cmp::Reverse(s.len())));
        let (plain, marker) = match next {
            Some((at, s)) => (&rest[..at], Some(s)),
            None => (rest, None),
        };
        pieces.clear();
        super::bpe::glm().encode_plain(plain, &mut pieces);
        ids.extend(pieces.iter().map(|p| base + p));
        let Some(marker) = marker else { break };
        ids.push(v.index[marker]);
        rest = &rest[plain.len() + marker.len()..];
    }
    let pad = len.saturating_sub(ids.len());
    std::iter::repeat_n(pad_id(), pad).chain(ids).collect()
}

/// The bytes of an id below the vocabulary's words or among the prompt's pieces (`None`: a
/// word or marker, or padding).
fn raw_bytes(id: u32) -> Option<Vec<u8>> {
    if id < BYTE_IDS {
        return Some(vec![id as u8]);
    }
    let piece = id.checked_sub(pieces_base())?;
    super::bpe::glm().piece(piece).map(<[u8]>::to_vec)
}

/// Each id's text, as an incremental detokenizer releases it: a run of byte ids that is not
/// yet a whole UTF-8 character shows on the id that completes it (the ids before show
/// nothing); an id outside the vocabulary shows nothing. Also returns how many ids at the end
/// are bytes still waiting for the rest of their character.
pub(crate) fn piece_texts(ids: &[u32]) -> (Vec<String>, usize) {
    let v = vocab();
    let mut texts = Vec::with_capacity(ids.len());
    let (mut pending, mut waiting) = (Vec::new(), 0);
    for &id in ids {
        if let Some(bytes) = raw_bytes(id) {
            pending.extend(bytes);
            match std::str::from_utf8(&pending) {
                Ok(s) => {
                    texts.push(s.to_owned());
                    pending.clear();
                    waiting = 0;
                }
                // Incomplete at its end: wait for the rest of the character.
                Err(e) if e.error_len().is_none() && pending.len() - e.valid_up_to() < 4 => {
                    texts.push(String::new());
                    waiting += 1;
                }
                Err(_) => {
                    texts.push(String::from_utf8_lossy(&pending).into_owned());
                    pending.clear();
                    waiting = 0;
                }
            }
            continue;
        }
        let mut text = String::from_utf8_lossy(&std::mem::take(&mut pending)).into_owned();
        waiting = 0;
        if let Some(e) = v.entries.get((id - BYTE_IDS) as usize) {
            text.push_str(e);
        }
        texts.push(text);
    }
    (texts, waiting)
}

/// The text of `ids` (lossy), ids outside the vocabulary skipped.
pub(crate) fn text_of(ids: &[u32]) -> String {
    let (texts, _) = piece_texts(ids);
    texts.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_prompts_ids_read_back_as_its_text_at_the_counted_length() {
        let text = "<|tools|>{\"tools\": []}<|user|>Ünïcode 日本語 and the gateway<|assistant|><think>";
        let natural = prompt_ids(text, 0);
        assert_eq!(text_of(&natural), text);
        let padded = prompt_ids(text, natural.len() + 7);
        assert_eq!(padded.len(), natural.len() + 7);
        assert_eq!(text_of(&padded), text);
        assert_eq!(
            detokenize(&padded.iter().map(|i| u64::from(*i)).collect::<Vec<_>>()).as_deref(),
            Some(text)
        );
        assert!(padded.iter().all(|id| *id < vocab_size()));
        assert_eq!(
            padded[padded.len() - 2..],
            [assistant_id(), think_id()],
            "the markers are the vocabulary's"
        );
    }

    #[test]
    fn tokenizer_round_trips_and_counts() {
        let text = "<|user|>What is 17*19? Reply with the integer only.<|assistant|></think>";
        let ids = tokenize(text);
        assert_eq!(ids.len(), count_tokens(text));
        let as_u64: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
        assert_eq!(detokenize(&as_u64).unwrap(), text);
        assert_eq!(tokenize(" model").len(), 1);
        assert_eq!(tokenize("zqxj").len(), 4, "unknown words fall back to bytes");
        assert_eq!(tokenize("héllo").len(), "héllo".len());
    }

    #[test]
    fn late_markers_are_single_tokens_after_every_earlier_id() {
        let last_word = tokenize("carefully")[0];
        for marker in [EOS, TOOLS, EFFORT, "<tool_call>", "</\u{ff5c}DSML\u{ff5c} calls>"] {
            let ids = tokenize(marker);
            assert_eq!(ids.len(), 1, "{marker}");
            assert!(ids[0] > last_word, "{marker} comes after the words");
        }
        assert_eq!(tokenize("<think>"), vec![256 + 4], "earlier ids unchanged");
    }

    #[test]
    fn piece_texts_hold_a_character_until_its_last_byte() {
        let ids = tokenize("a é.");
        let (texts, waiting) = piece_texts(&ids);
        assert_eq!(texts.concat(), "a é.");
        assert_eq!(waiting, 0);
        let cut = &ids[..ids.len() - 2];
        let (texts, waiting) = piece_texts(cut);
        assert_eq!((texts.concat().as_str(), waiting), ("a ", 1));
    }
}
