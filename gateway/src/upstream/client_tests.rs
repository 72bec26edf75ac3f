//! The inline client against raw local servers: connections are reused, a closed idle one is
//! replaced without losing the request, a refused connect says so, and a dropped body closes
//! its connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Upstream;

/// A server on 127.0.0.1:0 answering each request with `body` (closing after one when `close`),
/// counting the connections it accepted; `eof` counts connections the client closed.
async fn server(body: &'static str, close: bool) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (accepted, eof) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, e) = (accepted.clone(), eof.clone());
    sparkgate_task::spawn("test", async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            let e = e.clone();
            sparkgate_task::spawn("test", async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        e.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    // Always "keep-alive": with `close` the server hangs up afterwards without
                    // saying so, as an idle timeout does.
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: keep-alive\r\n\r\n{body}",
                        body.len()
                    );
                    sock.write_all(answer.as_bytes()).await.unwrap();
                    if close {
                        return;
                    }
                }
            });
        }
    });
    (base, accepted, eof)
}

async fn get(up: &Upstream) -> Result<Bytes, super::UpstreamError> {
    let r = up.send(Method::GET, "/x", &HeaderMap::new(), "t", Bytes::new()).await?;
    Ok(r.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn a_finished_connection_is_reused() {
    let (base, accepted, _) = server("hello", false).await;
    let up = Upstream::new(&base, None);
    for _ in 0..3 {
        assert_eq!(get(&up).await.unwrap(), "hello");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_idle_connection_the_server_closed_is_replaced_and_the_request_still_goes_out() {
    let (base, accepted, _) = server("bye", true).await;
    let up = Upstream::new(&base, None);
    assert_eq!(get(&up).await.unwrap(), "bye");
    // The connection went back to the pool; wait until its close has arrived.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let open = up.pool.idle.lock().unwrap().iter_mut().any(|i| i.conn.reusable());
        if !open {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the server's close arrives");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert_eq!(get(&up).await.unwrap(), "bye");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_refused_connect_is_a_connect_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let up = Upstream::new(&format!("http://127.0.0.1:{port}"), None);
    let err = get(&up).await.unwrap_err();
    assert!(err.is_connect(), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("cannot connect to 127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn a_body_dropped_unread_closes_its_connection() {
    let (base, accepted, eof) = server("unread", false).await;
    let up = Upstream::new(&base, None);
    let r = up
        .send(Method::GET, "/x", &HeaderMap::new(), "t", Bytes::new())
        .await
        .unwrap();
    drop(r);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while eof.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the server saw the close");
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(get(&up).await.unwrap(), "unread");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "the dropped one was not reused");
}

/// A server on 127.0.0.1:0 that runs `script` on each connection it accepts (with the
/// connection's number, from 0); returns its base URL and the count of accepted connections.
async fn scripted<F, Fut>(script: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let script = Arc::new(script);
    sparkgate_task::spawn("test", async move {
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            let n = a.fetch_add(1, Ordering::SeqCst);
            sparkgate_task::spawn("test", script(sock, n));
        }
    });
    (base, accepted)
}

/// Reads one request head (and nothing after it) from `sock`; false at end of stream.
async fn read_head(sock: &mut tokio::net::TcpStream) -> bool {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        if sock.read(&mut byte).await.unwrap_or(0) == 0 {
            return false;
        }
        seen.push(byte[0]);
    }
    true
}

#[tokio::test]
async fn a_chunked_answer_arrives_frame_by_frame_holding_no_read_buffer_and_its_connection_is_reused() {
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let (base, accepted) = scripted(move |mut sock, _| {
        let mut go = go_rx.clone();
        async move {
            while read_head(&mut sock).await {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                sock.write_all(format!("{head}9\r\ndata: a\n\n\r\n").as_bytes())
                    .await
                    .unwrap();
                go.wait_for(|g| *g).await.unwrap();
                sock.write_all(b"9\r\ndata: b\n\n\r\n0\r\n\r\n").await.unwrap();
            }
        }
    })
    .await;
    let up = Upstream::new(&base, None);
    let r = up
        .send(Method::POST, "/x", &HeaderMap::new(), "t", Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut body = r.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "data: a\n\n", "the first event comes before the rest was sent");
    let pending = body.conn.as_ref().map(|c| c.pending.capacity());
    assert_eq!(
        pending,
        Some(0),
        "a stream waiting for its next event holds no read buffer"
    );
    go_tx.send(true).unwrap();
    assert_eq!(body.collect().await.unwrap().to_bytes(), "data: b\n\n");
    let again = up
        .send(Method::POST, "/x", &HeaderMap::new(), "t", Bytes::new())
        .await
        .unwrap();
    assert_eq!(
        again.into_body().collect().await.unwrap().to_bytes(),
        "data: a\n\ndata: b\n\n"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_answer_that_says_connection_close_is_not_reused() {
    let (base, accepted) = scripted(|mut sock, _| async move {
        while read_head(&mut sock).await {
            let answer = "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
            sock.write_all(answer.as_bytes()).await.unwrap();
        }
    })
    .await;
    let up = Upstream::new(&base, None);
    assert_eq!(get(&up).await.unwrap(), "ok");
    assert_eq!(get(&up).await.unwrap(), "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_pooled_connection_closed_after_the_request_was_written_is_replaced_once() {
    // The first connection answers once, then takes the next request and closes without a
    // word (vLLM's idle timeout meeting the request); the second answers.
    let (base, accepted) = scripted(|mut sock, n| async move {
        let mut answered = 0;
        while read_head(&mut sock).await {
            if n == 0 && answered == 1 {
                return;
            }
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{n}");
            sock.write_all(answer.as_bytes()).await.unwrap();
            answered += 1;
        }
    })
    .await;
    let up = Upstream::new(&base, None);
    assert_eq!(get(&up).await.unwrap(), "0");
    assert_eq!(get(&up).await.unwrap(), "1");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_fresh_connection_closed_without_an_answer_is_an_error_not_a_retry_loop() {
    let (base, accepted) = scripted(|mut sock, _| async move {
        read_head(&mut sock).await;
    })
    .await;
    let up = Upstream::new(&base, None);
    let err = get(&up).await.unwrap_err();
    assert!(matches!(err, super::UpstreamError::Wire(_)), "{err:?}");
    assert!(!err.is_connect());
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_cut_short_is_an_error_for_its_reader() {
    let (base, _) = scripted(|mut sock, _| async move {
        read_head(&mut sock).await;
        sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
            .await
            .unwrap();
    })
    .await;
    let up = Upstream::new(&base, None);
    let r = up
        .send(Method::GET, "/x", &HeaderMap::new(), "t", Bytes::new())
        .await
        .unwrap();
    let err = r.into_body().collect().await.unwrap_err();
    assert!(
        matches!(
            err,
            super::UpstreamError::Wire(crate::upstream::wire::WireError::Incomplete)
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn connections_idle_past_the_pool_limit_are_dropped_and_not_reused() {
    let (base, accepted, eof) = server("hi", false).await;
    let up = Upstream::new(&base, None);
    assert_eq!(get(&up).await.unwrap(), "hi");
    // The pooled connection has idled past POOL_IDLE (its clock set back instead of waited).
    let aged = |up: &Upstream| {
        for i in up.pool.idle.lock().unwrap().iter_mut() {
            i.since -= super::POOL_IDLE;
        }
    };
    aged(&up);
    assert_eq!(get(&up).await.unwrap(), "hi");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "the expired one was not taken");
    // Two connections in the pool, the older expired: the next checkin drops it, keeps the other.
    let (a, b) = (get(&up), get(&up));
    let (a, b) = tokio::join!(a, b);
    assert_eq!((a.unwrap(), b.unwrap()), (Bytes::from("hi"), Bytes::from("hi")));
    assert_eq!(up.pool.idle.lock().unwrap().len(), 2);
    let oldest = up.pool.idle.lock().unwrap().front().map(|i| i.since).unwrap();
    up.pool.idle.lock().unwrap().front_mut().unwrap().since = oldest - super::POOL_IDLE;
    assert_eq!(get(&up).await.unwrap(), "hi");
    assert_eq!(up.pool.idle.lock().unwrap().len(), 1, "the expired one went at checkin");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while eof.load(Ordering::SeqCst) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "both expired connections are closed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}
