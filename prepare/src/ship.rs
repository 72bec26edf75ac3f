//! IMAGE onto the worker when its copy is missing or different (compared by RootFS layers):
//! `stream` pipes the head daemon's export into the worker daemon's load through the SSH-forwarded
//! socket; `staged` writes the export to a tar on the head, copies it with a resumable rsync
//! (`--partial --inplace --append-verify`, so a cut transfer continues from what arrived) and
//! loads it on the worker; `auto` stages when the worker has the room and streams otherwise.

use std::time::Instant;

use futures_util::StreamExt;
use sparkgate_config::{Config, ImageShip, Worker};
use sparkgate_docker::{ImageIdentity, Node};

use crate::progress::{human_bytes, Report};
use crate::staging::{data_root_room, staged, staging_room, Staging};
use crate::PrepareError;

/// What [`ship`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shipped {
    /// The worker's image has the head's layers: nothing sent.
    AlreadyThere,
    /// The worker's copy differs, but SKIP_SHIP=1 keeps it.
    Skipped,
    Streamed {
        bytes: u64,
    },
    /// `sent` bytes crossed the network; `resumed_from` were already on the worker.
    Staged {
        sent: u64,
        resumed_from: u64,
        size: u64,
    },
}

/// Ships IMAGE (whose head identity is `head_id`) to a worker (`w`, whose daemon is `worker`)
/// unless it has the same image.
pub async fn ship(
    config: &Config,
    head: &Node,
    worker: &Node,
    w: &Worker,
    head_id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Shipped, PrepareError> {
    let image = &config.serving.image;
    if let Some(kept) = kept_copy(config, worker, head_id, report).await? {
        return Ok(kept);
    }
    // Either way the layers land in the worker daemon's data root: refuse before sending.
    if let Some(room) = data_root_room(worker, head_id, report).await? {
        if !room.enough() {
            return Err(room.error());
        }
    }
    let started = Instant::now();
    let shipped = match staging(config, head, worker, head_id, report).await? {
        Some(staging) => {
            let (sent, size) = staged(config, head, (worker, w), head_id, staging.resumed_from, report).await?;
            Shipped::Staged {
                sent,
                resumed_from: staging.resumed_from,
                size,
            }
        }
        None => stream(head, worker, image, head_id, report).await?,
    };
    match worker.image_identity(image).await? {
        Some(w) if w.same_image(head_id) => {
            report.line(&format!(
                "image {image}: shipped to the worker in {:.1} s; identities match ({})",
                started.elapsed().as_secs_f64(),
                head_id.key()
            ));
            Ok(shipped)
        }
        _ => Err(PrepareError::NoImage {
            image: image.clone(),
            why: "after shipping, the worker's copy does not have the head's layers".into(),
        }),
    }
}

/// What the worker keeps without a transfer: its copy when it has the head's layers, or any
/// copy under SKIP_SHIP=1 (which refuses when it has none).
async fn kept_copy(
    config: &Config,
    worker: &Node,
    head_id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Option<Shipped>, PrepareError> {
    let image = &config.serving.image;
    let skip_ship = config.preparation.skip_ship;
    match worker.image_identity(image).await? {
        Some(w) if w.same_image(head_id) => {
            report.line(&format!(
                "image {image}: the worker has the same layers (identity {}); not shipping",
                head_id.key()
            ));
            Ok(Some(Shipped::AlreadyThere))
        }
        Some(_) if skip_ship => {
            report.line(&format!(
                "image {image}: the worker's copy differs from the head's, but SKIP_SHIP=1; using it"
            ));
            Ok(Some(Shipped::Skipped))
        }
        None if skip_ship => Err(PrepareError::NoImage {
            image: image.clone(),
            why: "the worker lacks it and SKIP_SHIP=1".into(),
        }),
        _ => Ok(None),
    }
}

/// The staging to ship through (none: stream): IMAGE_SHIP=staged needs the room on both nodes;
/// `auto` stages when they have it and streams otherwise, saying why.
async fn staging(
    config: &Config,
    head: &Node,
    worker: &Node,
    head_id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Option<Staging>, PrepareError> {
    let image = &config.serving.image;
    match config.preparation.ship {
        ImageShip::Stream => Ok(None),
        ImageShip::Staged => {
            let staging = staging_room(config, head, worker, head_id).await?;
            if let Some(room) = staging.short() {
                return Err(room.error());
            }
            Ok(Some(staging))
        }
        ImageShip::Auto => match staging_room(config, head, worker, head_id).await {
            Ok(staging) => match staging.short() {
                None => Ok(Some(staging)),
                Some(room) => {
                    report.line(&format!(
                        "image {image}: the {} has {} free in {} but staging needs {}; streaming instead",
                        room.node,
                        human_bytes(room.free),
                        room.dir,
                        human_bytes(room.need)
                    ));
                    Ok(None)
                }
            },
            Err(e) => {
                report.line(&format!(
                    "image {image}: cannot check the room for staging ({e}); streaming instead"
                ));
                Ok(None)
            }
        },
    }
}

async fn stream(
    head: &Node,
    worker: &Node,
    image: &str,
    id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Shipped, PrepareError> {
    report.line(&format!(
        "image {image}: streaming head → worker (about {}; restarts from zero if cut)",
        human_bytes(id.size)
    ));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(8);
    let export = head.export_image(image);
    let load = worker.load_image(tokio_stream(rx));
    let pump = async move {
        let mut export = std::pin::pin!(export);
        let mut sent = 0u64;
        while let Some(chunk) = export.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    // Abort the load's request body: a truncated tar must not look complete.
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return Err(e.into());
                }
            };
            sent += chunk.len() as u64;
            report.bytes("stream", sent, Some(id.size));
            if tx.send(Ok(chunk)).await.is_err() {
                break;
            }
        }
        Ok::<u64, PrepareError>(sent)
    };
    let (sent, loaded) = tokio::join!(pump, load);
    let bytes = sent?;
    loaded?;
    Ok(Shipped::Streamed { bytes })
}

/// A receiver as a `Stream` (what the Docker load call takes).
fn tokio_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
