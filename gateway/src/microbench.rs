//! The hot path's pure parts as microbenchmark cases (`benches/hot_path.rs` runs them, timed
//! and under callgrind for instruction counts): body preparation of a typical request (as sent,
//! and one that is rewritten) and a large one, the SSE tap per token frame, a trace begun with
//! tracing off, and an admission permit taken and returned.
//!
//! Hidden from the docs: a surface for the benchmark binary, not an API.

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::Bytes;
use sparkgate_config::{ProfileId, SpecMethod};

use crate::api::body::prepare_now;
use crate::api::catalog::Catalog;
use crate::api::family::Api;
use crate::api::models::ModelId;
use crate::api::normalize::Normalizer;
use crate::control::admission::{Admission, QueueLimits};
use crate::control::state::GatewayControl;
use crate::pipeline::relay::Tap;

/// One case: a name, what one iteration does, and the loop that runs it `iters` times.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub what: &'static str,
    /// Iterations that amortise the case's occasional slow paths (a buffer growing, the
    /// allocator taking a page) when its instructions are counted.
    pub counted_iters: u64,
    run: fn(u64),
}

impl Case {
    /// Sets the case up once, then runs `iters` iterations.
    pub fn run(&self, iters: u64) {
        (self.run)(iters);
    }
}

/// Every case, in the order they are reported.
pub fn cases() -> &'static [Case] {
    &[
        Case {
            name: "prepare_chat_typical",
            what: "parse and normalise a 4-message chat body (0.7 KiB) that needs no change",
            counted_iters: 2_000,
            run: prepare_typical,
        },
        Case {
            name: "prepare_chat_rewritten",
            what: "the same body without stream_options: usage is injected, the body rewritten",
            counted_iters: 2_000,
            run: prepare_rewritten,
        },
        Case {
            name: "prepare_chat_1mib",
            what: "the same for a chat body with a 1 MiB user message",
            counted_iters: 20,
            run: prepare_large,
        },
        Case {
            name: "sse_tap_token_frame",
            what: "the relay's tap on one chat token frame (split, time, classify, pass on)",
            counted_iters: 200_000,
            run: sse_tap,
        },
        Case {
            name: "sse_tap_traced_frame",
            what: "the tap on one token frame of a stream that can be continued: its token ids recorded and written null for the client (docs/resume.md)",
            counted_iters: 200_000,
            run: sse_tap_traced,
        },
        Case {
            name: "trace_begin_off",
            what: "a generation's trace begun with tracing off (OTEL_EXPORTER_OTLP_ENDPOINT unset), its client's traceparent present",
            counted_iters: 200_000,
            run: trace_off,
        },
        Case {
            name: "admission_acquire_release",
            what: "an uncontended admission permit taken and dropped",
            counted_iters: 50_000,
            run: admission,
        },
    ]
}

/// The normaliser as `sparkgate serve` makes it by default (streams that can be continued ask
/// vLLM for their token ids, RESUME_TIMEOUT).
fn normalizer() -> Catalog {
    let mut n = Normalizer::new(ProfileId::DeepSeekV41Flash, "DeepSeek-v4.1-Flash-EXL3", &[], &[]);
    n.resume_streams = true;
    Catalog::new(vec![n])
}

const TYPICAL: &str = r#"{"model":"DeepSeek-v4.1-Flash-EXL3","messages":[{"role":"system","content":"You are a careful assistant. Answer briefly and cite the function names you use."},{"role":"user","content":"How does the gateway decide when a request may start? Explain admission in two sentences."},{"role":"assistant","content":"A request starts when a slot under MAX_NUM_SEQS is free; otherwise it waits in a bounded queue, in arrival order, until one is released or its timeout passes."},{"role":"user","content":"And what happens to the queue when the ranks restart? Keep it short."}],"max_tokens":256,"temperature":0.6,"top_p":0.95,"stream":true,"stream_options":{"include_usage":true}}"#;

/// The iterations callgrind counts: `hot_path` collects inside this function only
/// (`--toggle-collect`), after one warm-up iteration outside it, so a case's set-up and its
/// one-time initialisation — quanta's clock calibration on the first histogram sample runs a
/// loop whose length varies from run to run — never enter the count.
#[inline(never)]
pub(crate) fn counted(iters: u64, mut one: impl FnMut()) {
    one();
    counted_loop(iters.saturating_sub(1), &mut one);
}

#[inline(never)]
fn counted_loop<F: FnMut()>(iters: u64, one: &mut F) {
    for _ in 0..iters {
        one();
    }
}

