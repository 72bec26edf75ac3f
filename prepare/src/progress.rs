//! Where preparation reports what it does: a terminal (a redrawn bar with bytes and rate, or a
//! line every few seconds when stderr is not a terminal) or the supervisor's log.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Receives progress of long preparation steps.
pub trait Report: Send + Sync {
    /// A finished step or a decision, one line.
    fn line(&self, text: &str);
    /// `done` of `total` bytes (total unknown: `None`) of the step called `label`.
    fn bytes(&self, label: &str, done: u64, total: Option<u64>);
}

/// Human units: 1.5 GiB, 12.0 MiB, 512 B.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[derive(Debug)]
struct Meter {
    label: String,
    started: Instant,
    last_shown: Option<Instant>,
    /// The all-done report was shown (an estimated total can be passed by a few chunks).
    finished: bool,
}

impl Meter {
    fn new(label: &str) -> Meter {
        Meter {
            label: label.to_owned(),
            started: Instant::now(),
            last_shown: None,
            finished: false,
        }
    }

    /// Whether to show a report now: the first, then one per `interval`, and the all-done one
    /// exactly once (an estimated total can be passed by a few more chunks), so a log ends with
    /// the total.
    fn due(&mut self, done: u64, total: Option<u64>, interval: Duration) -> bool {
        let now = Instant::now();
        let finished = !self.finished && total.is_some_and(|t| done >= t);
        self.finished |= finished;
        let due = finished || self.last_shown.is_none_or(|t| now - t >= interval);
        if due {
            self.last_shown = Some(now);
        }
        due
    }

    fn text(&self, done: u64, total: Option<u64>) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = human_bytes((done as f64 / secs) as u64);
        match total.filter(|t| *t > 0) {
            Some(t) => {
                let frac = (done as f64 / t as f64).min(1.0);
                let filled = (frac * 24.0).round() as usize;
                format!(
                    "{} [{}{}] {:>3.0}% {} / {} {rate}/s",
                    self.label,
                    "#".repeat(filled),
                    ".".repeat(24 - filled),
                    frac * 100.0,
                    human_bytes(done),
                    human_bytes(t)
                )
            }
            None => format!("{} {} {rate}/s", self.label, human_bytes(done)),
        }
    }
}

/// Progress on stderr: redrawn in place on a terminal, else a line every `every`.
#[derive(Debug)]
pub struct Terminal {
    tty: bool,
    every: Duration,
    meter: Mutex<Option<Meter>>,
}

impl Terminal {
    pub fn new() -> Terminal {
        Terminal {
            tty: std::io::stderr().is_terminal(),
            every: Duration::from_secs(2),
            meter: Mutex::new(None),
        }
    }
}

impl Default for Terminal {
    fn default() -> Self {
        Terminal::new()
    }
}

impl Report for Terminal {
    fn line(&self, text: &str) {
        let mut meter = self.meter.lock().unwrap_or_else(|p| p.into_inner());
        if meter.take().is_some() && self.tty {
            eprintln!();
        }
        println!("{text}");
    }

    fn bytes(&self, label: &str, done: u64, total: Option<u64>) {
        let mut slot = self.meter.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|m| m.label != label) {
            if slot.is_some() && self.tty {
                eprintln!();
            }
            *slot = Some(Meter::new(label));
        }
        let m = slot.as_mut().expect("set above");
        let interval = if self.tty {
            Duration::from_millis(200)
        } else {
            self.every
        };
        if !m.due(done, total, interval) {
            return;
        }
        let text = m.text(done, total);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{text}");
        } else {
            let _ = writeln!(err, "{text}");
        }
        let _ = err.flush();
    }
}

/// Progress into the log (the supervisor's start): decisions at info, bytes every 10 s.
#[derive(Debug)]
pub struct Log {
    meter: Mutex<Option<Meter>>,
}

impl Log {
    pub fn new() -> Log {
        Log {
            meter: Mutex::new(None),
        }
    }
}

impl Default for Log {
    fn default() -> Self {
        Log::new()
    }
}

impl Report for Log {
    fn line(&self, text: &str) {
        tracing::info!("{text}");
    }

    fn bytes(&self, label: &str, done: u64, total: Option<u64>) {
        let mut slot = self.meter.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|m| m.label != label) {
            // The log starts counting at the first report and shows the next one due.
            let mut m = Meter::new(label);
            m.last_shown = Some(m.started);
            *slot = Some(m);
            return;
        }
        let m = slot.as_mut().expect("set above");
        if m.due(done, total, Duration::from_secs(10)) {
            tracing::info!("{}", m.text(done, total));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
    }

    #[test]
    fn reports_are_paced_but_the_finished_one_always_shows_once() {
        let mut m = Meter::new("ship");
        let hour = Duration::from_secs(3600);
        assert!(m.due(1, Some(10), hour), "the first report shows");
        assert!(!m.due(5, Some(10), hour), "then one per interval");
        assert!(m.due(10, Some(10), hour), "the finished one shows");
        assert!(!m.due(12, Some(10), hour), "once");
    }

    #[test]
    fn a_bar_shows_share_bytes_and_rate() {
        let mut m = Meter::new("ship");
        m.started -= Duration::from_secs(2);
        let t = m.text(1 << 30, Some(2 << 30));
        assert!(
            t.starts_with("ship [############............]  50% 1.0 GiB / 2.0 GiB "),
            "{t}"
        );
        assert!(t.ends_with("/s"), "{t}");
    }
}
