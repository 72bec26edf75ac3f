//! Stall diagnostics: when a start hangs, each rank's log tail, a Python stack dump where
//! `py-spy` is installed, and the node's memory, written next to the epoch's logs.

use std::path::{Path, PathBuf};

use crate::rank::Rank;

/// Writes the diagnostics for `reason` under `epoch_dir/diagnostics` and returns that directory.
pub(crate) async fn collect(epoch_dir: &Path, ranks: &[Rank], reason: &str) -> PathBuf {
    let dir = epoch_dir.join("diagnostics");
    let _ = std::fs::create_dir_all(&dir);
    let mut summary = format!("reason: {reason}\n");
    for r in ranks {
        let rank = r.rank();
        let tail = r.tail(200).join("\n");
        let _ = std::fs::write(dir.join(format!("rank{rank}-tail.log")), format!("{tail}\n"));
        let Some(pid) = r.pid() else {
            if let crate::rank::Rank::Container(c) = r {
                let dump = c.py_spy().await;
                let _ = std::fs::write(dir.join(format!("rank{rank}-py-spy.txt")), &dump);
                let first = dump.lines().next().unwrap_or("");
                summary.push_str(&format!(
                    "rank {rank} (container {}): py-spy via docker exec: {first}\n",
                    c.id
                ));
            }
            continue;
        };
        let dump = tokio::process::Command::new("py-spy")
            .args(["dump", "--pid", &pid.to_string()])
            .output()
            .await;
        match dump {
            Ok(out) => {
                let _ = std::fs::write(
                    dir.join(format!("rank{rank}-py-spy.txt")),
                    [out.stdout, out.stderr].concat(),
                );
                summary.push_str(&format!("rank {rank} (pid {pid}): py-spy dump written\n"));
            }
            Err(e) => summary.push_str(&format!("rank {rank} (pid {pid}): no py-spy dump ({e})\n")),
        }
    }
    match std::fs::read_to_string("/proc/meminfo") {
        Ok(m) => {
            let avail = m
                .lines()
                .find(|l| l.starts_with("MemAvailable"))
                .unwrap_or("MemAvailable: unknown");
            summary.push_str(&format!("head {avail}\n"));
            let _ = std::fs::write(dir.join("head-meminfo.txt"), m);
        }
        Err(e) => summary.push_str(&format!("head meminfo unreadable: {e}\n")),
    }
    let _ = std::fs::write(dir.join("summary.txt"), &summary);
    tracing::error!(dir = %dir.display(), "stall diagnostics written");
    dir
}
