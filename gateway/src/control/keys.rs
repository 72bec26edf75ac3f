//! The API keys the gateway accepts (docs/keys.md): API_KEYS (`name=key` or a bare key) and
//! API_KEYS_FILE (named keys, plain or as SHA-256, with their own weight, priority class and
//! quotas), known by their SHA-256 and compared in constant time. The file is read again on
//! SIGHUP and when it changes: the new set replaces the old one whole, a file that does not
//! parse leaves the old one in place. Only a key's name leaves this module.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use sha2::Digest as _;
use sparkgate_config::{parse_keys_file, ApiKey, KeyEntry, KeySettings, KeyText, Secret};

/// A validated key as the rest of the gateway knows it: its name and settings, and its digest
/// (the owner of what its requests store), never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyInfo {
    pub(crate) name: Arc<str>,
    pub(crate) settings: KeySettings,
    /// SHA-256 of the key.
    digest: [u8; 32],
}

impl KeyInfo {
    /// The owner of the responses its requests store: the key's SHA-256 in hex.
    pub(crate) fn owner(&self) -> String {
        hex(&self.digest)
    }

    #[cfg(test)]
    pub(crate) fn named(name: &str) -> KeyInfo {
        KeyInfo {
            name: name.into(),
            settings: KeySettings::default(),
            digest: sha256(name),
        }
    }
}

