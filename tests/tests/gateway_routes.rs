//! The route table through the gateway: every engine route — Anthropic's `/v1/messages`, the
//! batch route, `/invocations`, and every spelling of a path (`/v1/chat%2Fcompletions`,
//! `/v1/%63hat/completions`, duplicate and trailing slashes) — is admitted under MAX_NUM_SEQS;
//! the request checks apply to every spelling; unknown routes are the gateway's 404 envelope and
//! a method a route does not answer its 405.

use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::http::{post_json, request, Streaming};
use sparkgate_tests::load::concurrent_streams;
use sparkgate_tests::sse;

mod common;
use common::ds_pair;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn chat_body() -> Value {
    json!({"messages": [{"role": "user", "content": "Explain tensor parallel inference."}], "max_tokens": 30,
           "ignore_eos": true, "stream": true, "chat_template_kwargs": {"enable_thinking": false}})
}

fn messages_body() -> Value {
    json!({"model": MODEL, "max_tokens": 30, "stream": true,
           "messages": [{"role": "user", "content": "Explain tensor parallel inference."}]})
}

#[test]
fn six_streams_on_every_engine_path_never_exceed_max_num_seqs_upstream() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "4")], &[]);
    for (path, body) in [
        ("/v1/messages", messages_body()),
        ("/v1/chat%2Fcompletions", chat_body()),
        ("/v1/%63hat/completions", chat_body()),
        ("//v1/chat/completions/", chat_body()),
        ("/invocations", chat_body()),
    ] {
        let (max_upstream, bodies) = concurrent_streams(gw.addr, path, &body, 6, Duration::from_millis(2), || {
            let s = sim.state();
            s["running"].as_u64().unwrap() + s["waiting"].as_u64().unwrap()
        });
        assert!(
            max_upstream <= 2,
            "{path}: {max_upstream} upstream at once with MAX_NUM_SEQS 2"
        );
        assert!(max_upstream >= 1, "{path}: the streams ran");
        for text in bodies {
            let (end, ended): (_, fn(&sse::Event) -> bool) = if path == "/v1/messages" {
                ("message_stop", |e| e.event == "message_stop")
            } else {
                ("[DONE]", sse::is_done)
            };
            let events = sse::events(text.as_bytes());
            assert!(events.iter().any(ended), "{path}: stream ended with {end}: {text}");
        }
    }
}

#[test]
fn a_batch_takes_a_permit_per_conversation_and_is_refused_above_the_capacity() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let convo = json!([{"role": "user", "content": "What is 17*19? Reply with the integer only."}]);
    let ok = post_json(
        gw.addr,
        "/v1/chat/completions/batch",
        &json!({"model": MODEL, "messages": [convo, convo]}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["choices"].as_array().map(Vec::len), Some(2));
    let over = post_json(
        gw.addr,
        "/v1/chat/completions/batch",
        &json!({"model": MODEL, "messages": [convo, convo, convo]}),
    );
    assert_eq!(over.status, 400, "{}", over.text());
    assert!(
        over.json()["error"]["message"].as_str().unwrap().contains('2'),
        "{}",
        over.text()
    );
}

#[test]
fn the_checks_hold_on_every_spelling_of_every_generation_path() {
    let (_sim, gw) = ds_pair(&[], &[]);
    for path in [
        "/v1/chat/completions",
        "/v1/chat%2Fcompletions",
        "/v1/%63hat/completions",
        "/v1//chat/./completions/",
        "/invocations",
    ] {
        let n50 = post_json(
            gw.addr,
            path,
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 50}),
        );
        assert_eq!(n50.status, 400, "{path} n=50: {}", n50.text());
        let template = post_json(
            gw.addr,
            path,
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
        );
        assert_eq!(template.status, 400, "{path} chat_template: {}", template.text());
        assert_eq!(template.json()["error"]["param"], "chat_template_kwargs", "{path}");
    }
}

#[test]
fn unknown_routes_are_the_gateways_404_envelope() {
    let (_sim, gw) = ds_pair(&[], &[]);
    for (method, path) in [
        ("GET", "/v1/nope"),
        ("POST", "/v1/chat/completion"),
        ("GET", "/v2/models"),
        ("GET", "/v1/%ff"),
    ] {
        let r = request(gw.addr, method, path, &[("Content-Type", "application/json")], b"{}");
        assert_eq!(r.status, 404, "{method} {path}");
        let body = r.json();
        // vLLM's own unknown-route answer is `{"detail": "Not Found"}`: the envelope shows
        // the gateway answered without the upstream.
        assert!(
            body["error"]["message"].is_string() && body.get("detail").is_none(),
            "{method} {path}: {body}"
        );
    }
    for (path, status) in [("/ping", 200), ("/version", 200), ("/v1/models", 200), ("/load", 200)] {
        assert_eq!(request(gw.addr, "GET", path, &[], b"").status, status, "{path}");
    }
}

