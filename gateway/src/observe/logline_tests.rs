//! The fast text line against tracing-subscriber's default format: the same text for every
//! kind of field, the same timestamps, and the default format for what it leaves to it.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use super::{timestamp, TextLine};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn events() {
    let error = std::io::Error::other("outer");
    tracing::info!(
        request_id = %"sg-1",
        route = "chat",
        status = 200u16,
        model = Some("DeepSeek"),
        prompt_tokens = None::<u64>,
        ttft_ms = Some(12.5),
        duration_ms = 3.0,
        outcome = "completed",
        "generation"
    );
    tracing::warn!(
        detail = "a \"quoted\" \\ value\twith tab é",
        n = -4i64,
        ok = true,
        "odd strings"
    );
    tracing::error!(state = ?Some(vec![1, 2]), "debug value {}", 7);
    // Integers and the floats the fast path writes itself, and those it leaves to `Debug`.
    tracing::info!(
        a = 0u64,
        b = u64::MAX,
        c = i64::MIN,
        d = -7i64,
        e = 0.0,
        f = 0.1,
        g = 123_456_789.9,
        h = 0.15,
        i = -2.5,
        j = 1e16,
        k = f64::NAN,
        l = 2.0 / 3.0,
        m = -0.0,
        "numbers"
    );
    tracing::info!("control \x1b[31m in the message \u{85}");
    tracing::info!(error = &error as &(dyn std::error::Error + 'static), "an error value");
}

/// Each line without its timestamp (27 characters, compared on their own below).
fn lines(fast: bool) -> Vec<String> {
    let capture = Capture::default();
    let writer = capture.clone();
    let builder = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_target(false)
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE);
    if fast {
        tracing::subscriber::with_default(builder.event_format(TextLine::new()).finish(), events);
    } else {
        tracing::subscriber::with_default(builder.finish(), events);
    }
    let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    text.lines().map(|l| l[27..].to_owned()).collect()
}

#[test]
fn every_line_reads_as_the_default_format_writes_it() {
    let (fast, default) = (lines(true), lines(false));
    assert_eq!(fast.len(), 6, "{fast:#?}");
    assert_eq!(fast, default);
    assert_eq!(
        fast[0],
        "  INFO generation request_id=sg-1 route=\"chat\" status=200 model=\"DeepSeek\" ttft_ms=12.5 duration_ms=3.0 outcome=\"completed\""
    );
}

#[test]
fn timestamps_are_utc_to_the_microsecond() {
    let at = |secs: u64, micros: u64| {
        let mut s = String::new();
        timestamp(
            &mut s,
            UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros),
        );
        s
    };
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
    assert_eq!(at(1_764_613_332, 706_115), "2025-12-01T18:22:12.706115Z");
    assert_eq!(
        at(1_764_613_332, 5),
        "2025-12-01T18:22:12.000005Z",
        "the same second again"
    );
    assert_eq!(at(1_764_613_333, 0), "2025-12-01T18:22:13.000000Z", "the next second");
    assert_eq!(at(951_782_400, 1), "2000-02-29T00:00:00.000001Z", "a leap day");
    assert_eq!(at(4_102_444_799, 999_999), "2099-12-31T23:59:59.999999Z");
}
