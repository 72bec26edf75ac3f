//! The relay's tap without an upstream body, as `microbench` measures it per frame.

use std::time::{Duration, Instant};

use bytes::Bytes;
use sparkgate_config::SpecMethod;

use super::{coalesce, Relay, RelayCtx};
use crate::api::family::Framing;
use crate::control::state::GatewayControl;
use crate::pipeline::trace::Trace;

/// The tap alone, without an upstream body: what `microbench` measures per frame.
pub(crate) struct Tap(pub(super) Relay);

impl Tap {
    /// The tap of a chat stream without injected usage, at the default timeouts. Made inside a
    /// runtime: the stream's timer is armed on it.
    pub(crate) fn chat(control: GatewayControl) -> Self {
        let ctx = RelayCtx {
            started: Instant::now(),
            usage_injected: false,
            framing: Framing::Chat,
            first_token_timeout: Duration::from_secs(900),
            idle_timeout: Duration::from_secs(120),
            mode: SpecMethod::Dspark,
            control,
            request_id: "tap".into(),
            route: "chat",
            model: None,
            drain_timeout: Duration::from_secs(60),
            suspect: None,
            held: None,
            resume: None,
            stored: None,
            account: None,
        };
        Self(Relay::new(None, ctx))
    }

    /// The tap of a chat stream that can be continued (its token ids recorded, and written null
    /// for a client that did not ask for them).
    pub(crate) fn traced_chat(control: GatewayControl) -> Self {
        let mut tap = Tap::chat(control);
        tap.0.trace = Some(Box::new(Trace::new(crate::api::normalize::ResumeSpec {
            kind: crate::api::resume::Resumable::Tokens(crate::api::resume::TokenApi::Chat),
            client_ids: false,
        })));
        tap
    }

    /// One upstream frame in; what would go to the client now out.
    pub(crate) fn feed(&mut self, data: Bytes) -> Option<Bytes> {
        self.0.on_data(data);
        coalesce(&mut self.0.out)
    }
}
