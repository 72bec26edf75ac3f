//! Continuing a cut Messages or Responses stream by replay (docs/resume.md): vLLM's streams of
//! these APIs carry no token ids, but at temperature 0 the same request run again makes the same
//! text. `Sent` records what the client already got, event by event; `Splice` passes on the
//! replay's events past that point — a delta that straddles it cut to its new part, the events
//! already sent dropped, the replay's ids, sequence numbers and times rewritten to the stream's
//! own — and refuses a replay whose text does not run through what was sent.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::api::resume::ReplayApi;

/// One event of a stream: its `event:` name (absent for a bare `data:` line) and its data.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    name: Option<String>,
    pub(crate) data: Value,
}

impl Event {
    /// Reads one whole SSE event as a client does (eventsource-stream); `None` for a comment or
    /// data that is not JSON.
    pub(crate) fn parse(raw: &[u8]) -> Option<Event> {
        use eventsource_stream::Eventsource as _;
        use futures_util::{FutureExt as _, StreamExt as _};
        let frame = Ok::<_, std::convert::Infallible>(Bytes::copy_from_slice(raw));
        let mut events = futures_util::stream::iter([frame]).eventsource();
        let event = events.next().now_or_never()??.ok()?;
        let data = serde_json::from_str(&event.data).ok()?;
        let name = (event.event != "message").then_some(event.event);
        Some(Event { name, data })
    }

    pub(crate) fn from_parts(name: Option<String>, data: Value) -> Event {
        Event { name, data }
    }

    pub(crate) fn kind(&self) -> &str {
        self.data["type"].as_str().or(self.name.as_deref()).unwrap_or("")
    }

    pub(crate) fn to_bytes(&self) -> Bytes {
        match &self.name {
            Some(name) => Bytes::from(format!("event: {name}\ndata: {}\n\n", self.data)),
            None => Bytes::from(format!("data: {}\n\n", self.data)),
        }
    }
}

/// Where an event's text goes: an Anthropic content block's delta (by index and delta type),
/// a Responses item part's delta (by output and content index); or the key of an event that
/// carries no text to splice (sent once).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Text { key: String, text: String },
    Whole(String),
}

fn index(v: &Value) -> i64 {
    v.as_i64().unwrap_or(-1)
}

fn place(api: ReplayApi, e: &Event) -> Place {
    let d = &e.data;
    let kind = e.kind();
    match api {
        ReplayApi::Messages => {
            let at = index(&d["index"]);
            let delta_kind = d["delta"]["type"].as_str().unwrap_or("");
            let field = match delta_kind {
                "text_delta" => "text",
                "thinking_delta" => "thinking",
                "input_json_delta" => "partial_json",
                // A signature (and anything unknown) is sent whole, once a block.
                _ => return Place::Whole(format!("{kind}/{at}/{delta_kind}")),
            };
            let text = d["delta"][field].as_str().unwrap_or("").to_owned();
            Place::Text {
                key: format!("{at}/{delta_kind}"),
                text,
            }
        }
        ReplayApi::Responses => {
            let (out, part) = (index(&d["output_index"]), index(&d["content_index"]));
            match d["delta"].as_str() {
                Some(text) if kind.ends_with(".delta") => Place::Text {
                    key: format!("{kind}/{out}/{part}"),
                    text: text.to_owned(),
                },
                _ => Place::Whole(format!("{kind}/{out}/{part}")),
            }
        }
    }
}

/// Whether `e` ends its stream's generation.
fn ends(e: &Event) -> bool {
    matches!(
        e.kind(),
        "message_stop" | "response.completed" | "response.incomplete" | "response.failed"
    )
}

/// What the client of a replayable stream got, recorded as it went out.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    api: ReplayApi,
    /// The keys of the events without text that went out.
    whole: Vec<String>,
    /// The text that went out, by place, in order.
    texts: Vec<(String, String)>,
    /// Responses: the response's id and creation time, and each output item's id by index.
    response: Option<(Value, Value)>,
    items: Vec<(i64, Value)>,
    /// Responses: the next event's sequence number.
    next_seq: u64,
    /// The generation's end went out.
    pub(crate) finished: bool,
}

impl Sent {
    pub(crate) fn new(api: ReplayApi) -> Sent {
        Sent {
            api,
            whole: Vec::new(),
            texts: Vec::new(),
            response: None,
            items: Vec::new(),
            next_seq: 0,
            finished: false,
        }
    }

    /// Records one event that goes to the client.
    pub(crate) fn record(&mut self, raw: &[u8]) {
        let Some(e) = Event::parse(raw) else { return };
        let d = &e.data;
        if ends(&e) || (e.kind() == "message_delta" && !d["delta"]["stop_reason"].is_null()) {
            self.finished = true;
        }
        match e.kind() {
            "response.created" => {
                self.response = Some((d["response"]["id"].clone(), d["response"]["created_at"].clone()))
            }
            "response.output_item.added" => self.items.push((index(&d["output_index"]), d["item"]["id"].clone())),
            _ => {}
        }
        if let Some(seq) = d["sequence_number"].as_u64() {
            self.next_seq = seq + 1;
        }
        match place(self.api, &e) {
            Place::Whole(key) => self.whole.push(key),
            Place::Text { key, text } => match self.texts.iter_mut().find(|(k, _)| *k == key) {
                Some((_, t)) => t.push_str(&text),
                None => self.texts.push((key, text)),
            },
        }
    }

