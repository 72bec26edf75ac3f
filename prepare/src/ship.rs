//! IMAGE onto the worker when its copy is missing or different (compared by RootFS layers):
//! `stream` pipes the head daemon's export into the worker daemon's load through the SSH-forwarded
//! socket; `staged` writes the export to a tar on the head, copies it with a resumable rsync
//! (`--partial --inplace --append-verify`, so a cut transfer continues from what arrived) and
//! loads it on the worker; `auto` stages when the worker has the room and streams otherwise.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use futures_util::StreamExt;
use sparkgate_config::{Config, ImageShip};
use sparkgate_docker::{ImageIdentity, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::progress::{human_bytes, Report};
use crate::sync::{quote, ssh_argv};
use crate::PrepareError;

/// Headroom the worker needs beyond twice the tar (the tar plus its loaded layers).
const WORKER_MARGIN_BYTES: u64 = 5 << 30;

/// What [`ship`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shipped {
    /// The worker's image has the head's layers: nothing sent.
    AlreadyThere,
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

/// Ships IMAGE (whose head identity is `head_id`) to the worker unless it has the same image.
pub async fn ship(
    config: &Config,
    head: &Node,
    worker: &Node,
    head_id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Shipped, PrepareError> {
    let image = &config.serving.image;
    let p = &config.preparation;
    match worker.image_identity(image).await? {
        Some(w) if w.same_image(head_id) => {
            report.line(&format!(
                "image {image}: the worker has the same layers (identity {}); not shipping",
                head_id.key()
            ));
            return Ok(Shipped::AlreadyThere);
        }
        Some(_) if p.skip_ship => {
            report.line(&format!(
                "image {image}: the worker's copy differs from the head's, but SKIP_SHIP=1; using it"
            ));
            return Ok(Shipped::AlreadyThere);
        }
        None if p.skip_ship => {
            return Err(PrepareError::NoImage {
                image: image.clone(),
                why: "the worker lacks it and SKIP_SHIP=1".into(),
            })
        }
        _ => {}
    }
    let started = Instant::now();
    let staged_room = match p.ship {
        ImageShip::Stream => None,
        _ => Some(worker_room(config, worker, head_id).await?),
    };
    let shipped = match (p.ship, staged_room) {
        (ImageShip::Staged, Some(room)) if !room.enough() => {
            return Err(PrepareError::NoRoom {
                dir: p.worker_ship_dir.clone(),
                need: human_bytes(room.need),
                free: human_bytes(room.free),
            })
        }
        (ImageShip::Auto, Some(room)) if !room.enough() => {
            report.line(&format!(
                "image {image}: the worker has {} free in {} but staging needs {}; streaming instead",
                human_bytes(room.free),
                p.worker_ship_dir,
                human_bytes(room.need)
            ));
            stream(head, worker, image, head_id, report).await?
        }
        (ImageShip::Stream, _) => stream(head, worker, image, head_id, report).await?,
        _ => staged(config, head, worker, head_id, report).await?,
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
            let chunk = chunk?;
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

/// Free space against what staging needs in WORKER_IMAGE_SHIP_DIR, and what is there already.
#[derive(Debug, Clone, Copy)]
struct Room {
    free: u64,
    need: u64,
}

impl Room {
    fn enough(&self) -> bool {
        self.free >= self.need
    }
}

/// Staging needs the tar twice (the file and its loaded layers) plus 5 GiB, less what a cut
/// transfer already left there.
fn staging_need(tar_size: u64, already: u64) -> u64 {
    (2 * tar_size + WORKER_MARGIN_BYTES).saturating_sub(already)
}

async fn worker_room(config: &Config, worker: &Node, id: &ImageIdentity) -> Result<Room, PrepareError> {
    let dir = quote(&config.preparation.worker_ship_dir);
    let file = quote(&worker_tar(config, id));
    let out = worker
        .shell(&format!(
            "mkdir -p {dir} && df -Pk {dir} | tail -n 1 && (stat -c %s {file} 2>/dev/null || echo 0)"
        ))
        .await?;
    let mut lines = out.lines();
    let free_kib: u64 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| PrepareError::Remote {
            target: config.nodes.worker_ssh.clone(),
            detail: format!("unexpected `df` output: {out}"),
        })?;
    let already: u64 = lines.next().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    Ok(Room {
        free: free_kib * 1024,
        need: staging_need(id.size, already),
    })
}

/// The tar's name: the image reference made file-safe, plus its identity key.
fn tar_name(image: &str, id: &ImageIdentity) -> String {
    let safe: String = image
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}-{}.tar", id.key())
}

fn worker_tar(config: &Config, id: &ImageIdentity) -> String {
    format!(
        "{}/{}",
        config.preparation.worker_ship_dir.trim_end_matches('/'),
        tar_name(&config.serving.image, id)
    )
}

async fn staged(
    config: &Config,
    head: &Node,
    worker: &Node,
    id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Shipped, PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    let local = p.ship_dir.join(tar_name(image, id));
    export_tar(head, image, id, &local, report).await?;
    let size = std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0);
    let remote = worker_tar(config, id);
    let resumed_from: u64 = worker
        .shell(&format!("stat -c %s {} 2>/dev/null || echo 0", quote(&remote)))
        .await?
        .trim()
        .parse()
        .unwrap_or(0);
    if resumed_from > 0 {
        report.line(&format!(
            "image {image}: resuming the transfer at {} of {}",
            human_bytes(resumed_from.min(size)),
            human_bytes(size)
        ));
    } else {
        report.line(&format!(
            "image {image}: copying {} to {}:{remote}",
            human_bytes(size),
            config.nodes.worker_ssh
        ));
    }
    let sent = rsync(config, &local, &remote, size, report).await?;
    report.line(&format!("image {image}: loading on the worker"));
    let load = format!(
        "docker -H {} load -i {}",
        quote(&format!("unix://{}", config.nodes.ssh.worker_docker_socket)),
        quote(&remote)
    );
    worker.shell(&load).await?;
    if !p.ship_keep {
        let _ = worker.shell(&format!("rm -f {}", quote(&remote))).await;
        let _ = std::fs::remove_file(&local);
    }
    Ok(Shipped::Staged {
        sent,
        resumed_from,
        size,
    })
}

/// Exports IMAGE into `path` on the head (via `path.part`, so a finished tar is never partial);
/// an existing tar of this identity is reused.
async fn export_tar(
    head: &Node,
    image: &str,
    id: &ImageIdentity,
    path: &Path,
    report: &dyn Report,
) -> Result<(), PrepareError> {
    if path.is_file() {
        report.line(&format!("image {image}: reusing {}", path.display()));
        return Ok(());
    }
    let io = |e: std::io::Error| PrepareError::Local(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
    }
    let part = path.with_extension("tar.part");
    let mut file = tokio::fs::File::create(&part).await.map_err(io)?;
    let mut export = std::pin::pin!(head.export_image(image));
    let mut written = 0u64;
    while let Some(chunk) = export.next().await {
        let chunk = chunk?;
        file.write_all(&chunk).await.map_err(io)?;
        written += chunk.len() as u64;
        report.bytes("export", written, Some(id.size));
    }
    file.sync_all().await.map_err(io)?;
    tokio::fs::rename(&part, path).await.map_err(io)?;
    Ok(())
}

/// `rsync --partial --inplace --append-verify` of one file to the worker, its progress parsed
/// into `report`; returns the bytes rsync sent.
async fn rsync(
    config: &Config,
    local: &Path,
    remote: &str,
    size: u64,
    report: &dyn Report,
) -> Result<u64, PrepareError> {
    let bwlimit = config.preparation.ship_bwlimit_kib;
    let mut argv = vec![
        "--partial".to_owned(),
        "--inplace".to_owned(),
        "--append-verify".to_owned(),
        "--info=progress2".to_owned(),
        "--stats".to_owned(),
        "-e".to_owned(),
        ssh_argv(config).join(" "),
    ];
    if bwlimit > 0 {
        argv.push(format!("--bwlimit={bwlimit}"));
    }
    argv.push(local.display().to_string());
    argv.push(format!("{}:{remote}", config.nodes.worker_ssh));
    let command = format!("rsync {}", argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "));
    let mut child = tokio::process::Command::new("rsync")
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| PrepareError::Spawn {
            command: command.clone(),
            source,
        })?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let errors = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    loop {
        let n = stdout
            .read(&mut buf)
            .await
            .map_err(|e| PrepareError::Local(e.to_string()))?;
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        for &b in &buf[..n] {
            if b == b'\r' || b == b'\n' {
                if let Some(done) = progress_bytes(&String::from_utf8_lossy(&line)) {
                    report.bytes("transfer", done, Some(size));
                }
                line.clear();
            } else {
                line.push(b);
            }
        }
    }
    let status = child.wait().await.map_err(|e| PrepareError::Local(e.to_string()))?;
    let stderr = errors.await.unwrap_or_default();
    if !status.success() {
        return Err(PrepareError::Interrupted {
            command,
            status: status.to_string(),
            detail: stderr.trim().lines().last().unwrap_or_default().to_owned(),
        });
    }
    Ok(stat_bytes_sent(&String::from_utf8_lossy(&all)).unwrap_or(size))
}

/// The byte count at the start of an rsync `--info=progress2` line (`  1,234,567  12% …`).
fn progress_bytes(line: &str) -> Option<u64> {
    let first = line.split_whitespace().next()?;
    line.contains('%').then_some(())?;
    first.replace(',', "").parse().ok()
}

/// `Total bytes sent: 1,234` from rsync's `--stats`.
fn stat_bytes_sent(out: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Total bytes sent:"))
        .and_then(|v| v.trim().replace(',', "").parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_needs_twice_the_tar_plus_margin_less_what_arrived() {
        let gib = 1u64 << 30;
        assert_eq!(staging_need(20 * gib, 0), 45 * gib);
        assert_eq!(staging_need(20 * gib, 10 * gib), 35 * gib);
        let room = Room {
            free: 44 * gib,
            need: staging_need(20 * gib, 0),
        };
        assert!(!room.enough());
    }

    #[test]
    fn rsync_output_is_read_for_progress_and_totals() {
        assert_eq!(progress_bytes("     32,768   0%    0.00kB/s    0:00:00"), Some(32768));
        assert_eq!(progress_bytes("sending incremental file list"), None);
        let stats = "Number of files: 1\nTotal bytes sent: 12,345,678\nTotal bytes received: 35\n";
        assert_eq!(stat_bytes_sent(stats), Some(12_345_678));
    }

    #[test]
    fn tar_names_are_file_safe_and_carry_the_identity() {
        let id = ImageIdentity {
            layers: vec!["sha256:aa".into()],
            labels: Default::default(),
            size: 0,
        };
        let name = tar_name("ghcr.io/miaai-lab/glm:exl3", &id);
        assert!(name.starts_with("ghcr.io_miaai-lab_glm_exl3-"), "{name}");
        assert!(name.ends_with(&format!("{}.tar", id.key())));
    }
}