fn prepare_typical(iters: u64) {
    let n = normalizer();
    counted(iters, || {
        let p = prepare_now(
            &n,
            (sparkgate_config::VllmRelease::V0_33, ModelId(0)),
            Api::Chat,
            black_box(&Bytes::from_static(TYPICAL.as_bytes())),
        )
        .expect("a valid body");
        black_box(p.forward.len());
    });
}

fn prepare_rewritten(iters: u64) {
    let n = normalizer();
    let body = Bytes::from(TYPICAL.replace(r#","stream_options":{"include_usage":true}"#, ""));
    counted(iters, || {
        let p = prepare_now(
            &n,
            (sparkgate_config::VllmRelease::V0_33, ModelId(0)),
            Api::Chat,
            black_box(&body),
        )
        .expect("a valid body");
        assert!(p.norm.usage_injected);
        black_box(p.forward.len());
    });
}

fn prepare_large(iters: u64) {
    let n = normalizer();
    let text = "the gateway relays every token as it comes ".repeat((1 << 20) / 43);
    let body = Bytes::from(format!(
        r#"{{"model":"DeepSeek-v4.1-Flash-EXL3","messages":[{{"role":"user","content":"{text}"}}],"max_tokens":16}}"#
    ));
    counted(iters, || {
        let p = prepare_now(
            &n,
            (sparkgate_config::VllmRelease::V0_33, ModelId(0)),
            Api::Chat,
            black_box(&body),
        )
        .expect("a valid body");
        black_box(p.forward.len());
    });
}

const FRAME: &[u8] = br#"data: {"id":"chatcmpl-4f1c2a","object":"chat.completion.chunk","created":1764600000,"model":"DeepSeek-v4.1-Flash-EXL3","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null,"token_ids":null}]}

"#;

/// The same frame as vLLM sends it with `return_token_ids` (what a stream that can be continued
/// asks for).
const TRACED_FRAME: &[u8] = br#"data: {"id":"chatcmpl-4f1c2a","object":"chat.completion.chunk","created":1764600000,"model":"DeepSeek-v4.1-Flash-EXL3","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null,"token_ids":[48213]}],"kv_transfer_params":null}

"#;

fn sse_tap(iters: u64) {
    tap_frames(iters, FRAME, false);
}

fn sse_tap_traced(iters: u64) {
    tap_frames(iters, TRACED_FRAME, true);
}

fn tap_frames(iters: u64, frame: &'static [u8], traced: bool) {
    // The tap arms a tokio timer when it is made: give it a runtime to arm it on.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _entered = rt.enter();
    let control = GatewayControl::new(QueueLimits {
        depth: 8,
        bytes: 1 << 20,
        timeout: Duration::from_secs(60),
    });
    control.admission().set_capacity(2);
    control.set_mode(SpecMethod::Dspark);
    let mut tap = if traced {
        Tap::traced_chat(control)
    } else {
        Tap::chat(control)
    };
    let frame = Bytes::from_static(frame);
    counted(iters, || {
        let out = tap.feed(black_box(frame.clone()));
        black_box(out.map(|b| b.len()));
    });
}

fn trace_off(iters: u64) {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        "traceparent",
        axum::http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    counted(iters, || {
        let trace = crate::observe::otel::RequestTrace::begin(black_box(&mut headers), "chat");
        black_box(trace.is_some());
    });
}

fn admission(iters: u64) {
    let limits = QueueLimits {
        depth: 8,
        bytes: 1 << 20,
        timeout: Duration::from_secs(60),
    };
    let admission = Admission::new(2, limits);
    // As a supervised gateway runs: the memory guard on (the default knob) with a reading.
    admission.guard_memory(3600);
    admission.observe_memory(Some(4 << 30));
    // And the interactive reserve on (its defaults): a request that is not long is seen.
    admission.reserve_for_interactive(crate::control::reserve::Rule {
        slots: 1,
        active: Duration::from_secs(10),
        max_wait: Duration::from_secs(30),
    });
    let client = crate::control::fairq::Client::new("bench", 1);
    let mut cx = Context::from_waker(Waker::noop());
    counted(iters, || {
        let mut acquire = std::pin::pin!(admission_once(&admission, &client));
        // Uncontended, the permit is ready on the first poll: no runtime needed.
        assert!(acquire.as_mut().poll(&mut cx).is_ready(), "an uncontended permit");
    });
}

async fn admission_once(admission: &Arc<Admission>, client: &crate::control::fairq::Client) {
    let permit = admission.acquire(1, 512, client).await;
    black_box(permit.is_ok());
}

#[cfg(test)]
mod tests {
    use super::cases;

    #[test]
    fn every_case_runs() {
        for case in cases() {
            case.run(3);
        }
    }
}
