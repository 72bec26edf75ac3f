//! Files of `[name]` sections of env lines (GROUPS_FILE, MODELS_FILE), each section the highest
//! layer of one group's configuration, and the group configuration a deployment is made of.

use std::path::Path;

use crate::config::{Config, LoadOptions};
use crate::dotenv::{Assignment, DotEnv};
use crate::error::{ConfigError, InvalidValue};
use crate::source::Source;

/// One rank group: its name (the section's) and its whole configuration.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub name: String,
    pub config: Config,
}

/// The name of the one group of a configuration without GROUPS_FILE.
pub const SINGLE_GROUP: &str = "main";

/// The file's `[name]` sections, each parsed as an env file with the file's own line numbers.
pub(crate) fn sections(
    path: &Path,
    text: &str,
    process: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, usize, DotEnv)>, ConfigError> {
    let syntax = |line: usize, message: String| ConfigError::EnvFileSyntax {
        path: path.to_path_buf(),
        line,
        message,
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut heads: Vec<(usize, String)> = Vec::new();
    for (i, raw) in lines.iter().enumerate() {
        let t = raw.trim();
        let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else {
            let assignment = !t.is_empty() && !t.starts_with('#');
            if assignment && heads.is_empty() {
                return Err(syntax(i + 1, "a line before the first `[group]` section".into()));
            }
            continue;
        };
        // `.` for the MODELS_FILE sections, named by profile (`[deepseek-v4.1-flash]`).
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(syntax(
                i + 1,
                format!("`[{name}]`: a section name is letters, digits, ., - and _"),
            ));
        }
        if heads.iter().any(|(_, n)| n == name) {
            return Err(syntax(i + 1, format!("group `{name}` appears twice")));
        }
        heads.push((i, name.to_owned()));
    }
    if heads.is_empty() {
        return Err(syntax(
            1,
            "no `[group]` section: name each group as `[name]` above its lines".into(),
        ));
    }
    let mut out = Vec::new();
    for (k, (start, name)) in heads.iter().enumerate() {
        let end = heads.get(k + 1).map_or(lines.len(), |(s, _)| *s);
        // Blank lines outside the section keep the file's line numbers in messages.
        let mut body = "\n".repeat(start + 1);
        body.push_str(&lines[start + 1..end].join("\n"));
        out.push((name.clone(), start + 1, DotEnv::parse(path, &body, process)?));
    }
    Ok(out)
}

/// The file at `path` read as sections (`sections`), `$VAR`s from the process environment.
pub(crate) fn read(options: &LoadOptions, path: &Path) -> Result<Vec<(String, usize, DotEnv)>, ConfigError> {
    let process = |name: &str| options.process_env.get(name).cloned();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::EnvFileUnreadable {
        path: path.to_path_buf(),
        source,
    })?;
    sections(path, &text, &process)
}

/// Section `name`'s assignments that `why` refuses (its reason), each named by the section.
pub(crate) fn refused(name: &str, env: &DotEnv, why: impl Fn(&Assignment) -> Option<String>) -> Vec<InvalidValue> {
    env.assignments
        .iter()
        .filter_map(|a| {
            Some(InvalidValue {
                name: format!("[{name}] {}", a.key),
                value: a.value.clone(),
                source: Source::EnvFile {
                    path: env.path.clone(),
                    line: a.line,
                },
                rule: why(a)?,
            })
        })
        .collect()
}

/// Section `name`'s whole configuration (`env` the highest layer over `options`); its problems
/// go to `errors`, named by the section.
pub(crate) fn load(
    options: &LoadOptions,
    name: &str,
    env: &DotEnv,
    errors: &mut Vec<InvalidValue>,
) -> Result<Option<GroupConfig>, ConfigError> {
    match Config::load_in(options, Some(env)) {
        Ok(config) => Ok(Some(GroupConfig {
            name: name.to_owned(),
            config,
        })),
        Err(ConfigError::Invalid(list)) => {
            errors.extend(list.into_iter().map(|mut e| {
                e.name = format!("[{name}] {}", e.name);
                e
            }));
            Ok(None)
        }
        Err(other) => Err(other),
    }
}
