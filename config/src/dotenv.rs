//! Reads a launcher-style `.env` file: the subset of bash assignment syntax the reference
//! launchers' `.env.example` files use (`KEY=value`, `export`, quotes, `#` comments, `$VAR`).

use std::path::{Path, PathBuf};

use crate::error::ConfigError;

/// One assignment, with the line it came from so errors and `sparkgate config` can point at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assignment {
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) line: usize,
}

/// A parsed `.env` file. Later assignments of the same key win, as when bash sources the file.
#[derive(Debug, Clone, Default)]
pub(crate) struct DotEnv {
    pub(crate) path: PathBuf,
    pub(crate) assignments: Vec<Assignment>,
}

impl DotEnv {
    /// No assignment, as if read from `path`.
    pub(crate) fn empty(path: PathBuf) -> Self {
        Self {
            path,
            assignments: Vec::new(),
        }
    }

    pub(crate) fn read(path: &Path, process: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::EnvFileUnreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text, process)
    }

    /// Parses `text`; `$VAR` expands to an earlier assignment in the file, else to `process`.
    pub(crate) fn parse(
        path: &Path,
        text: &str,
        process: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut env = DotEnv {
            path: path.to_path_buf(),
            assignments: Vec::new(),
        };
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let syntax = |message: String| ConfigError::EnvFileSyntax {
                path: path.to_path_buf(),
                line,
                message,
            };
            let trimmed = raw.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let trimmed = trimmed.strip_prefix("export ").map(str::trim_start).unwrap_or(trimmed);
            let Some((key, rest)) = trimmed.split_once('=') else {
                return Err(syntax(format!("expected KEY=value, found `{}`", raw.trim())));
            };
            if !is_identifier(key) {
                return Err(syntax(format!("`{key}` is not a valid variable name")));
            }
            let lookup = |name: &str| env.get(name).map(str::to_owned).or_else(|| process(name));
            let value = parse_value(rest, &lookup).map_err(syntax)?;
            env.assignments.push(Assignment {
                key: key.to_owned(),
                value,
                line,
            });
        }
        Ok(env)
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.find(key).map(|a| a.value.as_str())
    }

    pub(crate) fn find(&self, key: &str) -> Option<&Assignment> {
        self.assignments.iter().rev().find(|a| a.key == key)
    }
}

pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Parses the right-hand side of an assignment the way bash would for the supported subset.
fn parse_value(rest: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => loop {
                match chars.next() {
                    Some('\'') => break,
                    Some(c) => out.push(c),
                    None => return Err("unterminated single quote".into()),
                }
            },
            '"' => loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('"' | '\\' | '$' | '`')) => out.push(c),
                        Some(c) => {
                            out.push('\\');
                            out.push(c);
                        }
                        None => return Err("unterminated double quote".into()),
                    },
                    Some('$') => expand(&mut chars, &mut out, lookup)?,
                    Some('`') => return Err("command substitution is not supported".into()),
                    Some(c) => out.push(c),
                    None => return Err("unterminated double quote".into()),
                }
            },
            '\\' => match chars.next() {
                Some(c) => out.push(c),
                None => return Err("trailing backslash (line continuation is not supported)".into()),
            },
            '$' => expand(&mut chars, &mut out, lookup)?,
            '`' => return Err("command substitution is not supported".into()),
            c if c.is_whitespace() => {
                let tail: String = chars.collect();
                let tail = tail.trim_start();
                if tail.is_empty() || tail.starts_with('#') {
                    break;
                }
                return Err(format!(
                    "unquoted whitespace in value (quote the value): `{}`",
                    rest.trim()
                ));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Expands what follows a `$`: `NAME`, `{NAME}`, `{NAME:-default}` or `{NAME-default}`.
fn expand(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    out: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    match chars.peek() {
        Some('(') => Err("command substitution is not supported".into()),
        Some('{') => {
            chars.next();
            let mut body = String::new();
            loop {
                match chars.next() {
                    Some('}') => break,
                    Some(c) => body.push(c),
                    None => return Err("unterminated ${…}".into()),
                }
            }
            let (name, fallback, empty_is_unset) = if let Some((n, d)) = body.split_once(":-") {
                (n, Some(d), true)
            } else if let Some((n, d)) = body.split_once('-') {
                (n, Some(d), false)
            } else {
                (body.as_str(), None, false)
            };
            if !is_identifier(name) {
                return Err(format!("unsupported expansion `${{{body}}}`"));
            }
            let value = lookup(name);
            match (value, fallback) {
                (Some(v), Some(d)) if v.is_empty() && empty_is_unset => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {}
            }
            Ok(())
        }
        Some(c) if *c == '_' || c.is_ascii_alphabetic() => {
            let mut name = String::new();
            while let Some(&c) = chars.peek() {
                if c == '_' || c.is_ascii_alphanumeric() {
                    name.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push_str(&lookup(&name).unwrap_or_default());
            Ok(())
        }
        _ => {
            out.push('$');
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DotEnv, ConfigError> {
        let process = |name: &str| (name == "HOME").then(|| "/home/op".to_owned());
        DotEnv::parse(Path::new("/x/.env"), text, &process)
    }

    #[test]
    fn launcher_syntax_subset() {
        let env = parse(
            "# comment\n\
             HEAD_IP=10.0.0.1\n\
             export WORKER_USER=zurih   # trailing comment\n\
             LIMIT_MM='{\"image\":100}'\n\
             EXTRA_ARGS=\"--foo \\\"bar\\\" \\$x\"\n\
             CACHE_ROOT=$HOME/.cache/x\n\
             NESTED=${CACHE_ROOT}/triton\n\
             DEF=${UNSET:-fallback}\n\
             EMPTY=\n\
             HEAD_IP=10.0.0.9\n",
        )
        .unwrap();
        assert_eq!(env.get("HEAD_IP"), Some("10.0.0.9"), "later assignment wins");
        assert_eq!(env.find("HEAD_IP").unwrap().line, 10);
        assert_eq!(env.get("WORKER_USER"), Some("zurih"));
        assert_eq!(env.get("LIMIT_MM"), Some("{\"image\":100}"));
        assert_eq!(env.get("EXTRA_ARGS"), Some("--foo \"bar\" $x"));
        assert_eq!(env.get("CACHE_ROOT"), Some("/home/op/.cache/x"));
        assert_eq!(env.get("NESTED"), Some("/home/op/.cache/x/triton"));
        assert_eq!(env.get("DEF"), Some("fallback"));
        assert_eq!(env.get("EMPTY"), Some(""));
        assert_eq!(env.get("MISSING"), None);
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        for (text, needle) in [
            ("A=1\nB='open\n", "unterminated single quote"),
            ("A=1\nnot an assignment\n", "expected KEY=value"),
            ("A=1\n1BAD=2\n", "not a valid variable name"),
            ("A=1\nB=$(hostname)\n", "command substitution"),
            ("A=1\nB=two words\n", "unquoted whitespace"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains("/x/.env:2"), "{err}");
            assert!(err.contains(needle), "{err}");
        }
    }
}
