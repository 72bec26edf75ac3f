//! The holders of a generation's admission permit and group lease: `Held` while the gateway
//! waits for vLLM's answer, then a whole answer's body (`HoldPermit`; a stream's relay holds its
//! own `Held`).

use bytes::Bytes;

use crate::control::admission::Permit;
use crate::groups::Lease;

/// A response body that keeps the generation's slots until it is fully sent or dropped. A body
/// cut before vLLM's answer ended leaves them to its `Held`, which fences them until vLLM has
/// let go of the request: a queued request sent at once would find vLLM still holding the old
/// one and run over MAX_NUM_SEQS.
pub(super) struct HoldPermit<B: Cut> {
    inner: B,
    held: Option<Held>,
}

/// Whether a response body stopped before vLLM's answer ended.
pub(super) trait Cut {
    fn cut_upstream(&self) -> bool;
}

impl Cut for http_body_util::Full<Bytes> {
    /// A whole answer: vLLM finished it before the gateway had it.
    fn cut_upstream(&self) -> bool {
        false
    }
}

impl<B: Cut> HoldPermit<B> {
    pub(super) fn new(inner: B, held: Held) -> Self {
        Self {
            inner,
            held: Some(held),
        }
    }
}

impl<B: Cut> Drop for HoldPermit<B> {
    fn drop(&mut self) {
        // A cut answer drops its `Held` as it is (fenced); a whole one gives the slots back.
        if let Some(held) = self.held.take().filter(|_| !self.inner.cut_upstream()) {
            drop(held.into_parts());
        }
    }
}

impl<B> http_body::Body for HoldPermit<B>
where
    B: http_body::Body<Data = Bytes> + Unpin + Cut,
{
    type Data = Bytes;
    type Error = B::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A generation's slots while the gateway waits for vLLM's answer: if its client leaves first
/// (hyper drops the handler) or the gateway gives up on it, vLLM may still hold the request, so
/// they go to the abort fence instead of straight back (`Lease::release_after_abort`). The
/// group's slot comes before the admission's (a tuple drops its fields in order): the waiter
/// the permit's release admits finds the group's slot free.
pub(crate) struct Held(Option<(Lease, Permit)>);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Held(slots)"
        } else {
            "Held(released)"
        })
    }
}

impl Held {
    pub(super) fn new(lease: Lease, permit: Permit) -> Self {
        Held(Some((lease, permit)))
    }

    /// The group its lease is on.
    pub(super) fn group(&self) -> &crate::groups::Group {
        self.0.as_ref().expect("held until taken").0.group()
    }

    /// The group its lease is on, shared (to wait on it once the slots are gone).
    pub(super) fn shared_group(&self) -> std::sync::Arc<crate::groups::Group> {
        self.0.as_ref().expect("held until taken").0.shared()
    }

    /// A stream's event went out: the first one the engine produced ends the prompt's prefill,
    /// and the memory guard has its memory back (once; later events cost a check).
    pub(super) fn saw(&mut self, event: &[u8]) {
        // vLLM sends a Responses stream's first two events before it reads the engine's output.
        const BEFORE_OUTPUT: [&[u8]; 2] = [b"event: response.created", b"event: response.in_progress"];
        if let Some((_, permit)) = self.0.as_mut().filter(|(_, p)| p.prefilling()) {
            if !BEFORE_OUTPUT.iter().any(|e| event.starts_with(e)) {
                permit.prefilled();
            }
        }
    }

    /// The slots back, the wait over (dropped, they are free at once).
    pub(super) fn into_parts(mut self) -> (Lease, Permit) {
        self.0.take().expect("held until taken")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((lease, permit)) = self.0.take() {
            lease.release_after_abort(permit);
        }
    }
}
