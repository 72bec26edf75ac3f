//! The upstream wire without sockets: request heads as written, response heads as parsed, and
//! every body framing decoded whole and split at every byte.

use super::*;

fn head(headers: &HeaderMap, method: &Method, body_len: usize, key: Option<&HeaderValue>) -> String {
    let mut out = Vec::new();
    let req = RequestHead {
        method,
        path: "/v1/chat/completions?x=1",
        host: "127.0.0.1:8000",
        headers,
        authorization: key,
        request_id: "req-1",
        body_len,
    };
    encode_request(&mut out, &req, |n| n == header::CONNECTION || n == header::HOST);
    String::from_utf8(out).unwrap()
}

#[test]
fn a_request_head_carries_the_clients_end_to_end_headers_and_the_gateways_own() {
    let mut h = HeaderMap::new();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    h.insert(header::HOST, HeaderValue::from_static("client.example"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
    h.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
    h.insert("x-request-id", HeaderValue::from_static("client-id"));
    h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer client"));
    h.append("x-multi", HeaderValue::from_static("a"));
    h.append("x-multi", HeaderValue::from_static("b"));
    let key = HeaderValue::from_static("Bearer rank0");
    assert_eq!(
        head(&h, &Method::POST, 12, Some(&key)),
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n\
         x-multi: a\r\nx-multi: b\r\nauthorization: Bearer rank0\r\nx-request-id: req-1\r\ncontent-length: 12\r\n\r\n"
    );
    // Without a key of its own the gateway forwards the client's Authorization.
    let own = head(&h, &Method::POST, 0, None);
    assert!(own.contains("\r\nauthorization: Bearer client\r\n"), "{own}");
    assert!(own.ends_with("\r\ncontent-length: 0\r\n\r\n"), "{own}");
}

#[test]
fn a_get_without_a_body_says_no_length() {
    let text = head(&HeaderMap::new(), &Method::GET, 0, None);
    assert_eq!(
        text,
        "GET /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8000\r\nx-request-id: req-1\r\n\r\n"
    );
    assert!(head(&HeaderMap::new(), &Method::POST, 123_456_789, None).contains("content-length: 123456789\r\n"));
}

fn parse(text: &[u8], method: &Method) -> (Result<Option<ResponseHead>, WireError>, BytesMut) {
    let mut buf = BytesMut::from(text);
    (parse_response(&mut buf, method), buf)
}

/// Decodes all of `buf`, fed one byte at a time when `bytewise`, into the body and whether it ended.
fn decode_all(mut d: Decoder, wire: &[u8], bytewise: bool) -> Result<(Vec<u8>, bool), WireError> {
    let mut body = Vec::new();
    let mut buf = BytesMut::new();
    let step = if bytewise { 1 } else { wire.len().max(1) };
    for piece in wire.chunks(step) {
        buf.extend_from_slice(piece);
        loop {
            match d.decode(&mut buf)? {
                Step::Data(b) => body.extend_from_slice(&b),
                Step::NeedMore => break,
                Step::Done => return Ok((body, true)),
            }
        }
    }
    Ok((body, d.is_done()))
}

#[test]
fn a_length_body_is_parsed_and_its_head_consumed() {
    let (r, rest) = parse(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello",
        &Method::POST,
    );
    let h = r.unwrap().unwrap();
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.headers[header::CONTENT_TYPE], "application/json");
    assert!(
        !h.headers.contains_key(header::CONTENT_LENGTH),
        "framing is consumed, not passed on"
    );
    assert!(h.keep_alive);
    assert_eq!(h.body.remaining(), Some(5));
    assert_eq!(&rest[..], b"hello");
    for bytewise in [false, true] {
        assert_eq!(
            decode_all(h.body.clone(), &rest, bytewise).unwrap(),
            (b"hello".to_vec(), true)
        );
    }
}

#[test]
fn an_incomplete_head_asks_for_more_and_a_broken_one_is_an_error() {
    assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-len", &Method::GET)
        .0
        .unwrap()
        .is_none());
    assert_eq!(
        parse(b"SMTP ready\r\n\r\n", &Method::GET).0.unwrap_err(),
        WireError::Head("not an HTTP/1.x status line and headers")
    );
    assert_eq!(
        parse(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", &Method::GET)
            .0
            .unwrap_err(),
        WireError::Head("content-length is not a number")
    );
    assert_eq!(
        parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            &Method::GET
        )
        .0
        .unwrap_err(),
        WireError::Head("two different content-lengths")
    );
    let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
    assert_eq!(
        parse(huge.as_bytes(), &Method::GET).0.unwrap_err(),
        WireError::HeadTooLarge
    );
}