/// A key's (or token's, or session id's) SHA-256: what is kept and compared instead of it.
pub(crate) fn sha256(key: &str) -> [u8; 32] {
    sha2::Sha256::digest(key.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The name of a bare key: `key-` and the first 8 hex digits of its SHA-256.
pub(crate) fn derived_name(key: &str) -> String {
    format!("key-{}", &hex(&sha256(key))[..8])
}

/// Where the keys come from, kept to read the file again.
#[derive(Debug)]
struct Sources {
    api_keys: Vec<ApiKey>,
    file: Option<PathBuf>,
    /// CLIENT_WEIGHTS: a weight for a key named (by its name or, as before names, its text)
    /// there, when its file line gives none.
    weights: Vec<(Secret, u32)>,
}

/// Why a set of keys could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeysError {
    #[error("API_KEYS_FILE {path}: {reason}")]
    Read { path: String, reason: String },
    #[error(transparent)]
    File(#[from] sparkgate_config::KeysFileError),
    #[error("the key name {0} is given twice (API_KEYS and API_KEYS_FILE)")]
    Twice(String),
}

/// The accepted keys, replaced whole on reload.
#[derive(Debug)]
pub(crate) struct KeyRing {
    keys: RwLock<Arc<Vec<KeyInfo>>>,
    sources: Sources,
    /// Keys were configured: requests need one even if a reload leaves the set empty.
    required: bool,
    /// The file's modification time and length when last read.
    seen: std::sync::Mutex<Option<(std::time::SystemTime, u64)>>,
}

impl KeyRing {
    pub(crate) fn new(config: &sparkgate_config::Config) -> Result<KeyRing, KeysError> {
        let sources = Sources {
            api_keys: config.secrets.api_keys.clone(),
            file: config.gateway.tenancy.keys_file.clone(),
            weights: config.gateway.client_weights.clone(),
        };
        let required = !sources.api_keys.is_empty() || sources.file.is_some();
        let ring = KeyRing {
            keys: RwLock::new(Arc::default()),
            sources,
            required,
            seen: std::sync::Mutex::new(None),
        };
        ring.reload()?;
        Ok(ring)
    }

    /// No keys: every request is let in (tests of other steps).
    #[cfg(test)]
    pub(crate) fn none() -> KeyRing {
        KeyRing {
            keys: RwLock::new(Arc::default()),
            sources: Sources {
                api_keys: Vec::new(),
                file: None,
                weights: Vec::new(),
            },
            required: false,
            seen: std::sync::Mutex::new(None),
        }
    }

    /// Whether requests must present a key.
    pub(crate) fn required(&self) -> bool {
        self.required
    }

    /// Every name, in order (status).
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.current().iter().map(|k| k.name.clone()).collect()
    }

    /// Every key as the gateway knows it (names and settings; never a key).
    pub(crate) fn infos(&self) -> Arc<Vec<KeyInfo>> {
        self.current()
    }

    fn current(&self) -> Arc<Vec<KeyInfo>> {
        self.keys.read().expect("keys lock").clone()
    }

    /// The key `presented` is, compared with every key's digest in constant time (the time
    /// taken says neither which key matched nor where a guess first differs).
    pub(crate) fn find(&self, presented: &str) -> Option<KeyInfo> {
        use subtle::{ConditionallySelectable as _, ConstantTimeEq as _};
        let digest = sha256(presented);
        let keys = self.current();
        let mut found = subtle::Choice::from(0);
        let mut at = 0u32;
        for (i, k) in keys.iter().enumerate() {
            let hit = k.digest.ct_eq(&digest);
            at.conditional_assign(&(i as u32), hit);
            found |= hit;
        }
        bool::from(found).then(|| keys[at as usize].clone())
    }

    /// Reads the keys again (API_KEYS as started, the file as it is now); how many there are.
    pub(crate) fn reload(&self) -> Result<usize, KeysError> {
        let seen = self.sources.file.as_ref().and_then(|f| stamp(f));
        let keys = self.build()?;
        let n = keys.len();
        *self.keys.write().expect("keys lock") = Arc::new(keys);
        *self.seen.lock().expect("keys stamp") = seen;
        Ok(n)
    }

    /// Whether the file changed since it was last read (its time or length).
    pub(crate) fn file_changed(&self) -> bool {
        let Some(file) = &self.sources.file else { return false };
        stamp(file) != *self.seen.lock().expect("keys stamp")
    }

    fn build(&self) -> Result<Vec<KeyInfo>, KeysError> {
        let mut keys: Vec<KeyInfo> = self
            .sources
            .api_keys
            .iter()
            .map(|k| KeyInfo {
                name: k.name.clone().unwrap_or_else(|| derived_name(k.key.expose())).into(),
                settings: KeySettings {
                    weight: self.weight_of(k.name.as_deref(), Some(k.key.expose())),
                    ..KeySettings::default()
                },
                digest: sha256(k.key.expose()),
            })
            .collect();
        if let Some(path) = &self.sources.file {
            let text = std::fs::read_to_string(path).map_err(|e| KeysError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            for entry in parse_keys_file(&text)? {
                let info = self.of_entry(entry);
                if keys.iter().any(|k| k.name == info.name) {
                    return Err(KeysError::Twice(info.name.to_string()));
                }
                keys.push(info);
            }
        }
        Ok(keys)
    }

    fn of_entry(&self, entry: KeyEntry) -> KeyInfo {
        let (digest, plain) = match &entry.key {
            KeyText::Plain(k) => (sha256(k.expose()), Some(k.expose())),
            KeyText::Sha256(d) => (*d, None),
        };
        let mut settings = entry.settings;
        settings.weight = settings.weight.or(self.weight_of(Some(&entry.name), plain));
        KeyInfo {
            name: entry.name.into(),
            settings,
            digest,
        }
    }

    fn weight_of(&self, name: Option<&str>, key: Option<&str>) -> Option<u32> {
        self.sources
            .weights
            .iter()
            .find(|(c, _)| Some(c.expose()) == name || Some(c.expose()) == key)
            .map(|(_, w)| *w)
    }
}

fn stamp(path: &std::path::Path) -> Option<(std::time::SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(api_keys: &[&str], file: Option<&std::path::Path>) -> Result<KeyRing, KeysError> {
        let sources = Sources {
            api_keys: api_keys.iter().map(|k| ApiKey::parse(k)).collect(),
            file: file.map(ToOwned::to_owned),
            weights: vec![(Secret::new("bare-key"), 3)],
        };
        let ring = KeyRing {
            keys: RwLock::new(Arc::default()),
            required: true,
            sources,
            seen: std::sync::Mutex::new(None),
        };
        ring.reload().map(|_| ring)
    }

    #[test]
    fn keys_are_found_by_name_from_either_source_and_a_bare_key_is_named_by_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        let hashed = hex(&sha256("sk-ci"));
        std::fs::write(
            &file,
            format!("alice sk-alice weight=4\nci sha256:{hashed} tokens_per_minute=100\n"),
        )
        .unwrap();
        let ring = ring(&["bob=sk-bob", "bare-key"], Some(&file)).unwrap();
        assert_eq!(ring.find("sk-bob").unwrap().name.as_ref(), "bob");
        let bare = ring.find("bare-key").unwrap();
        assert_eq!(bare.name.as_ref(), derived_name("bare-key"));
        assert!(bare.name.starts_with("key-") && bare.name.len() == 12);
        assert_eq!(
            bare.settings.weight,
            Some(3),
            "CLIENT_WEIGHTS may name a bare key by its text"
        );
        assert_eq!(ring.find("sk-alice").unwrap().settings.weight, Some(4));
        let ci = ring.find("sk-ci").unwrap();
        assert_eq!((ci.name.as_ref(), ci.settings.tokens_per_minute), ("ci", Some(100)));
        assert_eq!(ci.owner(), hashed);
        assert_eq!(ring.find("sk-nope"), None);
        assert_eq!(ring.find(""), None);
        assert!(!format!("{ring:?}").contains("sk-"), "{ring:?}");
    }

    #[test]
    fn a_reload_replaces_the_set_and_a_broken_file_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "alice sk-alice\n").unwrap();
        let keys = ring(&[], Some(&file)).unwrap();
        assert!(!keys.file_changed());
        std::fs::write(&file, "alice sk-alice-2\nbob sk-bob\n").unwrap();
        assert!(keys.file_changed());
        assert_eq!(keys.reload().unwrap(), 2);
        assert_eq!(keys.find("sk-alice"), None, "the old key is gone");
        assert_eq!(keys.find("sk-alice-2").unwrap().name.as_ref(), "alice");
        std::fs::write(&file, "alice\n").unwrap();
        assert!(matches!(keys.reload(), Err(KeysError::File(_))));
        assert_eq!(keys.names().len(), 2, "the old set stays");
        std::fs::write(&file, "bob sk-other\n").unwrap();
        assert!(ring(&["bob=sk-bob"], Some(&file)).is_err(), "a name in both sources");
    }
}