#[test]
fn a_method_a_route_does_not_answer_is_405_in_the_routes_envelope_and_head_follows_get() {
    let (_sim, gw) = ds_pair(&[], &[]);
    for (method, path, family) in [
        ("GET", "/v1/chat/completions", "openai"),
        ("PUT", "/v1/chat%2Fcompletions", "openai"),
        ("GET", "/v1/messages", "anthropic"),
        ("POST", "/v1/models", "openai"),
        // DELETE is the gateway's own (docs/store.md); PUT is nobody's.
        ("PUT", "/v1/responses/resp_1", "openai"),
    ] {
        let r = request(gw.addr, method, path, &[("Content-Type", "application/json")], b"{}");
        assert_eq!(r.status, 405, "{method} {path}: {}", r.text());
        let body = r.json();
        match family {
            "anthropic" => assert_eq!(body["type"], "error", "{method} {path}: {body}"),
            _ => assert!(body["error"]["message"].is_string(), "{method} {path}: {body}"),
        }
    }
    // HEAD wherever GET is, as vLLM's Starlette answers it: the head, no body.
    let head = Streaming::open(gw.addr, "HEAD", "/v1/models", &[], b"");
    assert_eq!(head.status, 200);
    assert!(
        head.header("content-type").is_some_and(|c| c.contains("json")),
        "{head:?}"
    );
}

#[test]
fn http2_with_prior_knowledge_is_served_beside_http1() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}],
                      "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": false}});
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-w",
            "\n%{http_version} %{http_code}",
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .arg(format!("http://{}/v1/chat/completions", gw.addr))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n2 200"), "HTTP/2 answered 200: {text}");
    assert!(text.contains("\"323\""), "{text}");
}

/// A keep-alive connection the gateway accepted and answered once, so it is known to count
/// toward MAX_CONNECTIONS. One refused because an earlier connection (the readiness probe's)
/// was still counted — its close not yet seen by the gateway — is made again.
fn served_connection(addr: std::net::SocketAddr) -> std::net::TcpStream {
    use std::io::{Read as _, Write as _};
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        if head.starts_with(b"HTTP/1.1 200") {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a connection under the cap is served: {}",
            String::from_utf8_lossy(&head)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connections_over_max_connections_get_a_503_envelope() {
    let (_sim, gw) = ds_pair(&[], &[("MAX_CONNECTIONS", "2")]);
    // Two idle keep-alive connections hold the cap.
    let held: Vec<std::net::TcpStream> = (0..2).map(|_| served_connection(gw.addr)).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let r = request(gw.addr, "GET", "/v1/models", &[], b"");
        if r.status == 503 || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(refused.status, 503, "gateway log:\n{}", gw.proc.log().join("\n"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("MAX_CONNECTIONS"));
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(gw.addr, "GET", "/v1/models", &[], b"").status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "served again once the connections closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn requests_hyper_cannot_parse_get_the_envelope_too() {
    use std::io::{Read as _, Write as _};
    let (_sim, gw) = ds_pair(&[], &[]);
    let big_header = format!(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(600_000)
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    for (raw, status) in [
        (b"GARBAGE\r\n\r\n".to_vec(), "400"),
        (big_header.into_bytes(), "431"),
        (long_uri.into_bytes(), "414"),
    ] {
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        let _ = s.write_all(&raw);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with(&format!("HTTP/1.1 {status} ")), "{out}");
        let body: Value = serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap_or("")).unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], status.parse::<u16>().unwrap(), "{out}");
    }
}

#[test]
fn a_request_head_that_stalls_gets_408_and_an_idle_connection_is_closed_quietly() {
    use std::io::{Read as _, Write as _};
    let (_sim, gw) = ds_pair(&[], &[("HEADER_READ_TIMEOUT", "1")]);
    // Half a request head, then nothing: hyper gives up on it after HEADER_READ_TIMEOUT.
    let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408 "), "{out:?}");
    assert!(out.contains("connection: close"), "{out}");
    let body: Value = serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap_or("")).unwrap_or(Value::Null);
    assert_eq!(body["error"]["code"], 408, "{out}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HEADER_READ_TIMEOUT"),
        "{out}"
    );

    // A kept-alive connection with no request in progress is closed without an unasked answer.
    let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    assert_eq!(out.matches("HTTP/1.1 ").count(), 1, "{out}");
}