#[test]
fn informational_answers_are_skipped() {
    let (r, rest) = parse(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        &Method::POST,
    );
    assert_eq!(r.unwrap().unwrap().status, StatusCode::CREATED);
    assert_eq!(&rest[..], b"ok");
}

#[test]
fn keep_alive_follows_version_and_connection() {
    let keeps = |text: &[u8]| parse(text, &Method::GET).0.unwrap().unwrap().keep_alive;
    assert!(!keeps(
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    ));
    assert!(!keeps(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
    assert!(keeps(
        b"HTTP/1.0 200 OK\r\nconnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n"
    ));
    // A body that runs until close cannot be followed by another answer.
    assert!(!keeps(b"HTTP/1.1 200 OK\r\n\r\n"));
}

#[test]
fn bodiless_answers_have_no_body_whatever_their_length_says() {
    let done = |text: &[u8], m: &Method| parse(text, m).0.unwrap().unwrap().body.is_done();
    assert!(done(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n", &Method::HEAD));
    assert!(done(b"HTTP/1.1 204 No Content\r\n\r\n", &Method::GET));
    assert!(done(
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",
        &Method::GET
    ));
    assert!(done(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", &Method::GET));
}

#[test]
fn a_chunked_body_decodes_whole_and_split_at_every_byte() {
    let (r, rest) = parse(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
          f\r\ndata: {\"a\":1}\n\n\r\n6;ext=1\r\n\n\ndata\r\n0\r\nx-trailer: 1\r\n\r\n",
        &Method::POST,
    );
    let h = r.unwrap().unwrap();
    assert!(h.keep_alive);
    assert_eq!(h.body.remaining(), None);
    assert_eq!(h.headers.len(), 1, "only content-type is passed on: {:?}", h.headers);
    for bytewise in [false, true] {
        let (body, ended) = decode_all(h.body.clone(), &rest, bytewise).unwrap();
        assert_eq!(String::from_utf8(body).unwrap(), "data: {\"a\":1}\n\n\n\ndata");
        assert!(ended);
    }
}

#[test]
fn a_broken_chunk_is_an_error_and_a_cut_one_waits() {
    let bad = |wire: &[u8]| decode_all(Decoder::chunked(), wire, false).unwrap_err();
    assert_eq!(
        bad(b"zz\r\n"),
        WireError::Chunk("the chunk size is not a hexadecimal number")
    );
    assert_eq!(
        bad(b"\r\n"),
        WireError::Chunk("the chunk size is not a hexadecimal number")
    );
    assert_eq!(bad(b"2\r\nabX\r\n"), WireError::Chunk("no CRLF after the chunk's data"));
    assert_eq!(bad(&[b'1'; MAX_LINE + 1]), WireError::Chunk("a line is over 4 KiB"));
    let (body, ended) = decode_all(Decoder::chunked(), b"5\r\nhel", false).unwrap();
    assert_eq!((body.as_slice(), ended), (&b"hel"[..], false));
    let mut cut = Decoder::chunked();
    assert_eq!(cut.at_eof(), Err(WireError::Incomplete));
}

#[test]
fn an_until_close_body_ends_at_eof() {
    let (r, rest) = parse(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it",
        &Method::GET,
    );
    let mut d = r.unwrap().unwrap().body;
    let mut buf = rest;
    assert_eq!(
        d.decode(&mut buf).unwrap(),
        Step::Data(Bytes::from_static(b"all of it"))
    );
    assert_eq!(d.decode(&mut buf).unwrap(), Step::NeedMore);
    d.at_eof().unwrap();
    assert_eq!(d.decode(&mut buf).unwrap(), Step::Done);
    let mut short = Decoder::length(4);
    assert_eq!(short.at_eof(), Err(WireError::Incomplete));
}
