//! Named API keys (docs/keys.md): `API_KEYS` entries `name=key` (a bare key is named by the
//! gateway from a hash of it) and the API_KEYS_FILE format — one key per line with its name, the
//! key in plain text or as `sha256:<hex>`, and its own settings (weight, priority, quotas). Pure:
//! the gateway reads the file, at start and on every reload, and hands its text here.

use crate::secret::Secret;

/// The longest key name (it is a metric label and a log field).
const MAX_NAME: usize = 64;

/// One `API_KEYS` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    /// `name=` before the key; `None` for a bare key.
    pub name: Option<String>,
    pub key: Secret,
}

impl ApiKey {
    /// An entry as written: `name=key` when what comes before the first `=` is a valid name and
    /// something follows it, else the whole entry is the key (a base64 key's `=` padding ends
    /// it, so such a key stays whole).
    pub fn parse(entry: &str) -> ApiKey {
        let entry = entry.trim();
        match entry.split_once('=') {
            Some((name, key)) if valid_name(name) && !key.trim().is_empty() => ApiKey {
                name: Some(name.to_owned()),
                key: Secret::new(key.trim()),
            },
            _ => ApiKey {
                name: None,
                key: Secret::new(entry),
            },
        }
    }
}

/// A key name: 1 to 64 of ASCII letters, digits, `.`, `_`, `-`.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// How a file's key is known.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyText {
    Plain(Secret),
    /// `sha256:<64 hex digits>`: the key's SHA-256, so the file need not hold the key.
    Sha256([u8; 32]),
}

impl std::fmt::Debug for KeyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyText::Plain(_) => f.write_str("Plain(<redacted>)"),
            KeyText::Sha256(_) => f.write_str("Sha256(<redacted>)"),
        }
    }
}

/// A key's own settings; `None` takes the gateway's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySettings {
    /// Its share of the fair queue.
    pub weight: Option<u32>,
    /// Its priority class under SCHEDULING_POLICY=priority: its requests never go sooner.
    pub priority: Option<i64>,
    /// KEY_TOKENS_PER_MINUTE for this key (0: none).
    pub tokens_per_minute: Option<u64>,
    /// KEY_TOKENS_PER_DAY for this key (0: none).
    pub tokens_per_day: Option<u64>,
    /// KEY_MAX_SEQUENCES for this key (0: none).
    pub max_sequences: Option<u32>,
    /// The models it may use (MODELS), by served name or profile; `None`: every model.
    pub models: Option<Vec<String>>,
    /// Its requests' class for INTERACTIVE_RESERVE; `None`: by each prompt's size.
    pub class: Option<RequestClass>,
}

/// A key's class for the interactive reserve (docs/keys.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Never held back, whatever its prompt's size.
    Interactive,
    /// Always held back from the reserved slots, whatever its prompt's size.
    Batch,
}

/// One line of API_KEYS_FILE.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyEntry {
    pub name: String,
    pub key: KeyText,
    pub settings: KeySettings,
}

/// What is wrong with a keys file: each problem with its line (a key is never quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("API_KEYS_FILE: {}", .0.join("; "))]
pub struct KeysFileError(pub Vec<String>);

/// How a setting's value is read into the settings.
type SetFn = fn(&mut KeySettings, &str) -> Result<(), String>;

/// The settings a line may give, each with how its value is read.
const SETTINGS: [(&str, SetFn); 7] = [
    ("weight", |s, v| {
        s.weight = Some(bounded(v, 1, 1000)? as u32);
        Ok(())
    }),
    ("priority", |s, v| {
        s.priority = Some(v.parse().map_err(|_| "must be an integer".to_owned())?);
        Ok(())
    }),
    ("tokens_per_minute", |s, v| {
        s.tokens_per_minute = Some(bounded(v, 0, u64::MAX >> 8)?);
        Ok(())
    }),
    ("tokens_per_day", |s, v| {
        s.tokens_per_day = Some(bounded(v, 0, u64::MAX >> 8)?);
        Ok(())
    }),
    ("max_sequences", |s, v| {
        s.max_sequences = Some(bounded(v, 0, 1_000_000)? as u32);
        Ok(())
    }),
    ("models", |s, v| {
        let names: Vec<String> = v
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect();
        if names.is_empty() {
            return Err("must name at least one model (served names or profiles, comma-separated)".to_owned());
        }
        s.models = Some(names);
        Ok(())
    }),
    ("class", |s, v| {
        s.class = Some(match v {
            "interactive" => RequestClass::Interactive,
            "batch" => RequestClass::Batch,
            _ => return Err("must be interactive or batch".to_owned()),
        });
        Ok(())
    }),
];

fn bounded(v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer from {lo} to {hi}")),
    }
}

