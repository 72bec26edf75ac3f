//! Stall diagnostics: when a start hangs, each rank's log tail, a Python stack dump where
//! `py-spy` is installed, and the node's memory, written next to the epoch's logs.

use std::path::{Path, PathBuf};

use crate::start::Ranks;

/// Writes the diagnostics for `reason` under `epoch_dir/diagnostics` and returns that directory.
pub(crate) async fn collect(epoch_dir: &Path, ranks: &Ranks, reason: &str) -> PathBuf {
    let dir = epoch_dir.join("diagnostics");
    let _ = std::fs::create_dir_all(&dir);
    let mut summary = format!("reason: {reason}\n");
    // What each rank shows now, taken under the lock; the dumps are taken after it.
    let seen: Vec<_> = ranks
        .lock()
        .expect("ranks lock")
        .iter()
        .map(|r| (r.rank(), r.tail(200), r.stack_dumper()))
        .collect();
    for (rank, tail, dumper) in seen {
        let _ = std::fs::write(
            dir.join(format!("rank{rank}-tail.log")),
            format!("{}\n", tail.join("\n")),
        );
        if let Some((dump, note)) = dumper.dump().await {
            let _ = std::fs::write(dir.join(format!("rank{rank}-py-spy.txt")), &dump);
            summary.push_str(&format!("rank {rank} ({note})\n"));
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
