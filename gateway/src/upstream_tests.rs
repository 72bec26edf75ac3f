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
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            let e = e.clone();
            tokio::spawn(async move {
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
