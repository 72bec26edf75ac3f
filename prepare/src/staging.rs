//! Room and staged transfers for shipping IMAGE: free space in the worker daemon's data root and
//! in both nodes' ship directories, and `staged` shipping — the export written to a tar on the
//! head, copied by a resumable rsync (`--partial --inplace --append-verify`, so a cut transfer
//! continues from what arrived) and loaded on the worker.

use std::path::Path;
use std::process::Stdio;

use futures_util::StreamExt;
use sparkgate_config::{Config, Worker};
use sparkgate_docker::{ImageIdentity, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::progress::{human_bytes, Report};
use crate::sync::{quote, ssh_argv};
use crate::PrepareError;

/// Headroom the worker needs beyond twice the tar (the tar plus its loaded layers).
const WORKER_MARGIN_BYTES: u64 = 5 << 30;

/// Free space against what staging needs in one node's ship directory.
#[derive(Debug, Clone)]
pub(crate) struct Room {
    pub(crate) node: &'static str,
    /// What needs the room, and how to make it (for the error).
    what: &'static str,
    fix: &'static str,
    pub(crate) dir: String,
    pub(crate) free: u64,
    pub(crate) need: u64,
}

impl Room {
    pub(crate) fn enough(&self) -> bool {
        self.free >= self.need
    }

    pub(crate) fn error(&self) -> PrepareError {
        PrepareError::NoRoom {
            node: self.node,
            dir: self.dir.clone(),
            need: human_bytes(self.need),
            free: human_bytes(self.free),
            what: self.what,
            fix: self.fix,
        }
    }
}

/// Staging's room on both nodes, and what a cut transfer already left on the worker.
#[derive(Debug)]
pub(crate) struct Staging {
    rooms: Vec<Room>,
    pub(crate) resumed_from: u64,
}

impl Staging {
    /// The first node without enough room.
    pub(crate) fn short(&self) -> Option<&Room> {
        self.rooms.iter().find(|r| !r.enough())
    }
}

/// The worker needs the tar twice (the file and its loaded layers) plus 5 GiB, less what a cut
/// transfer already left there.
fn staging_need(tar_size: u64, already: u64) -> u64 {
    (2 * tar_size + WORKER_MARGIN_BYTES).saturating_sub(already)
}

/// The head needs room for the tar (plus 1 GiB) unless it is exported already.
const HEAD_MARGIN_BYTES: u64 = 1 << 30;

/// Free bytes from the data line of `df -Pk` (its fourth column, in KiB).
fn df_free_bytes(line: &str) -> Option<u64> {
    line.split_whitespace()
        .nth(3)?
        .parse::<u64>()
        .ok()
        .map(|kib| kib * 1024)
}

/// `mkdir -p DIR; df -Pk DIR; stat -c %s FILE` on a node: (free bytes, FILE's size or 0).
async fn free_and_size(node: &Node, dir: &str, file: &str) -> Result<(u64, u64), PrepareError> {
    let (d, f) = (quote(dir), quote(file));
    let out = node
        .shell(&format!(
            "mkdir -p {d} && df -Pk {d} | tail -n 1 && (stat -c %s {f} 2>/dev/null || echo 0)"
        ))
        .await?;
    let mut lines = out.lines();
    let free = lines
        .next()
        .and_then(df_free_bytes)
        .ok_or_else(|| PrepareError::Local(format!("{}: unexpected `df` output: {out}", node.name())))?;
    let size = lines.next().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    Ok((free, size))
}

/// Free space in the worker daemon's data root against the image's size; `None` when the
/// daemon does not say where it is or the host cannot tell (the load then decides).
pub(crate) async fn data_root_room(
    worker: &Node,
    id: &ImageIdentity,
    report: &dyn Report,
) -> Result<Option<Room>, PrepareError> {
    let Some(root) = worker.docker_root_dir().await? else {
        return Ok(None);
    };
    let out = match worker.shell(&format!("df -Pk {} | tail -n 1", quote(&root))).await {
        Ok(out) => out,
        Err(e) => {
            report.line(&format!(
                "cannot read the free space of the worker's Docker data root ({e})"
            ));
            return Ok(None);
        }
    };
    let Some(free) = df_free_bytes(&out) else {
        return Ok(None);
    };
    Ok(Some(Room {
        node: "worker",
        what: "loading the image",
        fix: "free space in the worker's Docker data root (e.g. `docker image prune`); no shipping mode avoids it",
        dir: root,
        free,
        need: id.size,
    }))
}

/// Staging's room on the head (unless the tar is exported already) and on the worker (less
/// what a cut transfer left there).
pub(crate) async fn staging_room(
    config: &Config,
    head: &Node,
    worker: &Node,
    id: &ImageIdentity,
) -> Result<Staging, PrepareError> {
    let p = &config.preparation;
    let head_dir = p.ship_dir.display().to_string();
    let head_tar = p
        .ship_dir
        .join(tar_name(&config.serving.image, id))
        .display()
        .to_string();
    let (head_free, exported) = free_and_size(head, &head_dir, &head_tar).await?;
    let (worker_free, already) = free_and_size(worker, &p.worker_ship_dir, &worker_tar(config, id)).await?;
    let rooms = vec![
        Room {
            node: "head",
            what: "staged shipping (tar + 1 GiB)",
            fix: "free space there, set IMAGE_SHIP_DIR to a larger disk, or IMAGE_SHIP=stream",
            dir: head_dir,
            free: head_free,
            need: if exported > 0 { 0 } else { id.size + HEAD_MARGIN_BYTES },
        },
        Room {
            node: "worker",
            what: "staged shipping (tar ×2 + 5 GiB)",
            fix: "free space there, set WORKER_IMAGE_SHIP_DIR to a larger disk, or IMAGE_SHIP=stream",
            dir: p.worker_ship_dir.clone(),
            free: worker_free,
            need: staging_need(id.size, already),
        },
    ];
    Ok(Staging {
        rooms,
        resumed_from: already,
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

/// Ships by a staged tar: exported on the head, copied by rsync (resuming at `resumed_from`),
/// loaded on the worker; (bytes rsync sent, the tar's size).
pub(crate) async fn staged(
    config: &Config,
    head: &Node,
    (worker, w): (&Node, &Worker),
    id: &ImageIdentity,
    resumed_from: u64,
    report: &dyn Report,
) -> Result<(u64, u64), PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    let local = p.ship_dir.join(tar_name(image, id));
    export_tar(head, image, id, &local, report).await?;
    let size = std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0);
    let remote = worker_tar(config, id);
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
            w.ssh
        ));
    }
    let sent = rsync(config, w, &local, &remote, size, report).await?;
    report.line(&format!("image {image}: loading on the worker"));
    let load = format!(
        "docker -H {} load -i {}",
        quote(&format!("unix://{}", config.nodes.ssh.worker_docker_socket)),
        quote(&remote)
    );
    let loaded = worker.shell(&load).await;
    // After a failed load the tars may be what is wrong (a corrupt or stale copy): the next run
    // starts clean whatever IMAGE_SHIP_KEEP says.
    if loaded.is_err() || !p.ship_keep {
        let _ = worker.shell(&format!("rm -f {}", quote(&remote))).await;
        let _ = std::fs::remove_file(&local);
    }
    loaded?;
    remove_stale_tars(config, worker, id).await;
    Ok((sent, size))
}

