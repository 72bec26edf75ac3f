//! Request ids: a client's `X-Request-Id` is kept when usable (printable, 1–128 bytes) and
//! dropped otherwise (`drop_unusable`, a request map before tower-http's `SetRequestIdLayer`), and
//! a request without one gets ours (`SgIds`): `sg-` and 24 hexadecimal digits.

use axum::http::HeaderValue;
use hyper::Request;
use tower_http::request_id::{MakeRequestId, RequestId};

pub(crate) const X_REQUEST_ID: &str = "x-request-id";

/// Drops a client's request id that could not be logged or echoed safely (not printable, empty
/// or over 128 bytes), so `SgIds` makes one: a `MapRequestLayer` before `SetRequestIdLayer`.
pub(crate) fn drop_unusable<B>(mut req: Request<B>) -> Request<B> {
    let usable = |v: &HeaderValue| {
        let b = v.as_bytes();
        !b.is_empty() && b.len() <= 128 && b.iter().all(u8::is_ascii_graphic)
    };
    if req.headers().get(X_REQUEST_ID).is_some_and(|v| !usable(v)) {
        req.headers_mut().remove(X_REQUEST_ID);
    }
    req
}

/// The gateway's request ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SgIds;

impl MakeRequestId for SgIds {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        HeaderValue::from_str(&generate_id()).ok().map(RequestId::new)
    }
}

/// The request's id as the steps and handlers read it (set by `SetRequestIdLayer`).
pub(crate) fn of<B>(req: &Request<B>) -> &str {
    req.extensions()
        .get::<RequestId>()
        .and_then(|id| id.header_value().to_str().ok())
        .unwrap_or("-")
}

fn generate_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Read once: `process::id` is a system call on every call (glibc keeps no copy).
    static PID: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| u64::from(std::process::id()));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed = (nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ *PID).wrapping_mul(0xff51_afd7_ed55_8ccd);
    // Written by hand: `format!` with hex widths cost more than the rest of the edge steps.
    let mut id = String::with_capacity(27);
    id.push_str("sg-");
    push_hex(&mut id, mixed, 16);
    push_hex(&mut id, n, 8);
    id
}

/// The low `digits` hexadecimal digits of `v`, zero-padded.
fn push_hex(out: &mut String, v: u64, digits: u32) {
    for i in (0..digits).rev() {
        let nibble = ((v >> (4 * i)) & 0xf) as u32;
        out.push(char::from_digit(nibble, 16).unwrap_or('0'));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_id_is_sg_and_24_hex_digits_and_differs_each_time() {
        let (a, b) = (generate_id(), generate_id());
        for id in [&a, &b] {
            let hex = id.strip_prefix("sg-").expect("sg- prefix");
            assert_eq!(hex.len(), 24, "{id}");
            assert!(
                hex.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
        }
        assert_ne!(a, b);
        let mut s = String::new();
        push_hex(&mut s, 0xab, 4);
        assert_eq!(s, "00ab");
    }

    #[test]
    fn an_unusable_client_id_is_dropped_and_a_usable_one_kept() {
        for (given, kept) in [("abc-123", true), ("", false), ("has space", false)] {
            let req = drop_unusable(Request::builder().header(X_REQUEST_ID, given).body(()).unwrap());
            assert_eq!(req.headers().contains_key(X_REQUEST_ID), kept, "{given:?}");
        }
        let long = "x".repeat(129);
        let req = drop_unusable(Request::builder().header(X_REQUEST_ID, long).body(()).unwrap());
        assert!(!req.headers().contains_key(X_REQUEST_ID));
    }
}
