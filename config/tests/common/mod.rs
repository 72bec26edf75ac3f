//! Helpers for the config crate's tests: load a `Config` from an env text and an environment.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use sparkgate_config::{Config, ConfigError, LoadOptions};

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub env_file: Option<PathBuf>,
    pub process: BTreeMap<String, String>,
}

impl Fixture {
    /// A deployment directory holding `.env` with `text` (None: no env file at all).
    pub fn new(text: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let env_file = text.map(|t| {
            let path = dir.path().join(".env");
            std::fs::write(&path, t).expect("write .env");
            path
        });
        let process = BTreeMap::from([
            ("HOME".to_owned(), "/home/op".to_owned()),
            ("USER".to_owned(), "op".to_owned()),
        ]);
        Self { dir, env_file, process }
    }

    pub fn from_file(name: &str) -> Self {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        Self::new(Some(&std::fs::read_to_string(path).expect("fixture")))
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.process.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            env_file: self.env_file.clone(),
            profile: None,
            overrides: Default::default(),
            demo: Default::default(),
            process_env: self.process.clone(),
            working_dir: self.dir.path().to_path_buf(),
        }
    }

    pub fn load(&self) -> Result<Config, ConfigError> {
        Config::load(&self.options())
    }

    /// The config with one more process variable, from the same deployment directory.
    pub fn with(&self, key: &str, value: &str) -> Config {
        let mut options = self.options();
        options.process_env.insert(key.to_owned(), value.to_owned());
        Config::load(&options).unwrap_or_else(|e| panic!("config should load: {e}"))
    }

    pub fn config(&self) -> Config {
        self.load().unwrap_or_else(|e| panic!("config should load: {e}"))
    }
}

/// Groups an argv after `serve MODEL` into `--flag [values…]` options, sorted, so two command
/// lines compare equal when they differ only in option order (which vLLM ignores).
pub fn options(argv: &[String]) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    for a in &argv[2..] {
        if a.starts_with("--") {
            groups.push(vec![a.clone()]);
        } else {
            groups
                .last_mut()
                .expect("argv after the model starts with a flag")
                .push(a.clone());
        }
    }
    groups.sort();
    groups
}

pub fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}
