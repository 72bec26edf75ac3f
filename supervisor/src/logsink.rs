//! A rank's output, captured the same way for every runtime (`Capture`): the bytes go to the
//! epoch's log file as they came, and lines (decoded lossily, so one invalid UTF-8 byte never
//! ends the capture) feed the `LogSink` — the last lines (for error messages and diagnostics)
//! and when the last line that shows progress arrived (for the stall watchdog; vLLM's
//! `shm_broadcast` complaints while stuck are not progress).

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

/// Longest line kept whole in the tail; longer output is split (a line of a rank that never
/// prints a newline must not grow without bound).
const MAX_LINE: usize = 64 * 1024;

/// Feeds a rank's output chunks to its log file and its sink.
#[derive(Debug)]
pub(crate) struct Capture {
    file: tokio::fs::File,
    sink: LogSink,
    pending: Vec<u8>,
}

impl Capture {
    /// Appends to `log` (created when missing: an adopted rank's epoch continues its file).
    pub(crate) async fn open(log: &std::path::Path, sink: LogSink) -> Result<Self, crate::error::SupervisorError> {
        create_parent(log)?;
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .await
            .map_err(|source| crate::error::SupervisorError::LogDir {
                path: log.to_path_buf(),
                source,
            })?;
        Ok(Self {
            file,
            sink,
            pending: Vec::new(),
        })
    }

    pub(crate) async fn chunk(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt as _;
        let _ = self.file.write_all(bytes).await;
        let _ = self.file.flush().await;
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(pos) = memchr_newline(&self.pending[start..]) {
            let line = &self.pending[start..start + pos];
            self.sink
                .line(String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line)).into_owned());
            start += pos + 1;
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_LINE {
            let line = std::mem::take(&mut self.pending);
            self.sink.line(String::from_utf8_lossy(&line).into_owned());
        }
    }

    /// Reads `reader` to its end (the rank's stdout or stderr).
    pub(crate) async fn follow(mut self, mut reader: impl tokio::io::AsyncRead + Unpin) {
        use tokio::io::AsyncReadExt as _;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => self.chunk(&buf[..n]).await,
            }
        }
        self.finish();
    }

    /// A last line without its newline still counts.
    pub(crate) fn finish(mut self) {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.sink.line(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

fn memchr_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
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

    #[tokio::test]
    async fn invalid_utf8_and_split_chunks_never_end_the_capture() {
        let dir = std::env::temp_dir().join(format!("sparkgate-capture-{}", std::process::id()));
        let log = dir.join("rank0.log");
        let sink = LogSink::new();
        let mut c = Capture::open(&log, sink.clone()).await.unwrap();
        c.chunk(b"first \xff line\nsec").await;
        c.chunk(b"ond line\r\nthird").await;
        c.chunk(b" line\n").await;
        c.chunk(b"unterminated").await;
        c.finish();
        assert_eq!(
            sink.tail(10),
            vec!["first \u{fffd} line", "second line", "third line", "unterminated"]
        );
        let raw = std::fs::read(&log).unwrap();
        assert_eq!(
            raw, b"first \xff line\nsecond line\r\nthird line\nunterminated",
            "the file keeps the bytes"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

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