    fn text(&self, key: &str) -> &str {
        self.texts.iter().find(|(k, _)| k == key).map_or("", |(_, t)| t)
    }

    fn item_id(&self, at: i64) -> Option<&Value> {
        self.items.iter().find(|(i, _)| *i == at).map(|(_, id)| id)
    }
}

/// The replay does not run through what was sent: not the same generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch(pub(crate) String);

/// A replay being spliced into the stream that `sent` describes.
#[derive(Debug)]
pub(crate) struct Splice {
    sent: Sent,
    /// How much of each place's text the replay has made so far.
    replayed: Vec<(String, usize)>,
    /// Every place's sent text is behind the replay: what follows is new.
    caught_up: bool,
    /// The replay's generation ended.
    finished: bool,
}

impl Splice {
    pub(crate) fn new(sent: Sent) -> Splice {
        Splice {
            sent,
            replayed: Vec::new(),
            caught_up: false,
            finished: false,
        }
    }

    /// The client's part of the replay's next event: none when it was sent already.
    pub(crate) fn next(&mut self, mut e: Event) -> Result<Option<Event>, Mismatch> {
        self.finished |= ends(&e);
        match place(self.sent.api, &e) {
            Place::Whole(key) if self.sent.whole.contains(&key) && !self.caught_up => return Ok(None),
            Place::Whole(_) => {}
            Place::Text { key, text } => match self.text_past(&key, &text)? {
                None => return Ok(None),
                Some(rest) if rest.len() < text.len() => set_delta(self.sent.api, &mut e, &rest),
                Some(_) => {}
            },
        }
        self.check_caught_up()?;
        self.rewrite(&mut e);
        Ok(Some(e))
    }

    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// The replay ended: it must have reached the cut.
    pub(crate) fn end(&mut self) -> Result<(), Mismatch> {
        self.check_caught_up()
    }

    /// The part of a delta of `key` past what was sent; none when all of it was.
    fn text_past(&mut self, key: &str, text: &str) -> Result<Option<String>, Mismatch> {
        let sent = self.sent.text(key);
        let done = match self.replayed.iter_mut().find(|(k, _)| k == key) {
            Some((_, n)) => n,
            None => {
                self.replayed.push((key.to_owned(), 0));
                &mut self.replayed.last_mut().expect("just pushed").1
            }
        };
        let from = *done;
        *done += text.len();
        if from >= sent.len() {
            return Ok(Some(text.to_owned()));
        }
        let overlap = (sent.len() - from).min(text.len());
        if sent.as_bytes()[from..from + overlap] != text.as_bytes()[..overlap] {
            return Err(Mismatch(format!(
                "the replay's text at {key} differs from what was sent after {from} bytes"
            )));
        }
        Ok(text.get(overlap..).filter(|rest| !rest.is_empty()).map(str::to_owned))
    }

    /// Once something new goes out, every place's sent text must be behind the replay.
    fn check_caught_up(&mut self) -> Result<(), Mismatch> {
        if self.caught_up {
            return Ok(());
        }
        for (key, text) in &self.sent.texts {
            let made = self.replayed.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n);
            if made < text.len() {
                return Err(Mismatch(format!(
                    "the replay went on without the {} bytes sent at {key} (it made {made})",
                    text.len()
                )));
            }
        }
        self.caught_up = true;
        Ok(())
    }

    /// Responses: the stream's own response id, creation time, item ids and sequence numbers.
    fn rewrite(&mut self, e: &mut Event) {
        if self.sent.api != ReplayApi::Responses {
            return;
        }
        let d = &mut e.data;
        if d.get("sequence_number").is_some() {
            d["sequence_number"] = json!(self.sent.next_seq);
            self.sent.next_seq += 1;
        }
        let at = index(&d["output_index"]);
        if let Some(id) = self.sent.item_id(at).cloned() {
            if d.get("item_id").is_some() {
                d["item_id"] = id.clone();
            }
            if d["item"].get("id").is_some() {
                d["item"]["id"] = id;
            }
        }
        let Some((id, created)) = self.sent.response.clone() else {
            return;
        };
        if let Some(response) = d.get_mut("response").filter(|r| r.is_object()) {
            response["id"] = id;
            response["created_at"] = created;
            let items = response["output"].as_array_mut().into_iter().flatten().enumerate();
            for (i, item) in items {
                if let Some(own) = self.sent.item_id(i as i64) {
                    item["id"] = own.clone();
                }
            }
        }
    }
}

fn set_delta(api: ReplayApi, e: &mut Event, rest: &str) {
    match api {
        ReplayApi::Responses => e.data["delta"] = json!(rest),
        ReplayApi::Messages => {
            let field = match e.data["delta"]["type"].as_str() {
                Some("thinking_delta") => "thinking",
                Some("input_json_delta") => "partial_json",
                _ => "text",
            };
            e.data["delta"][field] = json!(rest);
        }
    }
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
