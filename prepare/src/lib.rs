//! Node preparation before the ranks start: the image on the head ([`image`]: present, pulled or
//! built with a recipe stamp) and on the worker ([`ship`]: stream or staged, compared by RootFS
//! layers); the weights — what a complete tree is per profile ([`weights::check`]), fetching what
//! is missing with the Hugging Face CLI ([`download`]), mirroring the trees with rsync
//! ([`sync::sync`]) or sharing them over NFS / ZFS ([`share`]); the Engram pack ([`pack`]).
//! Progress goes to a [`progress::Report`].

pub mod hf;
pub mod image;
pub mod pack;
pub mod progress;
pub mod recipe;
pub mod share;
pub mod ship;
mod staging;
pub mod sync;
pub mod verify;
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
    #[error("the {node} has {free} free in {dir} but {what} needs {need} there; {fix}")]
    NoRoom {
        node: &'static str,
        dir: String,
        need: String,
        free: String,
        what: &'static str,
        fix: &'static str,
    },
    #[error("{0}")]
    SelfCheck(String),
    #[error("{0}")]
    Local(String),
    #[error("the head's weights are incomplete and AUTO_DOWNLOAD=0: {}; run `sparkgate download`, or set SKIP_DOWNLOAD=1 if the weights are managed elsewhere", .0.join(" | "))]
    WeightsIncomplete(Vec<String>),
    #[error("`{command}` was cut ({status}: {detail}); run it again to resume from what arrived")]
    Interrupted {
        command: String,
        status: String,
        detail: String,
    },
}

/// Runs `cmd` (described as `command` in errors) with its output on the terminal; an error
/// unless it exits 0.
fn run_to_success(cmd: &mut std::process::Command, command: &str) -> Result<(), PrepareError> {
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .map_err(|source| PrepareError::Spawn {
            command: command.to_owned(),
            source,
        })?;
    if !status.success() {
        return Err(PrepareError::Failed {
            command: command.to_owned(),
            status: status.to_string(),
        });
    }
    Ok(())
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
        run_to_success(&mut cmd, &command)?;
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

/// What the nodes need before the first start with RUNTIME=docker, in order: the head's weights
/// complete (downloaded when AUTO_DOWNLOAD=1; SKIP_DOWNLOAD=1 skips), IMAGE on the head (present,
/// pulled or built), then for each worker on another machine, in rank order: the same image
/// (shipped unless SKIP_SHIP=1) and its weights (WEIGHT_SYNC: rsync by marker, nfs volumes;
/// SKIP_SYNC=1 skips). Each step is a no-op when its work is done already, so a second start
/// costs a few round trips.
pub async fn for_start(
    config: &Config,
    head: &sparkgate_docker::Node,
    remotes: &[verify::Remote],
    report: &dyn progress::Report,
) -> Result<(), PrepareError> {
    if !config.preparation.skip_download {
        weights_gate(config, report).await?;
    }
    let id = image::ensure_on_head(config, head, report).await?;
    for remote in remotes {
        if remotes.len() > 1 {
            report.line(&format!("{} ({}):", remote.worker.label, remote.worker.ssh));
        }
        ship::ship(config, head, &remote.node, &remote.worker, &id, report).await?;
        if !config.preparation.skip_sync {
            worker_weights(config, remote, report).await?;
        }
    }
    Ok(())
}

/// One worker's weights as WEIGHT_SYNC says: rsync by marker, or its NFS volumes.
async fn worker_weights(
    config: &Config,
    remote: &verify::Remote,
    report: &dyn progress::Report,
) -> Result<(), PrepareError> {
    match config.storage.weight_sync {
        sparkgate_config::WeightSync::Rsync => {
            for plan in sync::plans(config, &remote.worker) {
                let (c, w, force) = (config.clone(), remote.worker.clone(), config.storage.force_sync);
                let name = plan.name;
                let done = tokio::task::spawn_blocking(move || sync::sync(&c, &w, &plan, force))
                    .await
                    .map_err(|e| PrepareError::Local(e.to_string()))??;
                report.line(&format!("weights {name}: {done:?} on the {}", remote.worker.label));
            }
        }
        sparkgate_config::WeightSync::Nfs => {
            let p = &config.preparation;
            let server = p.nfs.as_ref().map(|n| n.server_ip.to_string()).unwrap_or_default();
            for (v, created) in share::ensure_worker_volumes(config, &remote.node).await? {
                report.line(&format!(
                    "weights: {} volume {} {} (NFS {server}:/{})",
                    remote.worker.label,
                    v.name,
                    if created { "created" } else { "up to date" },
                    v.export
                ));
            }
        }
        sparkgate_config::WeightSync::Zfs => report.line(
            "weights: WEIGHT_SYNC=zfs is run by the operator (`sparkgate sync` prints the commands); assuming the worker's dataset is current",
        ),
        sparkgate_config::WeightSync::None => {}
    }
    Ok(())
}

/// The head's weights must be complete before a start: missing files are fetched when
/// AUTO_DOWNLOAD=1, otherwise the start stops naming them.
async fn weights_gate(config: &Config, report: &dyn progress::Report) -> Result<(), PrepareError> {
    let trees = weights::check(config);
    if trees.iter().all(Tree::complete) {
        report.line("weights: complete on the head");
        return Ok(());
    }
    let missing: Vec<String> = trees
        .iter()
        .filter(|t| !t.complete())
        .map(|t| format!("{} ({}): {}", t.name, t.dir.display(), t.missing.join("; ")))
        .collect();
    if !config.storage.auto_download {
        return Err(PrepareError::WeightsIncomplete(missing));
    }
    report.line(&format!("weights incomplete, downloading: {}", missing.join(" | ")));
    let c = config.clone();
    tokio::task::spawn_blocking(move || {
        let cli = locate(&Search::from_env(&c.storage.hf_bin))?;
        let token = c.secrets.hf_token.as_ref().map(|t| t.expose().to_owned());
        download(&c, &cli, token.as_deref())
    })
    .await
    .map_err(|e| PrepareError::Local(e.to_string()))??;
    report.line("weights: downloaded; complete on the head");
    Ok(())
}
