//! Errors of the supervisor.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(transparent)]
    Docker(#[from] sparkgate_docker::DockerError),
    #[error("preflight: {0}")]
    Preflight(String),
    #[error("cannot start rank {rank} with {bin}: {source}")]
    Spawn {
        bin: String,
        rank: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write logs under {path}: {source}")]
    LogDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