/// Parses API_KEYS_FILE: `name key [setting=value …]` per line, `#` comments and blank lines
/// skipped. Names and keys must be unique.
pub fn parse_keys_file(text: &str) -> Result<Vec<KeyEntry>, KeysFileError> {
    let mut entries: Vec<KeyEntry> = Vec::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split_once('#').map_or(line, |(l, _)| l).trim();
        if line.is_empty() {
            continue;
        }
        match entry(line) {
            Ok(e) if entries.iter().any(|o| o.name == e.name) => {
                problems.push(format!("line {}: the name {} is used twice", i + 1, e.name));
            }
            Ok(e) if entries.iter().any(|o| o.key == e.key) => {
                problems.push(format!("line {}: its key is also another line's", i + 1));
            }
            Ok(e) => entries.push(e),
            Err(why) => problems.push(format!("line {}: {why}", i + 1)),
        }
    }
    if problems.is_empty() {
        Ok(entries)
    } else {
        Err(KeysFileError(problems))
    }
}

fn entry(line: &str) -> Result<KeyEntry, String> {
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or_default();
    if !valid_name(name) {
        return Err(format!(
            "`{}` is not a key name (1 to {MAX_NAME} letters, digits, `.`, `_`, `-`)",
            name.chars().take(MAX_NAME).collect::<String>()
        ));
    }
    let key = match words.next() {
        None => return Err(format!("{name} has no key after its name")),
        Some(k) => match k.strip_prefix("sha256:") {
            Some(hex) => KeyText::Sha256(
                digest(hex).ok_or_else(|| format!("{name}: sha256: must be followed by 64 hex digits"))?,
            ),
            None => KeyText::Plain(Secret::new(k)),
        },
    };
    let mut settings = KeySettings::default();
    for word in words {
        let Some((setting, value)) = word.split_once('=') else {
            return Err(format!("{name}: `{word}` is not setting=value"));
        };
        let Some((_, set)) = SETTINGS.iter().find(|(n, _)| *n == setting) else {
            let known: Vec<&str> = SETTINGS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "{name}: unknown setting {setting} (one of {})",
                known.join(", ")
            ));
        };
        set(&mut settings, value).map_err(|why| format!("{name}: {setting} {why}"))?;
    }
    Ok(KeyEntry {
        name: name.to_owned(),
        key,
        settings,
    })
}

fn digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_named_when_a_valid_name_comes_before_its_first_equals_sign() {
        let named = ApiKey::parse(" alice=sk-123 ");
        assert_eq!(named.name.as_deref(), Some("alice"));
        assert_eq!(named.key.expose(), "sk-123");
        for bare in ["sk-123", "c2stMTIz=", "a b=c", "=sk"] {
            let k = ApiKey::parse(bare);
            assert_eq!(k.name, None, "{bare}");
            assert_eq!(k.key.expose(), bare.trim());
        }
    }

    #[test]
    fn a_keys_file_gives_names_keys_and_settings_and_names_each_problem_by_line() {
        let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let text = format!(
            "# team keys\nalice sk-alice weight=4 tokens_per_minute=2000 max_sequences=2\n\nci sha256:{hash} priority=5 tokens_per_day=0 # batch\n"
        );
        let entries = parse_keys_file(&text).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, "alice");
        assert_eq!(entries[0].key, KeyText::Plain(Secret::new("sk-alice")));
        assert_eq!(entries[0].settings.weight, Some(4));
        assert_eq!(entries[0].settings.tokens_per_minute, Some(2000));
        assert_eq!(entries[0].settings.max_sequences, Some(2));
        assert_eq!(entries[1].settings.priority, Some(5));
        assert_eq!(entries[1].settings.tokens_per_day, Some(0));
        assert!(matches!(entries[1].key, KeyText::Sha256(d) if d[0] == 0x9f && d[31] == 0x08));
        let bad = "alice sk-secret-1\nbob\nbob sk-2 speed=3\ncarol sha256:12\nalice sk-3\ndave sk-secret-1\nerin sk-4 weight=0\n";
        let err = parse_keys_file(bad).unwrap_err();
        assert_eq!(err.0.len(), 6, "{err}");
        assert!(err.0[0].starts_with("line 2: bob has no key"), "{err}");
        assert!(err.0[1].contains("unknown setting speed"), "{err}");
        assert!(err.0[2].contains("64 hex digits"), "{err}");
        assert_eq!(err.0[3], "line 5: the name alice is used twice");
        assert_eq!(err.0[4], "line 6: its key is also another line's");
        assert!(err.0[5].starts_with("line 7: erin: weight must be"), "{err}");
        assert!(!err.to_string().contains("sk-secret"), "a key is never quoted: {err}");
    }
}
