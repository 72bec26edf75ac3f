//! Errors of configuration loading; every message names the variable, its value and its source.

use std::fmt;
use std::path::PathBuf;

use crate::source::Source;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read env file {path}: {source}")]
    EnvFileUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    EnvFileSyntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}", InvalidList(.0))]
    Invalid(Vec<InvalidValue>),
}

/// One variable whose value breaks a rule.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidValue {
    pub name: String,
    pub value: String,
    pub source: Source,
    /// What the value must be, e.g. "must be an integer between 1 and 4096".
    pub rule: String,
}

impl fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} (from {}): {}",
            self.name, self.value, self.source, self.rule
        )
    }
}

struct InvalidList<'a>(&'a [InvalidValue]);

impl fmt::Display for InvalidList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "invalid configuration ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for invalid in self.0 {
            write!(f, "\n  {invalid}")?;
        }
        Ok(())
    }
}
