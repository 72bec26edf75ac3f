//! Observability: the Prometheus recorder and the gateway's metric names, and the tracing
//! subscriber for access and event logs (text or JSON).

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub(crate) const REQUESTS: &str = "sparkgate_requests_total";
pub(crate) const REQUEST_SECONDS: &str = "sparkgate_request_duration_seconds";
pub(crate) const TTFT_SECONDS: &str = "sparkgate_time_to_first_token_seconds";
pub(crate) const ITL_SECONDS: &str = "sparkgate_inter_token_latency_seconds";
pub(crate) const TOKENS: &str = "sparkgate_generated_tokens_total";
pub(crate) const QUEUE_DEPTH: &str = "sparkgate_queue_depth";
pub(crate) const QUEUE_WAIT_SECONDS: &str = "sparkgate_queue_wait_seconds";
pub(crate) const IN_FLIGHT: &str = "sparkgate_in_flight_sequences";
pub(crate) const REJECTIONS: &str = "sparkgate_admission_rejections_total";
pub(crate) const EXTRA_BODY_REPAIRS: &str = "sparkgate_extra_body_repairs_total";
pub(crate) const EFFORT_MAPPINGS: &str = "sparkgate_reasoning_effort_mappings_total";
pub(crate) const OVERHEAD_SECONDS: &str = "sparkgate_gateway_overhead_seconds";
pub(crate) const STREAM_ERRORS: &str = "sparkgate_stream_errors_total";
pub(crate) const UPSTREAM_ERRORS: &str = "sparkgate_upstream_errors_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];
const FINE_BUCKETS: &[f64] = &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1];

/// The process-wide recorder (one per process; tests that start several gateways share it).
pub(crate) fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(OVERHEAD_SECONDS.into()), FINE_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS))
            .expect("static buckets are valid")
            .install_recorder()
            .expect("the gateway installs the only metrics recorder");
        describe();
        handle
    })
}

fn describe() {
    describe_counter!(REQUESTS, "Requests answered, by route and status.");
    describe_histogram!(REQUEST_SECONDS, Unit::Seconds, "Time to response headers, by route.");
    describe_histogram!(
        TTFT_SECONDS,
        Unit::Seconds,
        "Time from request to the first streamed event."
    );
    describe_histogram!(ITL_SECONDS, Unit::Seconds, "Gap between streamed events.");
    describe_counter!(
        TOKENS,
        "Completion tokens generated, by speculation mode (from upstream usage)."
    );
    describe_gauge!(QUEUE_DEPTH, "Generation requests waiting for a MAX_NUM_SEQS slot.");
    describe_histogram!(QUEUE_WAIT_SECONDS, Unit::Seconds, "Time spent waiting for a slot.");
    describe_gauge!(IN_FLIGHT, "Sequences admitted and not yet finished.");
    describe_counter!(REJECTIONS, "Requests refused by admission, by reason.");
    describe_counter!(
        EXTRA_BODY_REPAIRS,
        "Request bodies whose literal extra_body was flattened."
    );
    describe_counter!(EFFORT_MAPPINGS, "reasoning_effort values translated, by from and to.");
    describe_histogram!(
        OVERHEAD_SECONDS,
        Unit::Seconds,
        "Gateway time before the upstream request (parse, normalise, admit) excluding queueing."
    );
    describe_counter!(
        STREAM_ERRORS,
        "Streams ended by the gateway or upstream with an error event, by reason."
    );
    describe_counter!(
        UPSTREAM_ERRORS,
        "Upstream requests that failed before headers, by kind."
    );
    register();
}

/// Every family a dashboard queries exists from the start (at zero), so a rate over it is 0,
/// not "no data", until the first event: each labelled counter with every label value it takes.
fn register() {
    counter!(EXTRA_BODY_REPAIRS).absolute(0);
    for reason in crate::error::REJECTION_REASONS {
        counter!(REJECTIONS, "reason" => *reason).absolute(0);
    }
    for reason in crate::error::STREAM_OUTCOMES {
        counter!(STREAM_ERRORS, "reason" => *reason).absolute(0);
    }
    for kind in UPSTREAM_ERROR_KINDS {
        counter!(UPSTREAM_ERRORS, "kind" => *kind).absolute(0);
    }
    gauge!(QUEUE_DEPTH).set(0.0);
    gauge!(IN_FLIGHT).set(0.0);
}

/// The `kind` label of UPSTREAM_ERRORS: the connect failed, or the request after it.
pub(crate) const UPSTREAM_ERROR_KINDS: &[&str] = &["connect", "request"];

