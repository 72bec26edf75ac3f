//! What the supervisor keeps of a rank's output besides the log file: the last lines (for error
//! messages and diagnostics) and when the last line that shows progress arrived (for the stall
//! watchdog; vLLM's `shm_broadcast` complaints while stuck are not progress).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const TAIL_LINES: usize = 200;

/// Creates the epoch directory a rank's log file goes in.
pub(crate) fn create_parent(log: &std::path::Path) -> Result<(), crate::error::SupervisorError> {
    match log.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|source| crate::error::SupervisorError::LogDir {
            path: dir.to_path_buf(),
            source,
        }),
        None => Ok(()),
    }
}

#[derive(Debug, Clone)]
pub(crate) struct LogSink {
    started: Instant,
    /// Milliseconds after `started` of the last progress line.
    last_line_ms: Arc<AtomicU64>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl LogSink {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            last_line_ms: Arc::new(AtomicU64::new(0)),
            tail: Arc::new(Mutex::new(VecDeque::new())),
        }
    }

    pub(crate) fn line(&self, line: String) {
        if !line.contains("shm_broadcast") && !line.contains("No available shared memory broadcast block") {
            self.last_line_ms
                .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
        let mut t = self.tail.lock().expect("tail lock");
        if t.len() == TAIL_LINES {
            t.pop_front();
        }
        t.push_back(line);
    }

    /// Seconds since the last progress line (or since start).
    pub(crate) fn quiet_for(&self) -> f64 {
        self.started.elapsed().as_secs_f64() - self.last_line_ms.load(Ordering::Relaxed) as f64 / 1e3
    }

    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let t = self.tail.lock().expect("tail lock");
        t.iter().skip(t.len().saturating_sub(n)).cloned().collect()
    }

    pub(crate) fn uptime_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stuck_complaints_are_not_progress_and_the_tail_is_bounded() {
        let s = LogSink::new();
        for i in 0..300 {
            s.line(format!("line {i}"));
        }
        assert_eq!(s.tail(2), vec!["line 298", "line 299"]);
        assert_eq!(s.tail(1000).len(), TAIL_LINES);
        let before = s.last_line_ms.load(Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.line("WARNING [shm_broadcast.py:504] No available shared memory broadcast block found in 60 seconds".into());
        assert_eq!(s.last_line_ms.load(Ordering::Relaxed), before);
    }
}
