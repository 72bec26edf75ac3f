//! Node preparation before the ranks start. So far: the weights — what a complete tree is per
//! profile ([`weights::check`]), fetching what is missing with the Hugging Face CLI
//! ([`download`]) and mirroring the trees to the worker with rsync ([`sync::sync`]). Image
//! shipping, the self-check, the Engram pack and warm-up are still the launchers' job.

pub mod hf;
pub mod sync;
pub mod weights;

use std::process::Stdio;

use sparkgate_config::Config;

pub use hf::{locate, HfCli, Search};
pub use weights::{check, Fetch, Tree};

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("HF_BIN={0} is not an executable file; set it to the Hugging Face CLI (hf) or leave it empty to search")]
    HfBinUnusable(String),
    #[error("no Hugging Face CLI found (searched: {}); install it with `pip install -U huggingface_hub[cli]` or set HF_BIN", .0.join(", "))]
    NoHfCli(Vec<String>),
    #[error("`{command}` could not start: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("`{command}` failed ({status}); run it again to resume — the Hugging Face CLI keeps what it fetched")]
    Failed { command: String, status: String },
    #[error("{target}: {detail}")]
    Remote { target: String, detail: String },
    #[error("{target}:{dest} is not writable over SSH; fix it on the worker: {fix}")]
    NotWritable { target: String, dest: String, fix: String },
    #[error("the {tree} weights are still incomplete after downloading: {}", .missing.join("; "))]
    StillIncomplete { tree: String, missing: Vec<String> },
}

/// What [`download`] did for one tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    AlreadyComplete,
    Downloaded { command: String },
}

/// Fetches every incomplete tree with `cli` (its own progress on the terminal), then checks again.
/// Complete trees run nothing.
pub fn download(config: &Config, cli: &HfCli, token: Option<&str>) -> Result<Vec<(Tree, Fetched)>, PrepareError> {
    let mut done = Vec::new();
    for tree in weights::check(config) {
        if tree.complete() {
            done.push((tree, Fetched::AlreadyComplete));
            continue;
        }
        let command = cli.describe(&tree.fetch);
        let mut cmd = cli.download(&tree.fetch);
        if let Some(t) = token {
            cmd.env("HF_TOKEN", t);
        }
        let status = cmd
            .stdin(Stdio::null())
            .status()
            .map_err(|source| PrepareError::Spawn {
                command: command.clone(),
                source,
            })?;
        if !status.success() {
            return Err(PrepareError::Failed {
                command,
                status: status.to_string(),
            });
        }
        done.push((tree, Fetched::Downloaded { command }));
    }
    for tree in weights::check(config) {
        if !tree.complete() {
            return Err(PrepareError::StillIncomplete {
                tree: tree.name.to_owned(),
                missing: tree.missing,
            });
        }
    }
    Ok(done)
}
