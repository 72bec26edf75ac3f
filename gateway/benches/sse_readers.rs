//! The relay's hand-written event cut against eventsource-stream on the same token frames:
//! wall time per frame of the whole tap (`microbench`'s `sse_tap_token_frame` case: cut, TTFT
//! and ITL, token count, coalescing) and of eventsource-stream reading the frames into events.
//! ARCHITECTURE.md quotes the figures; the tap stays hand-written while it is the faster.
//!
//! `cargo bench -p sparkgate-gateway --bench sse_readers`

use std::time::{Duration, Instant};

use bytes::Bytes;
use eventsource_stream::Eventsource as _;
use futures_util::StreamExt as _;

const FRAME: &[u8] = br#"data: {"id":"chatcmpl-4f1c2a","object":"chat.completion.chunk","created":1764600000,"model":"DeepSeek-v4.1-Flash-EXL3","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null,"token_ids":null}]}

"#;

const FRAMES: u64 = 200_000;

fn best_of_three(mut run: impl FnMut()) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let tap = sparkgate_gateway::microbench::cases()
        .iter()
        .find(|c| c.name == "sse_tap_token_frame")
        .expect("the tap's case");
    let tapped = best_of_three(|| tap.run(FRAMES));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let read = best_of_three(|| {
        let frames = futures_util::stream::iter(
            (0..FRAMES).map(|_| Ok::<_, std::convert::Infallible>(Bytes::from_static(FRAME))),
        );
        let n = rt.block_on(frames.eventsource().count());
        assert_eq!(n as u64, FRAMES);
    });
    let per = |d: Duration| d.as_nanos() as f64 / FRAMES as f64;
    println!("| reader | ns / token frame |");
    println!("|---|---|");
    println!(
        "| the relay's tap (cut, TTFT/ITL, tokens, coalescing) | {:.0} |",
        per(tapped)
    );
    println!("| eventsource-stream (events read only) | {:.0} |", per(read));
}
