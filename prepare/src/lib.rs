//! Node preparation before the ranks start: the image on the head ([`image`]: present, pulled or
//! built with a recipe stamp) and on the worker ([`ship`]: stream or staged, compared by RootFS
//! layers); the weights — what a complete tree is per profile ([`weights::check`]), fetching what
//! is missing with the Hugging Face CLI ([`download`]), mirroring the trees with rsync
//! ([`sync::sync`]) or sharing them over NFS / ZFS ([`share`]); the Engram pack ([`pack`]).
//! Progress goes to a [`progress::Report`].

pub mod hf;
pub mod image;
pub mod progress;
pub mod share;
pub mod ship;
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
    #[error(transparent)]
    Docker(#[from] sparkgate_docker::DockerError),
    #[error("build context: {0}")]
    Recipe(String),
    #[error("building the image failed: {error}; log {log}, last lines:\n{tail}")]
    Build { error: String, log: String, tail: String },
    #[error("image {image} is not available: {why}")]
    NoImage { image: String, why: String },
    #[error("the worker has {free} free in {dir} but staged shipping needs {need} (tar ×2 + 5 GiB); free space there, set WORKER_IMAGE_SHIP_DIR to a larger disk, or IMAGE_SHIP=stream")]
    NoRoom { dir: String, need: String, free: String },
    #[error("{0}")]
    Local(String),
    #[error("`{command}` was cut ({status}: {detail}); run it again to resume from what arrived")]
    Interrupted {
        command: String,
        status: String,
        detail: String,
    },
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
