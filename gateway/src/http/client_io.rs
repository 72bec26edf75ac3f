//! A client's connection as hyper sees it, over plain TCP or TLS alike: hyper's bare error
//! responses (400, 414, 431, written with an empty body) are given vLLM's envelope on their
//! way out, and a connection dropped mid-request hands its stream back so the loop can answer
//! 408 where hyper would close without a word. `answer` writes the loop's own answers.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::api::error::GatewayError;

/// The envelope for a response hyper writes itself (a request it could not parse: 400, 414,
/// 431): hyper sends those with an empty body; clients get vLLM's error envelope instead.
pub(super) fn envelope_for(head: &[u8]) -> Option<Vec<u8>> {
    // Every write to a client passes here: anything but a 4xx head is let through at once,
    // before a search.
    if !head.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let end = memchr::memmem::find(head, b"\r\n\r\n")?;
    let headers = &head[..end];
    let bare = memchr::memmem::find(headers, b"\r\ncontent-length: 0").is_some()
        && memchr::memmem::find(headers, b"content-type").is_none()
        && end + 4 == head.len();
    if !bare {
        return None;
    }
    let code = std::str::from_utf8(head.get(9..12)?).ok()?.parse::<u16>().ok()?;
    let status = axum::http::StatusCode::from_u16(code).ok()?;
    Some(GatewayError::UnparseableHttp { status }.to_http1())
}

/// How long a connection that has sent nothing yet may take for its first request once the
/// gateway shuts down (its client opened it a moment before; the request is on its way).
pub(super) const FRESH_GRACE: Duration = Duration::from_secs(1);

/// What the connection task gets back from hyper's side of a connection: whether a request was
/// in progress, and the stream itself when hyper dropped it mid-request — hyper closes a
/// connection whose request head stalls without a word; the task answers 408 on it instead.
#[derive(Debug)]
pub(super) struct Handoff<T> {
    /// Bytes arrived since the last answer was written: a request is in progress, so a header
    /// timeout is answered; an idle kept-alive connection is closed quietly.
    mid_request: AtomicBool,
    /// Any byte arrived yet, and its signal: a connection opened just before a shutdown is
    /// given a moment for its first request (`FRESH_GRACE`) instead of being closed under it.
    seen_bytes: AtomicBool,
    first_bytes: tokio::sync::Notify,
    stream: std::sync::Mutex<Option<T>>,
}

impl<T> Default for Handoff<T> {
    fn default() -> Self {
        Handoff {
            mid_request: AtomicBool::new(false),
            seen_bytes: AtomicBool::new(false),
            first_bytes: tokio::sync::Notify::new(),
            stream: std::sync::Mutex::new(None),
        }
    }
}

impl<T> Handoff<T> {
    /// Resolves once the connection has sent something, or after `FRESH_GRACE`.
    pub(super) async fn first_request_or_grace(&self) {
        let arrived = self.first_bytes.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        if !self.seen_bytes.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(FRESH_GRACE, arrived).await;
        }
    }

    /// The stream hyper dropped mid-request, if it did.
    pub(super) fn take(&self) -> Option<T> {
        self.stream.lock().expect("handoff lock").take()
    }
}

/// The client's stream as hyper sees it, with hyper's bare error responses given an envelope
/// (`envelope_for`); dropped mid-request, it hands its stream back (`Handoff`).
pub(super) struct ClientIo<T> {
    inner: Option<T>,
    handoff: Arc<Handoff<T>>,
    /// A replacement being written, how much of it is out, and the length hyper asked for.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<T: AsyncRead + AsyncWrite + Unpin> ClientIo<T> {
    pub(super) fn new(stream: T, handoff: Arc<Handoff<T>>) -> ClientIo<T> {
        ClientIo {
            inner: Some(stream),
            handoff,
            pending: None,
        }
    }

    fn socket(&mut self) -> Pin<&mut T> {
        Pin::new(self.inner.as_mut().expect("the stream is handed back only on drop"))
    }
}

impl<T> Drop for ClientIo<T> {
    fn drop(&mut self) {
        if self.handoff.mid_request.load(Ordering::Relaxed) {
            *self.handoff.stream.lock().expect("handoff lock") = self.inner.take();
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for ClientIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = self.socket().poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let got = buf.filled().len() > before;
            self.handoff.mid_request.store(got, Ordering::Relaxed);
            if got && !self.handoff.seen_bytes.swap(true, Ordering::AcqRel) {
                self.handoff.first_bytes.notify_waiters();
            }
        }
        polled
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ClientIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.handoff.mid_request.store(false, Ordering::Relaxed);
        if self.pending.is_none() {
            match envelope_for(buf) {
                Some(replacement) => self.pending = Some((replacement, 0, buf.len())),
                None => return self.socket().poll_write(cx, buf),
            }
        }
        let (replacement, mut done, reported) = self.pending.take().expect("set above");
        while done < replacement.len() {
            match self.socket().poll_write(cx, &replacement[done..]) {
                Poll::Ready(Ok(n)) => done += n,
                other => {
                    self.pending = Some((replacement, done, reported));
                    return other;
                }
            }
        }
        Poll::Ready(Ok(reported))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // hyper's own bare answers are a lone head: they go through `poll_write`'s check.
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next()) {
            return self.poll_write(cx, only);
        }
        self.handoff.mid_request.store(false, Ordering::Relaxed);
        self.socket().poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.socket().poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.socket().poll_shutdown(cx)
    }
}

/// Writes one of the connection loop's own answers (`GatewayError::to_http1`) and closes —
/// lingering: the write side is shut (a TLS stream sends its close_notify first), then what the
/// client sent is read and dropped until it closes too, so the close is no reset that could
/// destroy the answer before the client reads it. Bounded at 2 s in all.
pub(super) async fn answer<T: AsyncRead + AsyncWrite + Unpin>(stream: &mut T, err: GatewayError) {
    let bytes = err.to_http1();
    let write = async {
        stream.write_all(&bytes).await?;
        match stream.shutdown().await {
            Err(e) if e.kind() != std::io::ErrorKind::NotConnected => return Err(e),
            _ => {}
        }
        let mut scratch = [0u8; 4096];
        while stream.read(&mut scratch).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bare_errors_get_the_envelope_and_ours_pass() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(envelope_for(bare).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"));
        assert!(out.contains("headers are too large"), "{out}");
        let body: serde_json::Value = serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"]["code"], 431);
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(envelope_for(ours).is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(envelope_for(ok).is_none(), "only error statuses");
    }
}
