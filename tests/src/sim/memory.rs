//! vllm-sim's node memory (SIM_MEMINFO; issue #35's memory guard): a meminfo file whose
//! MemAvailable falls while prompts are prefilled — each holds SIM_PREFILL_BYTES_PER_TOKEN per
//! prompt token from the step that schedules it until its prefill ends (buffers sized by the
//! whole context, as DeepSeek's sparse-attention indexer's are) — and comes back when it ends,
//! as the guides measured on a Spark (about 2 GiB for a 601 000-token prefill). Two long
//! prompts scheduled together hold both. The supervisor's MEMINFO_PATH points at it, so
//! memguard and the gateway's memory guard read it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

const KIB: u64 = 1024;
const GIB_KIB: f64 = 1024.0 * 1024.0;

/// The simulated node's memory.
#[derive(Debug)]
pub(crate) struct NodeMemory {
    path: PathBuf,
    total_kib: u64,
    /// MemAvailable with no prefill running.
    idle_kib: u64,
    bytes_per_token: u64,
    /// The MemAvailable last written (`u64::MAX`: none yet).
    written: AtomicU64,
}

fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl NodeMemory {
    /// From SIM_MEMINFO (unset: no model), SIM_MEM_TOTAL_GIB (128), SIM_MEM_AVAILABLE_GIB (8: what
    /// a loaded rank leaves) and SIM_PREFILL_BYTES_PER_TOKEN (3 600).
    pub(crate) fn from_env() -> Option<NodeMemory> {
        let path = PathBuf::from(std::env::var("SIM_MEMINFO").ok().filter(|p| !p.is_empty())?);
        let memory = NodeMemory {
            path,
            total_kib: (env_num("SIM_MEM_TOTAL_GIB", 128.0) * GIB_KIB) as u64,
            idle_kib: (env_num("SIM_MEM_AVAILABLE_GIB", 8.0) * GIB_KIB) as u64,
            bytes_per_token: env_num("SIM_PREFILL_BYTES_PER_TOKEN", 3600.0) as u64,
            written: AtomicU64::new(u64::MAX),
        };
        memory.update(0);
        Some(memory)
    }

    /// The memory with `prefilling` prompt tokens held; the file is rewritten (whole, by a
    /// rename: a reader never sees half of it) when it changed.
    pub(crate) fn update(&self, prefilling: u64) {
        let held = prefilling * self.bytes_per_token / KIB;
        let available = self.idle_kib.saturating_sub(held);
        if self.written.swap(available, Ordering::Relaxed) == available {
            return;
        }
        let text = format!(
            "MemTotal:       {} kB\nMemFree:        {available} kB\nMemAvailable:   {available} kB\n",
            self.total_kib
        );
        let tmp = self.path.with_extension("tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn available(path: &std::path::Path) -> u64 {
        let text = std::fs::read_to_string(path).unwrap();
        let line = text.lines().find(|l| l.starts_with("MemAvailable:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_prefill_takes_memory_while_it_runs_and_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let m = NodeMemory {
            path: dir.path().join("meminfo"),
            total_kib: 128 * 1024 * 1024,
            idle_kib: 4 * 1024 * 1024,
            bytes_per_token: 3600,
            written: AtomicU64::new(u64::MAX),
        };
        m.update(0);
        assert_eq!(available(&m.path), 4 * 1024 * 1024);
        // A 600 000-token prompt prefilling: about 2 GiB held, as the guide's 601 k-token prefill.
        m.update(600_000);
        let held_gib = (4 * 1024 * 1024 - available(&m.path)) as f64 / GIB_KIB;
        assert!((1.9..2.1).contains(&held_gib), "{held_gib}");
        m.update(0);
        assert_eq!(available(&m.path), 4 * 1024 * 1024);
    }
}
