//! LOG_DIR retention (LOG_KEEP_EPOCHS, LOG_KEEP_BYTES): every start adds an epoch directory
//! (its ranks' logs, its diagnostics); before a start writes its own, the oldest ones go — by
//! count, then by bytes — never the epoch about to start. `epoch-N` and an earlier gateway's
//! `epoch-N.before-T` directories count alike, oldest first by their modification time.

use std::path::{Path, PathBuf};

/// How much of LOG_DIR's epochs is kept; `None`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Retention {
    pub(crate) epochs: Option<usize>,
    pub(crate) bytes: Option<u64>,
}

/// What one pruning removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pruned {
    pub(crate) dirs: Vec<PathBuf>,
    pub(crate) bytes: u64,
}

/// An epoch directory with its age and size.
#[derive(Debug)]
struct EpochDir {
    path: PathBuf,
    modified: std::time::SystemTime,
    bytes: u64,
}

fn is_epoch_dir(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("epoch-") else {
        return false;
    };
    let number = rest.split('.').next().unwrap_or_default();
    !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())
}

fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size_of(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

fn epoch_dirs(log_dir: &Path, keep: &Path) -> Vec<EpochDir> {
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<EpochDir> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_str().is_some_and(is_epoch_dir))
        .filter(|e| e.path() != keep)
        .map(|e| EpochDir {
            modified: e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH),
            bytes: size_of(&e.path()),
            path: e.path(),
        })
        .collect();
    dirs.sort_by(|a, b| a.modified.cmp(&b.modified).then_with(|| a.path.cmp(&b.path)));
    dirs
}

/// Removes the oldest epoch directories of `log_dir` until, with `current` (the epoch about to
/// start, never removed), at most `keep.epochs` remain and the rest holds at most `keep.bytes`.
pub(crate) fn prune(log_dir: &Path, current: &Path, keep: Retention) -> Pruned {
    let mut dirs = epoch_dirs(log_dir, current);
    let mut pruned = Pruned::default();
    // The current epoch is one of the kept ones.
    let over_count = keep.epochs.map_or(0, |n| (dirs.len() + 1).saturating_sub(n.max(1)));
    let mut total: u64 = dirs.iter().map(|d| d.bytes).sum();
    let mut removed = 0;
    while !dirs.is_empty() {
        let over_bytes = keep.bytes.is_some_and(|b| total > b);
        if removed >= over_count && !over_bytes {
            break;
        }
        let oldest = dirs.remove(0);
        match std::fs::remove_dir_all(&oldest.path) {
            Ok(()) => {
                total -= oldest.bytes;
                pruned.bytes += oldest.bytes;
                pruned.dirs.push(oldest.path);
            }
            Err(e) => {
                tracing::warn!(dir = %oldest.path.display(), error = %e, "an old epoch's logs could not be removed");
                total -= oldest.bytes;
            }
        }
        removed += 1;
    }
    if !pruned.dirs.is_empty() {
        let names: Vec<String> = pruned.dirs.iter().map(|d| d.display().to_string()).collect();
        tracing::info!(removed = ?names, bytes = pruned.bytes, "old epochs' logs removed (LOG_KEEP_EPOCHS, LOG_KEEP_BYTES)");
    }
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(dir: &Path, name: &str, bytes: usize) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.join("diagnostics")).unwrap();
        std::fs::write(p.join("rank0.log"), vec![b'x'; bytes]).unwrap();
        // Distinct modification times, in creation order.
        std::thread::sleep(std::time::Duration::from_millis(15));
        p
    }

    #[test]
    fn the_oldest_epochs_go_first_by_count_then_by_bytes_and_never_the_current_one() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path();
        let e1 = epoch(log, "epoch-1.before-100", 10);
        let e2 = epoch(log, "epoch-2", 10);
        let e3 = epoch(log, "epoch-3", 10);
        std::fs::write(log.join("ranks.json"), "{}").unwrap();
        std::fs::create_dir_all(log.join("epochs-notes")).unwrap();
        let current = log.join("epoch-4");
        let three = Retention {
            epochs: Some(3),
            bytes: None,
        };
        assert_eq!(prune(log, &current, three).dirs, vec![e1.clone()], "the oldest only");
        assert!(!e1.exists() && e2.exists() && e3.exists());
        assert!(log.join("ranks.json").exists() && log.join("epochs-notes").exists());
        let current = epoch(log, "epoch-4", 1000);
        let by_bytes = Retention {
            epochs: None,
            bytes: Some(15),
        };
        let p = prune(log, &current, by_bytes);
        assert_eq!(p.dirs, vec![e2.clone()], "{p:?}");
        assert_eq!(p.bytes, 10);
        assert!(
            current.exists(),
            "the current epoch is never removed, whatever its size"
        );
        assert_eq!(prune(log, &current, Retention::default()), Pruned::default());
    }
}
