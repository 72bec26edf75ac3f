//! Request ids, as one edge step (`RequestIds`): a client's `X-Request-Id` is kept when usable
//! (printable, 1–128 bytes), else the request gets ours (`sg-` and 24 hexadecimal digits); the
//! id rides in `step::Seen` for the access log and the handlers, and is echoed on every
//! response, refusals and panics included.
//!
//! Ours rather than tower-http's `SetRequestIdLayer` + `PropagateRequestIdLayer`, which write the
//! id into the request's headers and its extensions and read it back on the way out: 3 060
//! instructions a request against 1 510 for this step (BENCHMARKS.md, "The request as a staged
//! pipeline").

use axum::http::HeaderValue;
use axum::response::Response;
use hyper::Request;

use super::step::{Seen, Step};
use crate::api::error::GatewayError;

pub(crate) const X_REQUEST_ID: &str = "x-request-id";

/// The request-id step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestIds;

impl Step for RequestIds {
    type Carry = HeaderValue;

    fn on_request<B>(&self, req: &mut Request<B>) -> Result<HeaderValue, GatewayError> {
        let id = match req.headers().get(X_REQUEST_ID).filter(|v| usable(v)) {
            Some(given) => given.clone(),
            None => generate_id(),
        };
        if let Some(seen) = Seen::of_mut(req) {
            seen.id = id.clone();
        }
        Ok(id)
    }

    fn on_response(&self, id: HeaderValue, resp: &mut Response) {
        resp.headers_mut().insert(X_REQUEST_ID, id);
    }
}

/// An id that can be logged and echoed safely.
fn usable(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(u8::is_ascii_graphic)
}

/// `sg-` and 24 hexadecimal digits, written straight into the header value.
fn generate_id() -> HeaderValue {
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
    let mut id = [0u8; 27];
    id[..3].copy_from_slice(b"sg-");
    hex(&mut id[3..19], mixed);
    hex(&mut id[19..], n);
    HeaderValue::from_bytes(&id).expect("sg- ids are ASCII")
}

/// The low `out.len()` hexadecimal digits of `v`, zero-padded.
fn hex(out: &mut [u8], v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let width = out.len();
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = DIGITS[((v >> (4 * (width - 1 - i))) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_id_is_sg_and_24_hex_digits_and_differs_each_time() {
        let (a, b) = (generate_id(), generate_id());
        for id in [a.to_str().unwrap(), b.to_str().unwrap()] {
            let hex = id.strip_prefix("sg-").expect("sg- prefix");
            assert_eq!(hex.len(), 24, "{id}");
            assert!(
                hex.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
        }
        assert_ne!(a, b);
        let mut s = [0u8; 4];
        hex(&mut s, 0xab);
        assert_eq!(&s, b"00ab");
    }

    #[test]
    fn a_usable_client_id_is_kept_and_an_unusable_one_replaced() {
        let long = "x".repeat(129);
        for (given, kept) in [
            ("abc-123", true),
            ("", false),
            ("has space", false),
            (long.as_str(), false),
        ] {
            let mut req = Request::builder().header(X_REQUEST_ID, given).body(()).unwrap();
            req.extensions_mut()
                .insert(Seen::arrived(([127, 0, 0, 1], 1).into(), crate::app::Scheme::Http));
            let id = RequestIds.on_request(&mut req).unwrap();
            assert_eq!(id == given, kept, "{given:?}");
            assert_eq!(Seen::of(&req).unwrap().id, id, "the handlers see the same id");
            let mut resp = Response::new(axum::body::Body::empty());
            RequestIds.on_response(id.clone(), &mut resp);
            assert_eq!(resp.headers()[X_REQUEST_ID], id, "echoed");
        }
    }
}
