//! Log lines written off the reactor: an event's formatted line is appended to a shared
//! buffer, and one writer thread writes the buffer out every `FLUSH_EVERY` (at once past
//! `HIGH_WATER`). A request's access-log line thus costs no system call and no thread wake-up
//! on the thread that serves requests, and a stderr that blocks (a full pipe, a slow journald)
//! cannot stall the gateway: past `MAX_BUFFERED` bytes new lines are dropped and counted, and
//! the count is written once the writer catches up. A line reaches stderr within about
//! `FLUSH_EVERY`; the guard writes the rest when `main` ends.
//!
//! Kept by hand rather than tracing-appender's `non_blocking`, which wakes its worker for every
//! line: its worker thread alone ran 995 instructions per logged request (a channel receive and
//! a write each), where this one writes a buffer every 20 ms (BENCHMARKS.md, "The request as a
//! staged pipeline").

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a line may wait in the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// A buffer this large is written without waiting for `FLUSH_EVERY`.
const HIGH_WATER: usize = 256 * 1024;
/// Bytes that may wait for a blocked stderr before new lines are dropped.
const MAX_BUFFERED: usize = 16 * 1024 * 1024;

struct Shared {
    buf: Mutex<Vec<u8>>,
    /// Held while writing: whoever writes takes the buffer under it, so chunks go out in order.
    out: Mutex<Box<dyn Write + Send>>,
    dropped: AtomicU64,
    /// The writer thread found nothing to write and sleeps until a line wakes it.
    idle: AtomicBool,
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// Writes what is buffered now; whether there was anything.
    fn write_out(&self, spare: &mut Vec<u8>) -> bool {
        let mut out = self.out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::swap(
            &mut *self.buf.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            spare,
        );
        let lost = self.dropped.swap(0, Ordering::Relaxed);
        if spare.is_empty() && lost == 0 {
            return false;
        }
        let _ = out.write_all(spare);
        if lost > 0 {
            let _ = writeln!(out, "sparkgate: {lost} log lines dropped (stderr could not keep up)");
        }
        let _ = out.flush();
        spare.clear();
        true
    }

    fn push(&self, line: &[u8]) {
        let len = {
            let mut buf = self.buf.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if buf.len() + line.len() > MAX_BUFFERED {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            buf.extend_from_slice(line);
            buf.len()
        };
        if (self.idle.swap(false, Ordering::AcqRel) || len >= HIGH_WATER) && len > 0 {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

/// The `tracing_subscriber` writer: hands out one `Line` per event.
#[derive(Debug, Clone)]
pub(crate) struct LogWriter(Arc<Shared>, Priorities);

/// Whether each line starts with its syslog priority (`<4>` for a warning), which journald
/// reads off a service's stderr and strips (`journalctl -p warning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priorities {
    None,
    Syslog,
}

/// The syslog priority of a level (RFC 5424: 3 error, 4 warning, 6 informational, 7 debug).
fn priority(level: tracing::Level) -> &'static [u8] {
    match level {
        tracing::Level::ERROR => b"<3>",
        tracing::Level::WARN => b"<4>",
        tracing::Level::INFO => b"<6>",
        tracing::Level::DEBUG | tracing::Level::TRACE => b"<7>",
    }
}

/// Dropped at the end of `main`: writes what is still buffered.
#[derive(Debug)]
pub struct LogGuard(Arc<Shared>);

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.0.write_out(&mut Vec::new());
    }
}

/// Starts the writer thread over `out` (stderr in the binary). The thread lives as long as
/// the process (the global subscriber keeps the buffer).
pub(crate) fn start(out: impl Write + Send + 'static, priorities: Priorities) -> (LogWriter, LogGuard) {
    let shared = Arc::new(Shared {
        buf: Mutex::new(Vec::with_capacity(64 * 1024)),
        out: Mutex::new(Box::new(out)),
        dropped: AtomicU64::new(0),
        idle: AtomicBool::new(false),
        thread: std::sync::OnceLock::new(),
    });
    let writer = shared.clone();
    let thread = std::thread::Builder::new()
        .name("sparkgate-log".into())
        .spawn(move || {
            let mut spare = Vec::with_capacity(64 * 1024);
            loop {
                // Idle is announced before looking, so a line pushed meanwhile wakes the thread.
                writer.idle.store(true, Ordering::Release);
                if writer.write_out(&mut spare) {
                    writer.idle.store(false, Ordering::Release);
                    std::thread::park_timeout(FLUSH_EVERY);
                } else {
                    std::thread::park();
                }
            }
        })
        .expect("spawn the log writer thread");
    let _ = shared.thread.set(thread.thread().clone());
    (LogWriter(shared.clone(), priorities), LogGuard(shared))
}

/// One event's bytes, appended to the buffer when the formatter is done with it.
#[derive(Debug)]
pub(crate) struct Line {
    buf: Vec<u8>,
    to: Arc<Shared>,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.to.push(&self.buf);
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::with_capacity(256),
            to: self.0.clone(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        let mut line = self.make_writer();
        if self.1 == Priorities::Syslog {
            line.buf.extend_from_slice(priority(*meta.level()));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A sink the test can read, and block: `gate` held means every write waits.
    #[derive(Clone, Default)]
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.lock().unwrap();
            self.bytes.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn log(w: &LogWriter, text: &str) {
        let mut line = tracing_subscriber::fmt::MakeWriter::make_writer(w);
        line.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_guard_is_dropped() {
        let sink = Sink::default();
        let (w, guard) = start(sink.clone(), Priorities::None);
        for i in 0..1000 {
            log(&w, &format!("line {i}\n"));
        }
        drop(guard);
        let text = String::from_utf8(sink.bytes.lock().unwrap().clone()).unwrap();
        let want: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, want);
    }

    #[test]
    fn a_blocked_stderr_drops_lines_instead_of_blocking_the_logger_and_says_how_many() {
        let sink = Sink::default();
        let (w, guard) = start(sink.clone(), Priorities::None);
        let held = sink.gate.lock().unwrap();
        // The writer blocks in its first write, holding at most one buffer's worth; the buffer
        // fills to its cap again; the rest is dropped — at least 500 lines.
        let line = format!("{}\n", "x".repeat(1023));
        let lines = 2 * MAX_BUFFERED / line.len() + 500;
        for _ in 0..lines {
            log(&w, &line);
        }
        drop(held);
        drop(guard);
        let text = String::from_utf8(sink.bytes.lock().unwrap().clone()).unwrap();
        let notices: Vec<&str> = text.lines().filter(|l| l.contains("log lines dropped")).collect();
        let lost: usize = notices
            .iter()
            .map(|n| n.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap())
            .sum();
        let written = text.lines().filter(|l| l.starts_with('x')).count();
        assert!(lost >= 500, "{notices:?}");
        assert_eq!(written + lost, lines);
    }
}
