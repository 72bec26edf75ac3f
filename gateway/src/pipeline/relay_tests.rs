//! The relay's tap: events cut where eventsource-stream reads them, the fingerprint splice and
//! the one-frame coalescing.

use super::*;
use serde_json::json;

#[test]
fn fingerprint_is_spliced_before_the_closing_brace() {
    let mut chunk = br#"data: {"id":"x","choices":[{"index":0,"finish_reason":"stop"}]}"#.to_vec();
    chunk.extend_from_slice(b"\n\n");
    splice_fingerprint(&mut chunk, &json!("fp-1"));
    assert_eq!(
        String::from_utf8(chunk).unwrap(),
        "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}],\"system_fingerprint\":\"fp-1\"}\n\n"
    );
}

#[test]
fn the_usage_chunks_fingerprint_is_read_and_its_absence_is_null() {
    let chunk = br#"{"id":"x","choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"fp-9"}"#;
    assert_eq!(fingerprint_of(chunk), json!("fp-9"));
    assert_eq!(fingerprint_of(br#"{"id":"x","choices":[]}"#), Value::Null);
    assert_eq!(fingerprint_of(b"not json"), Value::Null);
}

#[test]
fn queued_events_leave_as_one_frame() {
    let mut q: VecDeque<Bytes> = VecDeque::new();
    assert_eq!(coalesce(&mut q), None);
    q.extend([Bytes::from_static(b"data: a\n\n"), Bytes::from_static(b"data: b\n\n")]);
    assert_eq!(coalesce(&mut q).as_deref(), Some(&b"data: a\n\ndata: b\n\n"[..]));
    assert!(q.is_empty());
}

fn tap() -> (tokio::runtime::Runtime, Tap) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let tap = {
        let _entered = rt.enter();
        let limits = crate::control::admission::QueueLimits {
            depth: 8,
            bytes: 1 << 20,
            timeout: Duration::from_secs(60),
        };
        Tap::chat({
            let c = GatewayControl::new(limits);
            c.set_mode(SpecMethod::Dspark);
            c
        })
    };
    (rt, tap)
}

#[test]
fn whole_events_are_cut_from_their_frame_and_only_an_unfinished_tail_is_kept() {
    let (_rt, mut tap) = tap();
    let frame = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: c");
    let out = tap.feed(frame.clone()).unwrap();
    assert_eq!(out, "data: a\n\ndata: b\n\n");
    assert_eq!(&tap.0.buf[..], b"data: c");
    // The tail's end arrives split over two frames, the blank line across them.
    assert_eq!(tap.feed(Bytes::from_static(b"\n")), None);
    assert_eq!(
        tap.feed(Bytes::from_static(b"\ndata: d\n\n")).unwrap(),
        "data: c\n\ndata: d\n\n"
    );
    assert_eq!(tap.0.buf.capacity(), 0, "nothing unfinished: no buffer kept");
    // One event alone is passed on as the very bytes that arrived.
    let one = Bytes::from_static(b"data: e\n\n");
    assert_eq!(tap.feed(one.clone()).unwrap().as_ptr(), one.as_ptr());
}

#[test]
fn events_end_at_blank_lines_of_lf_or_crlf() {
    assert_eq!(event_end(b"data: a\n\ndata: b", 0), Some(9));
    assert_eq!(event_end(b"data: a\n", 0), None);
    assert_eq!(event_end(b"xx\n\n", 2), Some(4));
    assert_eq!(event_end(b"data: a\r\n\r\ndata: b", 0), Some(11));
    assert_eq!(event_end(b"data: a\r\ndata: b\r\n", 0), None);
}

/// Streams of the shapes SSE allows: LF and CRLF line ends, comments, several `data:`
/// lines, named events, an `id:`.
const STREAMS: &[&str] = &[
    "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n",
    "data: one\r\n\r\ndata: two\r\n\r\n",
    ": keep-alive\n\ndata: x\n\n: another\r\n\r\ndata: y\r\n\r\n",
    "data: first line\ndata: second line\n\nevent: message_stop\ndata: {}\n\n",
    "event: response.completed\r\nid: 7\r\ndata: {\"r\":1}\r\n\r\ndata: z\n\r\n",
];

/// What eventsource-stream reads from `chunks` (each a frame of the same stream).
fn read_events(rt: &tokio::runtime::Runtime, chunks: Vec<Bytes>) -> Vec<(String, String)> {
    use eventsource_stream::Eventsource as _;
    use futures_util::StreamExt as _;
    let frames = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
    rt.block_on(
        frames
            .eventsource()
            .map(|e| e.expect("a valid stream"))
            .collect::<Vec<_>>(),
    )
    .into_iter()
    .map(|e| (e.event, e.data))
    .collect()
}

/// The events the tap cuts from `frames`, each as the bytes it passes on.
fn cut(tap: &mut Tap, frames: &[&[u8]]) -> Vec<Bytes> {
    for f in frames {
        tap.0.on_data(Bytes::copy_from_slice(f));
    }
    tap.0.out.drain(..).collect()
}

#[test]
fn the_tap_cuts_events_where_eventsource_stream_reads_them_at_every_split() {
    let (rt, _) = tap();
    for stream in STREAMS {
        let bytes = stream.as_bytes();
        let whole = read_events(&rt, vec![Bytes::copy_from_slice(bytes)]);
        assert!(!whole.is_empty(), "{stream:?}");
        for at in 0..=bytes.len() {
            let (_, mut t) = tap();
            let events = cut(&mut t, &[&bytes[..at], &bytes[at..]]);
            assert_eq!(events.concat(), bytes, "the tap passes every byte on, split at {at}");
            // Each cut event alone reads as the events of the whole stream, in order.
            let one_by_one: Vec<_> = events.iter().flat_map(|e| read_events(&rt, vec![e.clone()])).collect();
            assert_eq!(one_by_one, whole, "{stream:?} split at {at}");
        }
        let (_, mut t) = tap();
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(cut(&mut t, &singles).concat(), bytes, "byte by byte");
    }
}
