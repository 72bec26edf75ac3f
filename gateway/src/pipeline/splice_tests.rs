//! The splice held to the two APIs' event shapes: what was sent is dropped, a straddling delta
//! cut, ids and sequence numbers rewritten, a diverging or short replay refused.

use super::*;

fn ev(name: &str, data: Value) -> Event {
    Event::from_parts(Some(name.to_owned()), data)
}

fn msg_delta(index: u64, kind: &str, field: &str, text: &str) -> Event {
    ev(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": {"type": kind, field: text}}),
    )
}

fn messages_run(id: &str, thinking: &[&str], text: &[&str]) -> Vec<Event> {
    let mut out = vec![ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": id, "usage": {"input_tokens": 9}}}),
    )];
    out.push(ev(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
    ));
    out.extend(thinking.iter().map(|t| msg_delta(0, "thinking_delta", "thinking", t)));
    out.push(ev(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": id}}),
    ));
    out.push(ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    out.push(ev(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
    ));
    out.extend(text.iter().map(|t| msg_delta(1, "text_delta", "text", t)));
    out.push(ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 1}),
    ));
    out.push(ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
    ));
    out.push(ev("message_stop", json!({"type": "message_stop"})));
    out
}

fn record(api: ReplayApi, events: &[Event]) -> Sent {
    let mut sent = Sent::new(api);
    for e in events {
        sent.record(&e.to_bytes());
    }
    sent
}

fn spliced(sent: Sent, replay: Vec<Event>) -> Result<Vec<Event>, Mismatch> {
    let mut splice = Splice::new(sent);
    let mut out = Vec::new();
    for e in replay {
        out.extend(splice.next(e)?);
    }
    splice.end()?;
    assert!(splice.finished());
    Ok(out)
}

fn kinds(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.kind().to_owned()).collect()
}

#[test]
fn a_messages_replay_goes_on_from_the_middle_of_a_delta() {
    let first = messages_run("msg_a", &["Let me", " think"], &["Hi", " there"]);
    // Cut after "Let me": message_start, the block's start and one delta went out.
    let sent = record(ReplayApi::Messages, &first[..3]);
    assert!(!sent.finished);
    // The replay chunks its text otherwise.
    let replay = messages_run("msg_b", &["Let", " me thi", "nk"], &["Hi there"]);
    let out = spliced(sent, replay).unwrap();
    assert_eq!(
        kinds(&out),
        [
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        out[0].data["delta"]["thinking"], " thi",
        "the straddling delta's new part"
    );
    assert_eq!(out[1].data["delta"]["thinking"], "nk");
    assert_eq!(out[2].data["delta"]["signature"], "msg_b");
    assert_eq!(out[5].data["delta"]["text"], "Hi there");
    let whole: String = first[..3]
        .iter()
        .chain(&out)
        .filter_map(|e| e.data["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(whole, "Let me think");
}

#[test]
fn a_cut_between_blocks_drops_the_closed_block_whole() {
    let first = messages_run("msg_a", &["a"], &["b", "c"]);
    // Up to the text block's start.
    let sent = record(ReplayApi::Messages, &first[..6]);
    let out = spliced(sent, messages_run("msg_b", &["a"], &["b", "c"])).unwrap();
    assert_eq!(out[0].data["delta"]["text"], "b");
    assert_eq!(
        kinds(&out),
        [
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
}

#[test]
fn a_replay_that_differs_or_stops_short_is_refused() {
    let first = messages_run("msg_a", &["Let me", " think"], &["Hi"]);
    let sent = record(ReplayApi::Messages, &first[..4]);
    let err = spliced(sent.clone(), messages_run("msg_b", &["Let us think"], &["Hi"])).unwrap_err();
    assert!(err.0.contains("differs"), "{err:?}");
    // The replay's thinking is shorter than what went out, then it moves on.
    let err = spliced(sent.clone(), messages_run("msg_b", &["Let me"], &["Hi"])).unwrap_err();
    assert!(err.0.contains("went on without"), "{err:?}");
    let mut splice = Splice::new(sent);
    for e in messages_run("msg_b", &["Let"], &[]).into_iter().take(3) {
        assert!(splice.next(e).unwrap().is_none());
    }
    assert!(splice.end().is_err(), "ended before reaching the cut");
}

fn responses_run(resp: &str, item: &str, deltas: &[&str]) -> Vec<Event> {
    let mut seq = 0;
    let mut next = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        ev(kind, data)
    };
    let response =
        |status: &str, output: Value| json!({"id": resp, "created_at": resp.len(), "status": status, "output": output});
    let mut out = vec![
        next(
            "response.created",
            json!({"response": response("in_progress", json!([]))}),
        ),
        next(
            "response.output_item.added",
            json!({"output_index": 0, "item": {"id": item, "type": "message"}}),
        ),
    ];
    for d in deltas {
        out.push(next(
            "response.output_text.delta",
            json!({"item_id": item, "output_index": 0, "content_index": 0, "delta": d}),
        ));
    }
    let text: String = deltas.concat();
    out.push(next(
        "response.output_text.done",
        json!({"item_id": item, "output_index": 0, "content_index": 0, "text": text}),
    ));
    let done_item = json!({"id": item, "type": "message", "content": [{"text": text}]});
    out.push(next(
        "response.output_item.done",
        json!({"output_index": 0, "item": done_item.clone()}),
    ));
    out.push(next(
        "response.completed",
        json!({"response": response("completed", json!([done_item]))}),
    ));
    out
}

#[test]
fn a_responses_replay_keeps_the_streams_ids_and_sequence() {
    let first = responses_run("resp_a", "msg_a", &["one ", "two ", "three"]);
    let sent = record(ReplayApi::Responses, &first[..4]);
    let out = spliced(sent, responses_run("resp_bb", "msg_b", &["one two", " three"])).unwrap();
    assert_eq!(out[0].data["delta"], "three", "\"one two \" went out");
    let seqs: Vec<u64> = first[..4]
        .iter()
        .chain(&out)
        .map(|e| e.data["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "one sequence");
    for e in &out {
        let text = e.data.to_string();
        assert!(!text.contains("msg_b") && !text.contains("resp_bb"), "{text}");
    }
    let completed = &out.last().unwrap().data["response"];
    assert_eq!(completed["id"], "resp_a");
    assert_eq!(completed["created_at"], 6);
    assert_eq!(completed["output"][0]["id"], "msg_a");
    assert_eq!(completed["output"][0]["content"][0]["text"], "one two three");
}

#[test]
fn events_are_read_and_written_back_as_sse() {
    let e = Event::parse(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n").unwrap();
    assert_eq!(e.kind(), "message_stop");
    assert_eq!(
        &e.to_bytes()[..],
        b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    );
    assert!(Event::parse(b": keep-alive\n\n").is_none());
}
