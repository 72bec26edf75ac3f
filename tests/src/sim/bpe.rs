//! The reference fixture's tokenizer, applied as Hugging Face `tokenizers` applies it: the
//! added tokens cut out first (leftmost, longest), the rest split by the GPT-2 byte-level
//! pre-tokenizer, each piece's bytes mapped to their printable characters and merged by the
//! trained merges' ranks. The tokenizer files are the ones `tests/realvllm/model_dir.py` trains
//! (committed copies; `tests/sim_counts_real.rs` checks them against a fixture's). The counts
//! (`count/`) use the profile's; the simulator's prompt ids (`vocab.rs`) GLM's pieces.

use std::collections::HashMap;

use serde_json::Value;

/// A trained byte-level BPE tokenizer (`tokenizer.json`).
#[derive(Debug)]
pub(crate) struct Bpe {
    vocab: HashMap<String, u32>,
    /// `(left, right)` → its rank (lower merges first).
    ranks: HashMap<(String, String), usize>,
    /// Added tokens, longest first (a longer one wins at the same start).
    added: Vec<(String, u32)>,
    /// Byte → its printable stand-in (GPT-2's `bytes_to_unicode`).
    byte_chars: [char; 256],
    /// Id → its token's bytes (added tokens as their text).
    pieces: Vec<Vec<u8>>,
}

/// The GLM fixture's tokenizer.
pub(crate) fn glm() -> &'static Bpe {
    static GLM: std::sync::OnceLock<Bpe> = std::sync::OnceLock::new();
    GLM.get_or_init(|| Bpe::from_json(include_str!("../../realvllm/tokenizers/glm.json")))
}

/// The DeepSeek fixture's tokenizer.
pub(crate) fn deepseek() -> &'static Bpe {
    static DEEPSEEK: std::sync::OnceLock<Bpe> = std::sync::OnceLock::new();
    DEEPSEEK.get_or_init(|| Bpe::from_json(include_str!("../../realvllm/tokenizers/deepseek.json")))
}

impl Bpe {
    /// Reads a `tokenizer.json` as `tokenizers` writes it (merges as pairs).
    pub(crate) fn from_json(text: &str) -> Bpe {
        let t: Value = serde_json::from_str(text).expect("tokenizer.json");
        let id = |v: &Value| v.as_u64().expect("token id") as u32;
        let vocab = t["model"]["vocab"]
            .as_object()
            .expect("vocab")
            .iter()
            .map(|(k, v)| (k.clone(), id(v)))
            .collect();
        let pair = |m: &Value| {
            let s = |i: usize| m[i].as_str().expect("merge").to_owned();
            (s(0), s(1))
        };
        let ranks = t["model"]["merges"]
            .as_array()
            .expect("merges")
            .iter()
            .enumerate()
            .map(|(rank, m)| (pair(m), rank))
            .collect();
        let mut added: Vec<(String, u32)> = t["added_tokens"]
            .as_array()
            .expect("added tokens")
            .iter()
            .map(|a| (a["content"].as_str().expect("content").to_owned(), id(&a["id"])))
            .collect();
        added.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        let byte_chars = byte_chars();
        let pieces = pieces(&vocab, &added, &byte_chars);
        Bpe {
            vocab,
            ranks,
            added,
            byte_chars,
            pieces,
        }
    }

