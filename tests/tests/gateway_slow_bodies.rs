//! Request bodies have a deadline (BODY_TIMEOUT, extended while a body averages BODY_MIN_RATE):
//! 300 authenticated connections trickling their bodies a byte at a time are each answered 408
//! in the route's envelope within BODY_TIMEOUT + 1 s and closed, while the gateway serves
//! others; a large body arriving steadily is given its time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::request;

mod common;
use common::{ds_pair, SIM};
use sparkgate_tests::test_gateway::TestGateway;

const KEY: &str = "sk-slow-test";

fn head(path: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// A connection sending its body one byte at a time; what it has read back.
struct Trickle {
    stream: TcpStream,
    opened: Instant,
    answer: Vec<u8>,
    answered_after: Option<Duration>,
    closed: bool,
}

impl Trickle {
    fn open(addr: SocketAddr, path: &str) -> Trickle {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(head(path, 100_000).as_bytes()).unwrap();
        stream.write_all(b"{").unwrap();
        stream.set_nonblocking(true).unwrap();
        Trickle {
            stream,
            opened: Instant::now(),
            answer: Vec::new(),
            answered_after: None,
            closed: false,
        }
    }

    /// Sends one more byte and reads what came back.
    fn poll(&mut self) {
        if self.closed {
            return;
        }
        let _ = self.stream.write(b" ");
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => {
                    self.answer.extend_from_slice(&buf[..n]);
                    self.answered_after.get_or_insert(self.opened.elapsed());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }
}

#[test]
fn slow_bodies_are_answered_408_within_the_deadline_while_others_are_served() {
    let timeout = 2;
    let (_sim, gw) = ds_pair(
        &[],
        &[("API_KEYS", KEY), ("BODY_TIMEOUT", "2"), ("BODY_MIN_RATE", "1000")],
    );
    let mut slow: Vec<Trickle> = (0..300)
        .map(|i| {
            Trickle::open(
                gw.addr,
                if i % 2 == 0 {
                    "/v1/chat/completions"
                } else {
                    "/v1/messages"
                },
            )
        })
        .collect();
    let auth = format!("Bearer {KEY}");
    let mut served_meanwhile = 0;
    let until = Instant::now() + Duration::from_secs(timeout + 3);
    while Instant::now() < until && slow.iter().any(|t| !t.closed) {
        slow.iter_mut().for_each(Trickle::poll);
        // Others are served while the trickles hold their connections.
        let r = request(
            gw.addr,
            "POST",
            "/v1/chat/completions",
            &[("Authorization", auth.as_str()), ("Content-Type", "application/json")],
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                .to_string()
                .as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        served_meanwhile += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served_meanwhile >= 10, "{served_meanwhile} requests served meanwhile");
    for (i, t) in slow.iter().enumerate() {
        let text = String::from_utf8_lossy(&t.answer);
        assert!(text.starts_with("HTTP/1.1 408"), "connection {i}: {text}");
        assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
        let after = t.answered_after.unwrap();
        assert!(
            after <= Duration::from_secs(timeout + 1),
            "connection {i} answered after {after:?}"
        );
        assert!(t.closed, "connection {i} was closed after its 408");
        let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
        if i % 2 == 0 {
            assert!(
                body.contains(r#""error":{"message":"the request body did not arrive within 2s"#),
                "{body}"
            );
        } else {
            assert!(
                body.contains(r#""type":"error""#) && body.contains("BODY_TIMEOUT"),
                "{body}"
            );
        }
    }
    let metrics = request(gw.addr, "GET", "/metrics", &[("Authorization", auth.as_str())], b"").text();
    assert!(metrics.contains("sparkgate_body_timeouts_total 300"), "{metrics}");
}

/// Sends `body` in `pieces` equal writes `every` apart; the status.
fn paced(gw: &Gateway, body: &[u8], pieces: usize, every: Duration) -> u16 {
    let mut stream = TcpStream::connect(gw.addr).unwrap();
    let head =
        head("/v1/chat/completions", body.len()).replace("Content-Length", "Connection: close\r\nContent-Length");
    stream.write_all(head.as_bytes()).unwrap();
    for piece in body.chunks(body.len().div_ceil(pieces)) {
        if stream.write_all(piece).is_err() {
            break;
        }
        std::thread::sleep(every);
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer[9..12].parse().unwrap()
}

#[test]
fn a_body_arriving_at_the_minimum_rate_gets_past_the_timeout_and_one_below_it_does_not() {
    let padding = "x".repeat(6000);
    let body = json!({"messages": [{"role": "user", "content": padding}], "max_tokens": 2}).to_string();
    // 3 s at ~2 kB/s: past BODY_TIMEOUT=1, above BODY_MIN_RATE=1000.
    let sim = sparkgate_tests::harness::Sim::start(SIM, common::DS, &[]);
    let steady = TestGateway::builder(common::SIM)
        .upstream(sim.addr())
        .envs(&[("API_KEYS", KEY), ("BODY_TIMEOUT", "1"), ("BODY_MIN_RATE", "1000")])
        .start();
    assert_eq!(paced(&steady, body.as_bytes(), 30, Duration::from_millis(100)), 200);
    // The same pace with BODY_MIN_RATE=0: one second is the limit.
    let strict = TestGateway::builder(common::SIM)
        .upstream(sim.addr())
        .envs(&[("API_KEYS", KEY), ("BODY_TIMEOUT", "1"), ("BODY_MIN_RATE", "0")])
        .start();
    assert_eq!(paced(&strict, body.as_bytes(), 30, Duration::from_millis(100)), 408);
}