pub(crate) fn request_done(route: &'static str, status: u16, seconds: f64) {
    counter!(REQUESTS, "route" => route, "status" => status.to_string()).increment(1);
    histogram!(REQUEST_SECONDS, "route" => route).record(seconds);
}

pub(crate) fn admission(queued: usize, in_use: u32) {
    gauge!(QUEUE_DEPTH).set(queued as f64);
    gauge!(IN_FLIGHT).set(f64::from(in_use));
}

/// Installs the log subscriber: `RUST_LOG`-style filtering via `SPARKGATE_LOG` (default info),
/// text or JSON lines on stderr, written by a thread of their own (`logwriter`). Keep the guard
/// until the end of `main`: dropping it writes what is still queued.
pub fn init_logging(format: sparkgate_config::LogFormat) -> crate::logwriter::LogGuard {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SPARKGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = crate::logwriter::start(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(false)
        .with_ansi(ansi);
    let _ = if format == sparkgate_config::LogFormat::Json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    guard
}

/// Token counts of a usage object, under either API's names (`prompt_tokens` /
/// `completion_tokens` for chat and completions, `input_tokens` / `output_tokens` for Responses
/// and Anthropic): the one reader of upstream usage, for streamed and complete answers alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt: Option<u64>,
    pub(crate) completion: Option<u64>,
}

impl Usage {
    pub(crate) fn of(usage: &serde_json::Value) -> Usage {
        let count = |a: &str, b: &str| {
            usage
                .get(a)
                .or_else(|| usage.get(b))
                .and_then(serde_json::Value::as_u64)
        };
        Usage {
            prompt: count("prompt_tokens", "input_tokens"),
            completion: count("completion_tokens", "output_tokens"),
        }
    }

    /// `newer`'s counts where it has them (Anthropic sends input tokens first, output last).
    pub(crate) fn update(&mut self, newer: Usage) {
        self.prompt = newer.prompt.or(self.prompt);
        self.completion = newer.completion.or(self.completion);
    }

    /// The `usage` of a complete JSON answer.
    pub(crate) fn of_body(body: &[u8]) -> Usage {
        #[derive(serde::Deserialize)]
        struct WithUsage {
            usage: Option<serde_json::Value>,
        }
        serde_json::from_slice::<WithUsage>(body)
            .ok()
            .and_then(|w| w.usage)
            .map_or_else(Usage::default, |u| Usage::of(&u))
    }
}

/// Milliseconds to a tenth: what a log line needs, without float noise.
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// A generation request as it ended: the one INFO line it gets (streams when their last byte
/// went out or the client left).
#[derive(Debug)]
pub(crate) struct Finished<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) route: &'static str,
    pub(crate) status: u16,
    /// The model name as the client sent it.
    pub(crate) model: Option<&'a str>,
    pub(crate) usage: Usage,
    pub(crate) ttft: Option<std::time::Duration>,
    pub(crate) duration: std::time::Duration,
    pub(crate) outcome: &'static str,
}

pub(crate) fn generation_done(f: &Finished<'_>) {
    tracing::info!(
        request_id = %f.request_id,
        route = f.route,
        status = f.status,
        model = f.model,
        prompt_tokens = f.usage.prompt,
        completion_tokens = f.usage.completion,
        ttft_ms = f.ttft.map(ms),
        duration_ms = ms(f.duration),
        outcome = f.outcome,
        "generation"
    );
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    #[test]
    fn both_apis_usage_names_are_read() {
        let chat = Usage::of(&serde_json::json!({"completion_tokens": 7, "prompt_tokens": 3}));
        assert_eq!((chat.prompt, chat.completion), (Some(3), Some(7)));
        let anthropic = Usage::of(&serde_json::json!({"output_tokens": 9, "input_tokens": 2}));
        assert_eq!((anthropic.prompt, anthropic.completion), (Some(2), Some(9)));
        assert_eq!(
            Usage::of_body(br#"{"id":"x","usage":{"output_tokens":4}}"#).completion,
            Some(4)
        );
        assert_eq!(Usage::of_body(br#"{"id":"x"}"#), Usage::default());
        let mut started = Usage::of(&serde_json::json!({"input_tokens": 5, "output_tokens": 1}));
        started.update(Usage::of(&serde_json::json!({"output_tokens": 12})));
        assert_eq!((started.prompt, started.completion), (Some(5), Some(12)));
    }

    #[test]
    fn durations_print_to_a_tenth_of_a_millisecond() {
        assert_eq!(ms(std::time::Duration::from_nanos(42_178_999)), 42.2);
        assert_eq!(ms(std::time::Duration::from_micros(42)), 0.0);
        assert_eq!(ms(std::time::Duration::from_secs(3)), 3000.0);
    }
}