    /// How many ids it has.
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// The bytes id `id` stands for.
    pub(crate) fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// The ids of `text`, as `tokenizer.encode(text, add_special_tokens=False)` gives them.
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match self.next_added(rest) {
                Some((at, token, id)) => {
                    self.encode_plain(&rest[..at], &mut out);
                    out.push(id);
                    rest = &rest[at + token.len()..];
                }
                None => {
                    self.encode_plain(rest, &mut out);
                    break;
                }
            }
        }
        out
    }

    /// The first added token in `text`: where, which, its id.
    fn next_added(&self, text: &str) -> Option<(usize, &str, u32)> {
        self.added
            .iter()
            .filter_map(|(s, id)| text.find(s.as_str()).map(|at| (at, s.as_str(), *id)))
            // Leftmost; among equal starts the longest (listed first, and min_by_key keeps it).
            .min_by_key(|(at, _, _)| *at)
    }

    /// The ids of `text` without looking for added tokens.
    pub(crate) fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        for piece in pre_tokenize(text) {
            let symbols: Vec<String> = piece.bytes().map(|b| self.byte_chars[b as usize].to_string()).collect();
            for s in self.merge(symbols) {
                out.push(*self.vocab.get(&s).expect("every merge result is in the vocabulary"));
            }
        }
    }

    /// Applies the lowest-ranked merge present, leftmost first, until none applies.
    fn merge(&self, mut symbols: Vec<String>) -> Vec<String> {
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.ranks.get(&(w[0].clone(), w[1].clone())).map(|r| (*r, i)))
                .min();
            let Some((_, i)) = best else { return symbols };
            let right = symbols.remove(i + 1);
            symbols[i].push_str(&right);
        }
    }
}

/// Each id's bytes: a vocabulary token's characters mapped back to their bytes.
fn pieces(vocab: &HashMap<String, u32>, added: &[(String, u32)], byte_chars: &[char; 256]) -> Vec<Vec<u8>> {
    let byte_of: HashMap<char, u8> = (0..=255u8).map(|b| (byte_chars[b as usize], b)).collect();
    let top = vocab
        .values()
        .chain(added.iter().map(|(_, id)| id))
        .max()
        .map_or(0, |m| *m as usize + 1);
    let mut out = vec![Vec::new(); top];
    for (token, id) in vocab {
        out[*id as usize] = token.chars().filter_map(|c| byte_of.get(&c).copied()).collect();
    }
    for (token, id) in added {
        out[*id as usize] = token.as_bytes().to_vec();
    }
    out
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the rest for 256 + n.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        out[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("a valid char")
        };
    }
    out
}

/// What kind of character the pre-tokenizer's pattern sees.
#[derive(Clone, Copy, PartialEq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

/// `\p{L}`, `\p{N}`, `\s` and the rest (Rust's alphabetic and numeric properties stand in
/// for the general categories; they agree outside combining marks and letter numbers).
fn class(c: char) -> Class {
    if c.is_whitespace() {
        Class::Space
    } else if c.is_numeric() {
        Class::Number
    } else if c.is_alphabetic() {
        Class::Letter
    } else {
        Class::Other
    }
}

/// The pieces of GPT-2's pattern, in its order of alternatives:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn pre_tokenize(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |i: usize| chars.get(i).map_or(text.len(), |(at, _)| *at);
    let run = |from: usize, k: Class| {
        let mut j = from;
        while j < chars.len() && class(chars[j].1) == k {
            j += 1;
        }
        j
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let rest = &text[chars[i].0..];
        let contraction = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
            .iter()
            .find(|c| rest.starts_with(**c));
        let next = if let Some(c) = contraction {
            i + c.chars().count()
        } else {
            // ` ?` then a run of one class (letters, numbers or other).
            let start = if chars[i].1 == ' ' { i + 1 } else { i };
            match chars.get(start).map(|(_, c)| class(*c)) {
                Some(k) if k != Class::Space => run(start, k),
                _ => {
                    // Whitespace: all of it when it ends the text or a lone one precedes a
                    // non-space; else all but its last character, which joins the next piece.
                    let j = run(i, Class::Space);
                    if j < chars.len() && j - i > 1 {
                        j - 1
                    } else {
                        j
                    }
                }
            }
        };
        out.push(&text[chars[i].0..end_of(next)]);
        i = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_splits_as_gpt2s() {
        assert_eq!(pre_tokenize("Hello world"), ["Hello", " world"]);
        assert_eq!(
            pre_tokenize("it's  a\n\nb "),
            ["it", "'s", " ", " a", "\n", "\n", "b", " "]
        );
        assert_eq!(pre_tokenize("{\"a\": 12}"), ["{\"", "a", "\":", " 12", "}"]);
        assert_eq!(pre_tokenize("x\n  y"), ["x", "\n ", " y"]);
    }
}
