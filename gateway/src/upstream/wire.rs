//! The HTTP/1.1 wire of the upstream client, without I/O: a request head written from the
//! client's headers, a response head parsed (`httparse`) into status, headers and framing, and
//! the body's framing undone by one decoder state machine (length, chunked, until close, none).
//! Pure functions over byte buffers, so every framing case is unit-tested without a socket.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use bytes::{Buf, Bytes, BytesMut};

/// Most response headers accepted from rank 0 (uvicorn sends about five).
const MAX_HEADERS: usize = 64;
/// Longest response head, and longest chunk-size or trailer line, before the answer is refused.
const MAX_HEAD: usize = 64 * 1024;
const MAX_LINE: usize = 4 * 1024;

/// Why rank 0's answer could not be read as HTTP/1.1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("the response head is malformed: {0}")]
    Head(&'static str),
    #[error("the response head is over {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("a chunk of the body is malformed: {0}")]
    Chunk(&'static str),
    #[error("the connection closed before the answer was complete")]
    Incomplete,
}

/// Writes the request head: request line, Host, the client's end-to-end headers (hop-by-hop,
/// length, Expect — the body is already whole — and the ones the gateway sets left out),
/// Authorization when the gateway holds rank 0's key, the request id and the body's length.
pub(crate) fn encode_request(out: &mut Vec<u8>, req: &RequestHead<'_>, skip: impl Fn(&HeaderName) -> bool) {
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(req.host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in req.headers {
        let ours = name == header::CONTENT_LENGTH
            || name == header::EXPECT
            || name == "x-request-id"
            || (req.authorization.is_some() && name == header::AUTHORIZATION);
        if !ours && !skip(name) {
            line(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if let Some(key) = req.authorization {
        line(out, b"authorization", key.as_bytes());
    }
    if HeaderValue::from_str(req.request_id).is_ok() {
        line(out, b"x-request-id", req.request_id.as_bytes());
    }
    // Methods that carry a body say its length even when it is empty; GET and HEAD without one
    // say nothing, as hyper did.
    let bodied = !matches!(
        req.method,
        &Method::GET | &Method::HEAD | &Method::DELETE | &Method::OPTIONS
    );
    if bodied || req.body_len > 0 {
        line(
            out,
            b"content-length",
            itoa::Buffer::new().format(req.body_len).as_bytes(),
        );
    }
    out.extend_from_slice(b"\r\n");
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// What `encode_request` writes.
#[derive(Debug)]
pub(crate) struct RequestHead<'a> {
    pub(crate) method: &'a Method,
    pub(crate) path: &'a str,
    pub(crate) host: &'a str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) authorization: Option<&'a HeaderValue>,
    pub(crate) request_id: &'a str,
    pub(crate) body_len: usize,
}

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Decoder,
    /// The connection may carry another request after this answer's body.
    pub(crate) keep_alive: bool,
}

/// Parses one response head from the front of `buf`, consuming it: `None` while incomplete.
/// Informational answers (1xx) are consumed and skipped: the request is sent whole, so a
/// `100 Continue` carries nothing for the gateway. The header values share the head's bytes
/// (no copy), and the framing headers (length, transfer-encoding, connection, keep-alive) are
/// consumed into `ResponseHead::body` and `keep_alive` rather than passed on: whoever sends
/// the answer on frames it anew.
pub(crate) fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Option<ResponseHead>, WireError> {
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut slots);
        let len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(WireError::HeadTooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::Head("over 64 headers")),
            Err(_) => return Err(WireError::Head("not an HTTP/1.x status line and headers")),
        };
        let code = resp.code.ok_or(WireError::Head("no status code"))?;
        let status = StatusCode::from_u16(code).map_err(|_| WireError::Head("status code out of range"))?;
        if status.is_informational() && code != 101 {
            buf.advance(len);
            continue;
        }
        let http11 = resp.version == Some(1);
        // Where each header sits in the head, so the values can be cut from it once it is frozen.
        let base = buf.as_ptr() as usize;
        let at = |s: &[u8]| {
            let start = s.as_ptr() as usize - base;
            start..start + s.len()
        };
        let mut spans: [HeaderSpan; MAX_HEADERS] = std::array::from_fn(|_| HeaderSpan::default());
        let count = resp.headers.len();
        for (span, h) in spans.iter_mut().zip(resp.headers.iter()) {
            *span = HeaderSpan {
                name: at(h.name.as_bytes()),
                value: at(h.value),
            };
        }
        let head = buf.split_to(len).freeze();
        return response_head(status, http11, &head, &spans[..count], method).map(Some);
    }
}

/// Where one header's name and value sit in the response head.
#[derive(Debug, Default, Clone)]
struct HeaderSpan {
    name: std::ops::Range<usize>,
    value: std::ops::Range<usize>,
}

fn response_head(
    status: StatusCode,
    http11: bool,
    head: &Bytes,
    spans: &[HeaderSpan],
    method: &Method,
) -> Result<ResponseHead, WireError> {
    let mut headers = HeaderMap::with_capacity(spans.len());
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut keep_alive = http11;
    for span in spans {
        let name = HeaderName::from_bytes(&head[span.name.clone()])
            .map_err(|_| WireError::Head("a header name is invalid"))?;
        let value = &head[span.value.clone()];
        if name == header::CONTENT_LENGTH {
            let n = std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or(WireError::Head("content-length is not a number"))?;
            if length.is_some_and(|l| l != n) {
                return Err(WireError::Head("two different content-lengths"));
            }
            length = Some(n);
        } else if name == header::TRANSFER_ENCODING {
            chunked = last_token(value).eq_ignore_ascii_case(b"chunked");
            if !chunked {
                keep_alive = false;
            }
        } else if name == header::CONNECTION {
            keep_alive = connection_keeps(value, keep_alive);
        } else if name != "keep-alive" {
            let value = HeaderValue::from_maybe_shared(head.slice(span.value.clone()))
                .map_err(|_| WireError::Head("a header value is invalid"))?;
            headers.append(name, value);
        }
    }
    let bodiless = method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status == StatusCode::SWITCHING_PROTOCOLS;
    let body = match (bodiless, chunked, length) {
        (true, _, _) => Decoder::done(),
        (false, true, _) => Decoder::chunked(),
        (false, false, Some(n)) => Decoder::length(n),
        (false, false, None) => {
            keep_alive = false;
            Decoder {
                state: State::UntilClose,
            }
        }
    };
    Ok(ResponseHead {
        status,
        headers,
        body,
        keep_alive,
    })
}

fn last_token(value: &[u8]) -> &[u8] {
    let last = value.rsplit(|b| *b == b',').next().unwrap_or(value);
    last.trim_ascii()
}

fn connection_keeps(value: &[u8], default: bool) -> bool {
    let mut keep = default;
    for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
        if token.eq_ignore_ascii_case(b"close") {
            return false;
        }
        if token.eq_ignore_ascii_case(b"keep-alive") {
            keep = true;
        }
    }
    keep
}

