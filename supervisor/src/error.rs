//! Errors of the supervisor.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(
        "RUNTIME=docker is not available in this build yet; use RUNTIME=process or `sparkgate serve --upstream URL`"
    )]
    DockerUnavailable,
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
