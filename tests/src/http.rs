//! Raw HTTP/1.1 as the tests speak it, one request per connection, so they see exact bytes: a
//! whole response, a response read chunk by chunk as the server flushed it, JSON posts, the
//! `data:` payloads of a server-sent event stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A complete HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn write_request(stream: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8], close: bool) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n",
        body.len()
    );
    if close {
        head.push_str("Connection: close\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write head");
    // A server may answer before it has read the whole body (a size limit) and close; the
    // answer is what the caller wants to see, so a cut write is not a failure here.
    let _ = stream.write_all(body);
}

/// An HTTP/1.1 response being read incrementally (chunked or sized body).
pub struct Streaming {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    remaining: Option<usize>,
    done: bool,
}

impl std::fmt::Debug for Streaming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming").field("status", &self.status).finish()
    }
}

impl Streaming {
    /// Sends a request on a new connection and reads the status line and headers.
    pub fn open(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Streaming {
        let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        write_request(&mut stream, method, path, headers, body, true);
        let mut s = Self::read_head(BufReader::new(stream));
        // A HEAD answer, a 204 and a 304 have no body whatever their headers say (RFC 9112 §6.3).
        s.done |= method.eq_ignore_ascii_case("HEAD") || s.status == 204 || s.status == 304;
        s
    }

    /// `POST path` with a JSON body on a new connection, its status line and headers read.
    pub fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Streaming {
        Self::open(
            addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    fn read_head(mut reader: BufReader<TcpStream>) -> Streaming {
        let mut line = String::new();
        reader.read_line(&mut line).expect("status line");
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).expect("header line");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let chunked = get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let remaining = get("content-length").and_then(|v| v.parse().ok());
        Streaming {
            reader,
            status,
            headers,
            chunked,
            remaining,
            done: false,
        }
    }

    /// The next piece of body as the server flushed it; `None` at the end.
    pub fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        if self.chunked {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                self.done = true;
                return None;
            }
            let size = usize::from_str_radix(line.trim(), 16).ok()?;
            if size == 0 {
                self.done = true;
                return None;
            }
            let mut buf = vec![0; size + 2];
            self.reader.read_exact(&mut buf).ok()?;
            buf.truncate(size);
            return Some(buf);
        }
        let mut buf = vec![0; self.remaining.unwrap_or(64 * 1024).min(64 * 1024)];
        let n = self.reader.read(&mut buf).ok()?;
        if n == 0 {
            self.done = true;
            return None;
        }
        buf.truncate(n);
        if let Some(r) = self.remaining.as_mut() {
            *r -= n;
            if *r == 0 {
                self.done = true;
            }
        }
        Some(buf)
    }

    pub fn read_all(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        while let Some(c) = self.next_chunk() {
            body.extend(c);
        }
        body
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a new connection; `None` if the connection failed or closed before a
/// complete response (a crashed server).
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<HttpResponse> {
    let addr_copy = addr;
    let method = method.to_owned();
    let path = path.to_owned();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let body = body.to_vec();
    std::thread::spawn(move || {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request(addr_copy, &method, &path, &h, &body)
    })
    .join()
    .ok()
}

/// One request on a new connection; the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
    let mut s = Streaming::open(addr, method, path, headers, body);
    let body = s.read_all();
    HttpResponse {
        status: s.status,
        headers: s.headers.clone(),
        body,
    }
}

/// `n` streaming chat completions of `body` at `addr`, each read past its first chunk — so each
/// holds a running slot while the test loads what is left.
pub fn hold_streams(addr: SocketAddr, n: usize, body: &serde_json::Value) -> Vec<Streaming> {
    (0..n)
        .map(|_| {
            let mut s = Streaming::post_json(addr, "/v1/chat/completions", body);
            s.next_chunk().expect("a first chunk");
            s
        })
        .collect()
}

/// The requests a vLLM (or vllm-sim) at `addr` holds now — its own `/metrics`'
/// `num_requests_running` plus `num_requests_waiting`, read as the supervisor reads them.
pub fn in_vllm(addr: SocketAddr) -> u64 {
    let text = request(addr, "GET", "/metrics", &[], b"").text();
    let p = sparkgate_supervisor::Progress::of_exposition(&text);
    (p.running + p.waiting) as u64
}

/// `POST path` with a JSON body.
pub fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> HttpResponse {
    let mut s = Streaming::post_json(addr, path, body);
    let body = s.read_all();
    HttpResponse {
        status: s.status,
        headers: s.headers.clone(),
        body,
    }
}

/// The `data:` payloads of an SSE body, in order, as eventsource-stream reads them, checking the
/// framing on the way: the body ends with a blank line and no event is named.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("UTF-8 SSE");
    assert!(text.ends_with("\n\n"), "every event ends with a blank line: {text:?}");
    crate::sse::events(body)
        .into_iter()
        .map(|e| {
            assert_eq!(e.event, crate::sse::UNNAMED, "a named event: {e:?} in {text:?}");
            e.data
        })
        .collect()
}