/// Where the body's framing stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `n` more bytes of a Content-Length body.
    Length(usize),
    /// Reading a chunk-size line.
    ChunkSize,
    /// `n` more bytes of the current chunk.
    ChunkData(usize),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Trailer lines after the last chunk, up to the empty line.
    Trailers,
    /// The body runs until the peer closes the connection.
    UntilClose,
    Done,
}

/// What one decoding step found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Body bytes, without framing.
    Data(Bytes),
    /// More bytes must be read first.
    NeedMore,
    /// The body has ended.
    Done,
}

/// Undoes a body's framing over the bytes read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoder {
    state: State,
}

impl Decoder {
    pub(crate) fn length(n: usize) -> Decoder {
        Decoder {
            state: if n == 0 { State::Done } else { State::Length(n) },
        }
    }

    pub(crate) fn chunked() -> Decoder {
        Decoder {
            state: State::ChunkSize,
        }
    }

    pub(crate) fn done() -> Decoder {
        Decoder { state: State::Done }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The body's bytes still to come, when its length is known.
    pub(crate) fn remaining(&self) -> Option<usize> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// The peer closed the connection: the end of an until-close body, an error otherwise.
    pub(crate) fn at_eof(&mut self) -> Result<(), WireError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(WireError::Incomplete),
        }
    }

    /// Takes the next body bytes from the front of `buf`, with the framing before and after
    /// them: a chunk's trailing CRLF, the next size line and the last chunk's trailers are
    /// consumed as soon as they are there, so the body is known to have ended with its last
    /// bytes and no framing is left holding the read's buffer.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, WireError> {
        self.settle(buf)?;
        match self.state {
            State::Done => Ok(Step::Done),
            State::Length(n) | State::ChunkData(n) if !buf.is_empty() => {
                let take = n.min(buf.len());
                self.state = match (self.state, n - take) {
                    (State::Length(_), 0) => State::Done,
                    (State::Length(_), left) => State::Length(left),
                    (_, 0) => State::ChunkEnd,
                    (_, left) => State::ChunkData(left),
                };
                let data = buf.split_to(take).freeze();
                self.settle(buf)?;
                Ok(Step::Data(data))
            }
            State::UntilClose if !buf.is_empty() => Ok(Step::Data(buf.split().freeze())),
            _ => Ok(Step::NeedMore),
        }
    }

    /// Consumes the framing lines at the front of `buf`, up to body bytes or the end of `buf`.
    fn settle(&mut self, buf: &mut BytesMut) -> Result<(), WireError> {
        loop {
            let framing = matches!(self.state, State::ChunkSize | State::ChunkEnd | State::Trailers);
            if !framing {
                return Ok(());
            }
            let Some(line) = take_line(buf)? else {
                return Ok(());
            };
            self.state = match self.state {
                State::ChunkSize => match chunk_size(&line)? {
                    0 => State::Trailers,
                    size => State::ChunkData(size),
                },
                State::ChunkEnd if line.is_empty() => State::ChunkSize,
                State::ChunkEnd => return Err(WireError::Chunk("no CRLF after the chunk's data")),
                State::Trailers if line.is_empty() => State::Done,
                other => other,
            };
        }
    }
}

/// One line from the front of `buf` without its line ending (CRLF, or a bare LF).
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, WireError> {
    match memchr::memchr(b'\n', buf) {
        Some(end) => {
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.truncate(end - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(WireError::Chunk("a line is over 4 KiB")),
        None => Ok(None),
    }
}

/// The hexadecimal size of a chunk-size line, extensions (`;…`) ignored.
fn chunk_size(line: &[u8]) -> Result<usize, WireError> {
    let digits = line.split(|b| *b == b';').next().unwrap_or(line).trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(WireError::Chunk("the chunk size is not a hexadecimal number"));
    }
    digits.iter().try_fold(0usize, |acc, b| {
        let d = (*b as char)
            .to_digit(16)
            .ok_or(WireError::Chunk("the chunk size is not a hexadecimal number"))?;
        Ok(acc * 16 + d as usize)
    })
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
