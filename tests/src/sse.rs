//! Server-sent event bodies read as events by eventsource-stream, the reading a client does, so
//! no test splits `data:` lines by hand (the tidy test `tidy_sse` holds the crate to that).

use std::convert::Infallible;

use eventsource_stream::Eventsource as _;
use futures_util::{FutureExt as _, StreamExt as _};

pub use eventsource_stream::Event;

/// The event name eventsource-stream gives an event without an `event:` field.
pub const UNNAMED: &str = "message";

/// The events of a complete body, in order, as a client dispatches them: an event that lacks
/// its closing blank line is not one (see [`events_and_cut`]).
pub fn events(body: &[u8]) -> Vec<Event> {
    read(String::from_utf8_lossy(body).into_owned())
}

/// The events of a complete body and, when the body stops inside an event, that event as it
/// would have read had its blank line come: what a cut stream got as far as.
pub fn events_and_cut(body: &[u8]) -> (Vec<Event>, Option<Event>) {
    let text = String::from_utf8_lossy(body).into_owned();
    let whole = read(text.clone());
    // Closing the body with a blank line dispatches the event it was cut inside, if any.
    let mut closed = read(text + "\n\n");
    let cut = (closed.len() > whole.len()).then(|| closed.pop()).flatten();
    (whole, cut)
}

/// Whether `e` is the OpenAI stream's end marker, `data: [DONE]`.
pub fn is_done(e: &Event) -> bool {
    e.event == UNNAMED && e.data == "[DONE]"
}

/// The event's JSON payload (`Null` when the data is not JSON).
pub fn json(e: &Event) -> serde_json::Value {
    serde_json::from_str(&e.data).unwrap_or(serde_json::Value::Null)
}

/// eventsource-stream's events from a whole body, as one frame. The frame is in memory, so the
/// stream never waits: one poll reads it, with no runtime (callers may be inside one). Invalid
/// UTF-8 was read as U+FFFD before (`String::from_utf8_lossy`), so nothing fails.
fn read(text: String) -> Vec<Event> {
    futures_util::stream::iter([Ok::<_, Infallible>(text)])
        .eventsource()
        .map(|e| e.expect("eventsource-stream reads any UTF-8 text"))
        .collect::<Vec<Event>>()
        .now_or_never()
        .expect("an in-memory stream is read in one poll")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_name_data_and_id() {
        let body = b"data: {\"a\":1}\n\nevent: message_stop\nid: 7\ndata: {}\n\n: ping\n\ndata: [DONE]\n\n";
        let got = events(body);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].event.as_str(), json(&got[0])["a"].as_i64()), (UNNAMED, Some(1)));
        assert_eq!((got[1].event.as_str(), got[1].id.as_str()), ("message_stop", "7"));
        assert!(is_done(&got[2]));
    }

    #[test]
    fn a_cut_event_is_not_dispatched_but_is_shown_as_cut() {
        let (whole, cut) = events_and_cut(b"event: message_start\ndata: {}\n\ndata: {\"a\":1}");
        assert_eq!(whole.len(), 1);
        assert_eq!(cut.map(|e| e.data), Some("{\"a\":1}".to_owned()));
        assert_eq!(events_and_cut(b"data: x\n\n").1, None, "a complete body has no cut");
        assert_eq!(
            events_and_cut(b"data: x\r\n\r\n").1,
            None,
            "CRLF framing is complete too"
        );
    }

    #[test]
    fn invalid_utf8_reads_as_replacement_characters() {
        let got = events(b"data: a\xffb\n\n");
        assert_eq!(got[0].data, "a\u{fffd}b");
    }
}
