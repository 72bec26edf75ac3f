//! Checks before a start, each failure saying which node and what to do: the ports the ranks
//! need are free, MemAvailable covers the per-rank weights plus the boot margin, LOG_DIR's
//! filesystem has room, and the RoCE GID entry the ranks will use is populated (when the
//! InfiniBand device exists on this machine).

use std::net::{IpAddr, TcpListener};
use std::path::Path;

use sparkgate_config::Config;

use crate::error::SupervisorError;

/// MemAvailable in GiB from a meminfo file.
pub(crate) fn mem_available_gib(path: &Path) -> Option<f64> {
    sparkgate_docker::mem_available_gib(&std::fs::read_to_string(path).ok()?)
}

/// Free space in GiB of the filesystem holding `path` (or its nearest existing ancestor: LOG_DIR
/// may not exist yet), from POSIX `df -Pk`.
fn free_disk_gib(path: &Path) -> Option<f64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let out = std::process::Command::new("df")
        .arg("-Pk")
        .arg(existing)
        .output()
        .ok()?;
    parse_df_available_gib(&String::from_utf8_lossy(&out.stdout))
}

/// The "Available" column (KiB) of `df -Pk`'s one data line, in GiB.
fn parse_df_available_gib(text: &str) -> Option<f64> {
    let kib: f64 = text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}

fn port_free(ip: IpAddr, port: u16) -> bool {
    TcpListener::bind((ip, port)).is_ok()
}

/// Runs before the first start (not when a running group is adopted).
pub(crate) fn check(config: &Config) -> Result<(), SupervisorError> {
    let fail = |m: String| Err(SupervisorError::Preflight(m));
    let head = config.nodes.head_ip;
    for (name, ip, port) in [
        ("VLLM_PORT", IpAddr::from([127, 0, 0, 1]), config.ports.vllm),
        (
            "MASTER_PORT",
            if head.is_loopback() {
                head
            } else {
                IpAddr::from([0, 0, 0, 0])
            },
            config.ports.master,
        ),
    ] {
        if config.serving.nnodes < 2 && name == "MASTER_PORT" {
            continue;
        }
        if !port_free(ip, port) {
            return fail(format!(
                "head: {name}={port} is already in use on {ip}; stop whatever holds it (an old vLLM? `ss -ltnp 'sport = :{port}'`) or choose another port"
            ));
        }
    }
    let s = &config.supervision;
    if let (Some(weights), Some(margin)) = (s.weights_gib_per_rank, s.boot_margin_gib) {
        let need = weights + margin;
        match mem_available_gib(&s.meminfo_path) {
            Some(avail) if avail < need => {
                return fail(format!(
                    "head: MemAvailable is {avail:.1} GiB but a rank needs {need:.1} GiB ({weights} GiB of weights + BOOT_MARGIN_GIB {margin}); \
                     stop other workloads on the node (docker ps), or set BOOT_MARGIN_GIB= to skip this check"
                ))
            }
            Some(_) => {}
            None => tracing::warn!(path = %s.meminfo_path.display(), "cannot read MemAvailable; memory preflight skipped"),
        }
    }
    if let Some(need) = s.min_free_disk_gib {
        match free_disk_gib(&s.log_dir) {
            Some(free) if free < need => {
                return fail(format!(
                    "head: LOG_DIR {} has {free:.1} GiB free but MIN_FREE_DISK_GIB is {need}; \
                     remove old epoch logs there (LOG_DIR/epoch-*), point LOG_DIR elsewhere, or set MIN_FREE_DISK_GIB= to skip this check",
                    s.log_dir.display()
                ))
            }
            Some(_) => {}
            None => tracing::warn!(path = %s.log_dir.display(), "cannot read free disk space; disk preflight skipped"),
        }
    }
    let nic = &config.nodes.head_nic;
    let gid = Path::new("/sys/class/infiniband")
        .join(&nic.hca)
        .join(format!("ports/1/gids/{}", nic.gid_index));
    if Path::new("/sys/class/infiniband").join(&nic.hca).exists() {
        let value = std::fs::read_to_string(&gid).unwrap_or_default();
        if value.trim().chars().all(|c| c == '0' || c == ':') {
            return fail(format!(
                "head: GID {} of {} is empty ({}); set NCCL_IB_GID_INDEX (same index on both ranks) or HEAD_GID",
                nic.gid_index,
                nic.hca,
                gid.display()
            ));
        }
    } else {
        tracing::debug!(hca = %nic.hca, "no InfiniBand device on this machine; RoCE GID check skipped");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available() {
        let dir = std::env::temp_dir().join(format!("sg-meminfo-{}", std::process::id()));
        std::fs::write(&dir, "MemTotal:       24000000 kB\nMemAvailable:    2097152 kB\n").unwrap();
        assert_eq!(mem_available_gib(&dir), Some(2.0));
        let _ = std::fs::remove_file(&dir);
        assert_eq!(mem_available_gib(Path::new("/nonexistent")), None);
    }

    #[test]
    fn reads_df_available() {
        let df = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n/dev/vda 264000000 24000000 3145728 25% /\n";
        assert_eq!(parse_df_available_gib(df), Some(3.0));
        assert_eq!(parse_df_available_gib("df: /x: No such file or directory\n"), None);
        // A path that does not exist yet is measured on its nearest existing ancestor.
        assert!(free_disk_gib(Path::new("/tmp/sparkgate-not-created-yet/epoch-1")).is_some_and(|g| g > 0.0));
    }
}
