//! Where a configuration value came from; every resolved value carries one.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::profile::ProfileId;

/// The layer that supplied a value. Precedence, highest first: command line, process
/// environment, `.env` file, the demo's defaults (`sparkgate demo`), profile default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Source {
    CommandLine,
    Process,
    EnvFile {
        path: PathBuf,
        line: usize,
    },
    /// What `sparkgate demo` runs unless a higher layer says otherwise.
    Demo,
    Profile {
        profile: ProfileId,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::CommandLine => f.write_str("command line"),
            Source::Process => f.write_str("process environment"),
            Source::EnvFile { path, line } => write!(f, "env file {}:{line}", path.display()),
            Source::Demo => f.write_str("demo default"),
            Source::Profile { profile } => write!(f, "{profile} profile default"),
        }
    }
}