/// Tars of this image's earlier identities, on both nodes: never reused, only in the way.
async fn remove_stale_tars(config: &Config, worker: &Node, id: &ImageIdentity) {
    let p = &config.preparation;
    let current = tar_name(&config.serving.image, id);
    let prefix = current.trim_end_matches(&format!("{}.tar", id.key())).to_owned();
    for entry in std::fs::read_dir(&p.ship_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name != current && name.contains(".tar") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let dir = quote(p.worker_ship_dir.trim_end_matches('/'));
    let keep = quote(&current);
    let script = format!(
        "for f in {dir}/{}*.tar; do [ -e \"$f\" ] && [ \"$(basename \"$f\")\" != {keep} ] && rm -f \"$f\"; done; true",
        quote(&prefix)
    );
    let _ = worker.shell(&script).await;
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
    // A part file of our own: two exports at once (a CLI run beside a start) must not interleave.
    let part = path.with_extension(format!("tar.part.{}", std::process::id()));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&part)
        .await
        .map_err(io)?;
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
    w: &Worker,
    local: &Path,
    remote: &str,
    size: u64,
    report: &dyn Report,
) -> Result<u64, PrepareError> {
    let argv = rsync_argv(config, w, local, remote);
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
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let errors = sparkgate_task::spawn("ship-stderr", async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let all = follow_progress(stdout, size, report).await?;
    let status = child.wait().await.map_err(|e| PrepareError::Local(e.to_string()))?;
    let stderr = errors.await.unwrap_or_default();
    if !status.success() {
        let detail = stderr.trim().lines().last().unwrap_or_default().to_owned();
        // rsync's exit codes for a broken connection or stream, a timeout, or a signal: what a
        // rerun resumes. Anything else (no rsync on the worker, a full disk, permissions) is not.
        let cut = status.code().is_none_or(|c| matches!(c, 12 | 20 | 30 | 35 | 255));
        return Err(if cut {
            PrepareError::Interrupted {
                command,
                status: status.to_string(),
                detail,
            }
        } else {
            PrepareError::Failed {
                command: format!("{command} ({detail})"),
                status: status.to_string(),
            }
        });
    }
    Ok(stat_bytes_sent(&String::from_utf8_lossy(&all)).unwrap_or(size))
}

/// rsync's arguments: resumable, with progress and totals, over the worker's SSH, at most
/// IMAGE_SHIP_BWLIMIT KiB/s.
fn rsync_argv(config: &Config, w: &Worker, local: &Path, remote: &str) -> Vec<String> {
    let bwlimit = config.preparation.ship_bwlimit_kib;
    let mut argv = vec![
        "--partial".to_owned(),
        "--inplace".to_owned(),
        "--append-verify".to_owned(),
        "--info=progress2".to_owned(),
        "--stats".to_owned(),
        // A link that dies without a reset must fail the transfer (so a rerun resumes), not hang.
        "--timeout=120".to_owned(),
        "-e".to_owned(),
        ssh_argv(config, w).join(" "),
    ];
    if bwlimit > 0 {
        argv.push(format!("--bwlimit={bwlimit}"));
    }
    argv.push(local.display().to_string());
    argv.push(format!("{}:{remote}", w.ssh));
    argv
}

/// Reads rsync's output to its end, each progress line (ended by `\r` or `\n`) reported as
/// bytes done of `size`; returns all of it (for the totals).
async fn follow_progress(
    mut stdout: tokio::process::ChildStdout,
    size: u64,
    report: &dyn Report,
) -> Result<Vec<u8>, PrepareError> {
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    loop {
        let n = stdout
            .read(&mut buf)
            .await
            .map_err(|e| PrepareError::Local(e.to_string()))?;
        if n == 0 {
            return Ok(all);
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
            node: "worker",
            what: "staged shipping (tar ×2 + 5 GiB)",
            fix: "set WORKER_IMAGE_SHIP_DIR to a larger disk",
            dir: "/tmp".into(),
            free: 44 * gib,
            need: staging_need(20 * gib, 0),
        };
        assert!(!room.enough());
        let staging = Staging {
            rooms: vec![room.clone()],
            resumed_from: 0,
        };
        assert!(staging.short().is_some());
        let msg = room.error().to_string();
        assert!(
            msg.contains("worker has 44.0 GiB free in /tmp") && msg.contains("WORKER_IMAGE_SHIP_DIR"),
            "{msg}"
        );
    }

    #[test]
    fn df_lines_give_free_bytes() {
        assert_eq!(
            df_free_bytes("/dev/vda  263174212 12462712 83984848  13% /"),
            Some(83_984_848 * 1024)
        );
        assert_eq!(
            df_free_bytes("Filesystem 1024-blocks Used Available Capacity Mounted on"),
            None
        );
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
            config: String::new(),
            labels: Default::default(),
            size: 0,
        };
        let name = tar_name("ghcr.io/miaai-lab/glm:exl3", &id);
        assert!(name.starts_with("ghcr.io_miaai-lab_glm_exl3-"), "{name}");
        assert!(name.ends_with(&format!("{}.tar", id.key())));
    }
}
