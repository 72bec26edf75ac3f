//! Log lines written off the serving threads, by tracing-appender's non-blocking writer: an
//! event's formatted line goes into a bounded channel and one worker thread writes it, through a
//! buffer flushed whenever the channel is empty, so a request's access-log line costs the
//! serving thread no system call. The writer is lossy: a stderr that blocks (a full pipe, a slow
//! journald) cannot stall the gateway — past `BUFFERED_LINES` waiting lines new ones are dropped
//! and counted, and a notice says how many once a second while lines are being lost. The guard
//! writes the rest when `main` ends.

use std::io::{BufWriter, Write};
use std::time::Duration;

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// Lines that may wait for a blocked stderr before new lines are dropped (at ~200 bytes a
/// line, about 16 MiB).
const BUFFERED_LINES: usize = 80_000;
/// How often the count of dropped lines is looked at.
const NOTICE_EVERY: Duration = Duration::from_secs(1);

/// Dropped at the end of `main`: writes what is still waiting.
#[derive(Debug)]
pub struct LogGuard {
    _worker: WorkerGuard,
}

/// Starts the writer over `out()` (stderr in the binary): one handle for the lines, one for the
/// notices of lost ones. The worker lives as long as the guard.
pub(crate) fn start<W: Write + Send + 'static>(out: impl Fn() -> W) -> (NonBlocking, LogGuard) {
    start_with(out, BUFFERED_LINES)
}

fn start_with<W: Write + Send + 'static>(out: impl Fn() -> W, lines: usize) -> (NonBlocking, LogGuard) {
    let (writer, worker) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(lines)
        .thread_name("sparkgate-log")
        .finish(BufWriter::with_capacity(64 * 1024, out()));
    let counter = writer.error_counter();
    let mut notices = out();
    let spawned = std::thread::Builder::new()
        .name("sparkgate-log-drops".into())
        .spawn(move || {
            let mut reported = 0;
            loop {
                std::thread::sleep(NOTICE_EVERY);
                notice(&counter, &mut reported, &mut notices);
            }
        });
    if let Err(e) = spawned {
        eprintln!("sparkgate: lost log lines will not be counted: {e}");
    }
    (writer, LogGuard { _worker: worker })
}

/// Says how many lines were dropped since the last notice (`reported` of them before), if any.
fn notice(counter: &ErrorCounter, reported: &mut usize, out: &mut impl Write) {
    let total = counter.dropped_lines();
    if total > *reported {
        let lost = total - *reported;
        let _ = writeln!(out, "sparkgate: {lost} log lines dropped (stderr could not keep up)");
        let _ = out.flush();
        *reported = total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

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

    fn log(w: &NonBlocking, text: &str) {
        let mut line = tracing_subscriber::fmt::MakeWriter::make_writer(w);
        line.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_guard_is_dropped() {
        let sink = Sink::default();
        let (w, guard) = start(|| sink.clone());
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
        let (w, guard) = start_with(|| sink.clone(), 100);
        let held = sink.gate.lock().unwrap();
        // The worker blocks in its first write, with at most the channel's 100 lines and one
        // in its hands; the rest is dropped — at least 500 lines, and logging never blocks.
        let line = format!("{}\n", "x".repeat(1023));
        let lines = 100 * 64 + 500;
        for _ in 0..lines {
            log(&w, &line);
        }
        let counter = w.error_counter();
        let lost = counter.dropped_lines();
        assert!(lost >= 500, "{lost}");
        let (mut said, mut reported) = (Vec::new(), 0);
        notice(&counter, &mut reported, &mut said);
        notice(&counter, &mut reported, &mut said);
        assert_eq!(
            String::from_utf8(said).unwrap(),
            format!("sparkgate: {lost} log lines dropped (stderr could not keep up)\n"),
            "one notice for the lines lost, none while no more are"
        );
        drop(held);
        drop(guard);
        let text = String::from_utf8(sink.bytes.lock().unwrap().clone()).unwrap();
        let written = text.lines().filter(|l| l.starts_with('x')).count();
        assert_eq!(written + lost, lines);
    }
}
