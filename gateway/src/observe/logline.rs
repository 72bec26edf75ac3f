//! The text log line, laid out exactly as tracing-subscriber's default format without target
//! (`2026-12-01T18:42:12.706115Z  INFO generation route="chat" status=200 …`), written with a
//! tenth of its instructions: the timestamp from digits, plain strings and integers without
//! the formatting machinery. The access line of every request is one of these. Events it does
//! not render the same way (an error value with sources, raw identifiers) go to the default
//! format, as do coloured lines for a terminal.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The fast text format, with the default one (same layout) for what it leaves to it.
pub(crate) struct TextLine {
    default: Format,
}

impl TextLine {
    pub(crate) fn new() -> Self {
        Self {
            default: Format::default().with_target(false).with_ansi(false),
        }
    }
}

impl<S, N> FormatEvent<S, N> for TextLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        thread_local!(static LINE: RefCell<String> = const { RefCell::new(String::new()) });
        let done = LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            render(&mut line, SystemTime::now(), event).then(|| w.write_str(&line))
        });
        match done {
            Some(result) => result,
            None => self.default.format_event(ctx, w, event),
        }
    }
}

/// Writes the line for `event` at `now` into `out`; false when the default format must write it.
fn render(out: &mut String, now: SystemTime, event: &Event<'_>) -> bool {
    timestamp(out, now);
    out.push_str(match *event.metadata().level() {
        Level::ERROR => " ERROR ",
        Level::WARN => "  WARN ",
        Level::INFO => "  INFO ",
        Level::DEBUG => " DEBUG ",
        Level::TRACE => " TRACE ",
    });
    let mut fields = Fields {
        out,
        first: true,
        fallback: false,
    };
    event.record(&mut fields);
    if fields.fallback {
        return false;
    }
    out.push('\n');
    true
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC, microseconds), as the default format's timer writes it.
/// The date and time of day are formatted once a second (humantime: ~400 instructions a call,
/// a line per request), the microseconds every time.
fn timestamp(out: &mut String, now: SystemTime) {
    thread_local!(static SECOND: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) });
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    SECOND.with_borrow_mut(|(at, text)| {
        if *at != secs || text.is_empty() {
            text.clear();
            let _ = write!(
                text,
                "{}",
                humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs))
            );
            text.pop(); // the `Z`, written after the fraction
            *at = secs;
        }
        out.push_str(text);
    });
    let mut micros = itoa::Buffer::new();
    let micros = micros.format(since.subsec_micros());
    out.push('.');
    out.push_str(&"000000"[micros.len()..]);
    out.push_str(micros);
    out.push('Z');
}

/// The fields as the default visitor writes them: the message bare (control characters
/// escaped), then ` name=value` with values in their `Debug` form.
struct Fields<'a> {
    out: &'a mut String,
    first: bool,
    fallback: bool,
}

impl Fields<'_> {
    /// Starts a field; false when the default format must write this event.
    fn begin(&mut self, field: &Field) -> bool {
        let name = field.name();
        if name.starts_with("r#") || name.starts_with("log.") {
            self.fallback = true;
            return false;
        }
        if !std::mem::take(&mut self.first) {
            self.out.push(' ');
        }
        if name != "message" {
            self.out.push_str(name);
            self.out.push('=');
        }
        true
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.begin(field) {
            return;
        }
        if field.name() == "message" {
            sanitized(self.out, value);
        } else if value
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
        {
            self.out.push('"');
            self.out.push_str(value);
            self.out.push('"');
        } else {
            let _ = write!(self.out, "{value:?}");
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.begin(field) {
            self.out.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.begin(field) {
            self.out.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.begin(field) && !push_tenths(self.out, value) {
            let _ = write!(self.out, "{value:?}");
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.begin(field) {
            self.out.push_str(if value { "true" } else { "false" });
        }
    }

    fn record_error(&mut self, _field: &Field, _value: &(dyn std::error::Error + 'static)) {
        self.fallback = true;
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.begin(field) {
            return;
        }
        if field.name() == "message" {
            // Written in place; only a message with control characters is rewritten escaped.
            let start = self.out.len();
            let _ = write!(self.out, "{value:?}");
            if needs_escaping(&self.out[start..]) {
                let text = self.out.split_off(start);
                sanitized(self.out, &text);
            }
        } else {
            let _ = write!(self.out, "{value:?}");
        }
    }
}

/// A value with at most one decimal (the log's milliseconds, `observe::ms`) as `Debug` writes
/// it (`3.0`, `12.5`): the shortest decimal that reads back as the same double is then that
/// one-decimal number. False for anything else, which `Debug` writes.
fn push_tenths(out: &mut String, value: f64) -> bool {
    let tenths = (value * 10.0).round();
    if value.is_sign_negative() || !(0.0..1e15).contains(&tenths) || tenths / 10.0 != value {
        return false;
    }
    let tenths = tenths as u64;
    out.push_str(itoa::Buffer::new().format(tenths / 10));
    out.push('.');
    out.push(char::from(b'0' + (tenths % 10) as u8));
    true
}

fn needs_escaping(text: &str) -> bool {
    text.chars()
        .any(|c| matches!(c, '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}'))
}

/// The message with the control characters a terminal would act on escaped, as the default
/// format escapes them.
fn sanitized(out: &mut String, text: &str) {
    if !needs_escaping(text) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\x1b' => out.push_str("\\x1b"),
            '\x07' => out.push_str("\\x07"),
            '\x08' => out.push_str("\\x08"),
            '\x0c' => out.push_str("\\x0c"),
            '\x7f' => out.push_str("\\x7f"),
            c @ '\u{80}'..='\u{9f}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
#[path = "logline_tests.rs"]
mod tests;
