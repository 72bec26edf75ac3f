//! vLLM-style log lines on stdout (`(APIServer pid=N) INFO 11-29 10:14:47 [file.py:L] msg`),
//! silenced while a hang fault is active so a stall is visible as silence.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static SILENT: AtomicBool = AtomicBool::new(false);

/// Stops (or resumes) all logging: a hung process prints nothing.
pub(crate) fn set_silent(silent: bool) {
    SILENT.store(silent, Ordering::SeqCst);
}

fn timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    format!(
        "{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Prints one log line from `component` (e.g. `APIServer`, `EngineCore_DP0`).
pub(crate) fn line(component: &str, level: &str, source: &str, msg: &str) {
    if SILENT.load(Ordering::SeqCst) {
        return;
    }
    let pid = std::process::id();
    let mut out = std::io::stdout().lock();
    for text in msg.lines() {
        let _ = writeln!(out, "({component} pid={pid}) {level} {} [{source}] {text}", timestamp());
    }
    let _ = out.flush();
}

pub(crate) fn info(component: &str, source: &str, msg: &str) {
    line(component, "INFO", source, msg);
}

pub(crate) fn warn(component: &str, source: &str, msg: &str) {
    line(component, "WARNING", source, msg);
}

pub(crate) fn error(component: &str, source: &str, msg: &str) {
    line(component, "ERROR", source, msg);
}
