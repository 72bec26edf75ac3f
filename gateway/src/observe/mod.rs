//! Observability: the Prometheus recorder and the gateway's metric names, and the tracing
//! subscriber for access and event logs (text or JSON): the bottom layer, importing nothing of
//! the gateway's. `logline` writes a log line, `logwriter` writes lines from a thread of its own,
//! `otel` exports traces, `usage` counts by API key name.

mod journal;
mod labels;
pub(crate) mod lifecycle;
mod logline;
pub(crate) mod logwriter;
pub(crate) mod models;
pub(crate) mod otel;
pub(crate) mod store;
pub(crate) mod usage;

pub(crate) use labels::{
    Affinity, QuarantineStage, QuotaLimit, Rejection, Repair, ResumeFailure, StreamEnd, TraceStage, UpstreamErrorKind,
    Waiting,
};
pub(crate) use usage::KEY_RELOADS;

use std::sync::{Mutex, OnceLock};

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter, Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sparkgate_config::SpecMethod;

pub(crate) const REQUESTS: &str = "sparkgate_requests_total";
pub(crate) const REQUEST_SECONDS: &str = "sparkgate_request_duration_seconds";
pub(crate) const TTFT_SECONDS: &str = "sparkgate_time_to_first_token_seconds";
pub(crate) const ITL_SECONDS: &str = "sparkgate_inter_token_latency_seconds";
pub(crate) const TOKENS: &str = "sparkgate_generated_tokens_total";
pub(crate) const QUEUE_DEPTH: &str = "sparkgate_queue_depth";
pub(crate) const QUEUE_WAIT_SECONDS: &str = "sparkgate_queue_wait_seconds";
pub(crate) const IN_FLIGHT: &str = "sparkgate_in_flight_sequences";
pub(crate) const REJECTIONS: &str = "sparkgate_admission_rejections_total";
pub(crate) const REPAIRS: &str = "sparkgate_request_repairs_total";
pub(crate) const EFFORT_MAPPINGS: &str = "sparkgate_reasoning_effort_mappings_total";
pub(crate) const OVERHEAD_SECONDS: &str = "sparkgate_gateway_overhead_seconds";
pub(crate) const STREAM_ERRORS: &str = "sparkgate_stream_errors_total";
pub(crate) const UPSTREAM_ERRORS: &str = "sparkgate_upstream_errors_total";
pub(crate) const GROUP_REQUESTS: &str = "sparkgate_group_requests_total";
pub(crate) const GROUP_OPEN: &str = "sparkgate_group_open";
pub(crate) const GROUP_IN_FLIGHT: &str = "sparkgate_group_in_flight_sequences";
pub(crate) const AFFINITY_WAITS: &str = "sparkgate_affinity_waits_total";
pub(crate) const MEMORY_HOLDS: &str = "sparkgate_memory_guard_holds_total";
pub(crate) const MEMORY_HEADROOM: &str = "sparkgate_memory_headroom_bytes";
pub(crate) const BODY_TIMEOUTS: &str = "sparkgate_body_timeouts_total";
pub(crate) const SUSPECTS: &str = "sparkgate_poison_suspects_total";
pub(crate) const QUARANTINED: &str = "sparkgate_quarantined_requests_total";
pub(crate) const ABORT_FENCE_SECONDS: &str = "sparkgate_abort_fence_seconds";
pub(crate) const CLIENT_GONE: &str = "sparkgate_client_gone_total";
pub(crate) const TLS_HANDSHAKE_FAILURES: &str = "sparkgate_tls_handshake_failures_total";
pub(crate) const TLS_RELOADS: &str = "sparkgate_tls_reloads_total";
pub(crate) const TLS_NOT_AFTER: &str = "sparkgate_tls_certificate_not_after_seconds";
pub(crate) use models::{MODEL_LOADED, MODEL_SWAPS, MODEL_SWAP_FAILURES, MODEL_SWAP_SECONDS, MODEL_SWAP_WAIT_SECONDS};

/// Rendered at each scrape from the groups' state (`Groups::upstream_info`), not recorded.
pub(crate) const UPSTREAM_INFO: &str = "sparkgate_upstream_info";
pub(crate) const RESUMES: &str = "sparkgate_stream_resumes_total";
pub(crate) const RESUME_FAILURES: &str = "sparkgate_stream_resume_failures_total";
pub(crate) const RESUME_WAIT_SECONDS: &str = "sparkgate_stream_resume_wait_seconds";
pub(crate) const WARM_REPLAYS: &str = "sparkgate_warm_replays_total";

/// `sparkgate_upstream_info` for the groups whose rank 0 reported its version (empty when
/// none has): one sample per group, valued 1.
pub(crate) fn upstream_info(groups: &[(&str, sparkgate_config::UpstreamVersion)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if groups.is_empty() {
        return out;
    }
    let _ = writeln!(out, "# HELP {UPSTREAM_INFO} Each rank group's vLLM (1): the version rank 0's /version reported, the release whose rules the gateway applies, and how it fits the releases sparkgate is tested with (known, newer, older, unreadable).");
    let _ = writeln!(out, "# TYPE {UPSTREAM_INFO} gauge");
    for (group, v) in groups {
        let fit = serde_json::to_value(v.fit).unwrap_or_default();
        let _ = writeln!(
            out,
            "{UPSTREAM_INFO}{{group=\"{}\",vllm_version=\"{}\",rules=\"{}\",fit=\"{}\"}} 1",
            label(group),
            label(&v.reported),
            v.rules,
            fit.as_str().unwrap_or_default()
        );
    }
    out
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];
const FINE_BUCKETS: &[f64] = &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1];

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The process-wide recorder (one per process; tests that start several gateways share it).
pub(crate) fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(OVERHEAD_SECONDS.into()), FINE_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(ABORT_FENCE_SECONDS.into()), FINE_BUCKETS))
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(models::MODEL_SWAP_SECONDS.into()), models::SWAP_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(models::MODEL_SWAP_WAIT_SECONDS.into()),
                    models::SWAP_BUCKETS,
                )
            })
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS))
            .expect("static buckets are valid")
            .install_recorder()
            .expect("the gateway installs the only metrics recorder");
        describe();
        // Histogram samples wait in per-family buckets until upkeep folds them in; without it
        // they pile up until a scrape (a token's gap each, forever if nothing scrapes).
        let upkept = handle.clone();
        std::thread::Builder::new()
            .name("sparkgate-metrics".into())
            .spawn(move || loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkept.run_upkeep();
            })
            .expect("spawn the metrics upkeep thread");
        handle
    })
}

fn describe() {
    usage::describe();
    lifecycle::describe();
    describe_counter!(REQUESTS, "Requests answered, by route and status.");
    describe_histogram!(REQUEST_SECONDS, Unit::Seconds, "Time to response headers, by route.");
    describe_histogram!(
        TTFT_SECONDS,
        Unit::Seconds,
        "Time from request to the first streamed event."
    );
    describe_histogram!(ITL_SECONDS, Unit::Seconds, "Gap between streamed events.");
    describe_histogram!(
        ABORT_FENCE_SECONDS,
        Unit::Seconds,
        "How long a cut stream's slots were kept until rank 0 had let go of its request, by outcome (released when vLLM's running + waiting allowed it, timed_out after 2 s)."
    );
    describe_counter!(
        TOKENS,
        "Completion tokens generated, by speculation mode (from upstream usage)."
    );
    describe_gauge!(QUEUE_DEPTH, "Generation requests waiting for a MAX_NUM_SEQS slot.");
    describe_histogram!(QUEUE_WAIT_SECONDS, Unit::Seconds, "Time spent waiting for a slot.");
    describe_gauge!(IN_FLIGHT, "Sequences admitted and not yet finished.");
    describe_counter!(REJECTIONS, "Requests refused by admission, by reason.");
    describe_counter!(
        CLIENT_GONE,
        "Generations whose client left before the answer began, by where they waited (request, queue, upstream)."
    );
    describe_counter!(
        SUSPECTS,
        "Requests in flight when their rank group was lost, sent again as suspects (a second loss quarantines them)."
    );
    describe_counter!(
        QUARANTINED,
        "Requests ended with request_crashed_engine: after their group's loss (stage=dispatch) or refused because the same body crashed the engine before (stage=arrival)."
    );
    describe_counter!(
        BODY_TIMEOUTS,
        "Requests answered 408 because their body did not arrive within BODY_TIMEOUT (at BODY_MIN_RATE)."
    );
    describe_counter!(
        REPAIRS,
        "Request bodies repaired before vLLM, by rule: extra_body (a literal extra_body flattened), empty_tools (an empty tools list dropped)."
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
    describe_counter!(
        RESUMES,
        "Streams cut by their rank group's loss and continued exactly where they stopped (docs/resume.md)."
    );
    describe_counter!(
        RESUME_FAILURES,
        "Cut streams that could not be continued and ended with their error event, by reason."
    );
    describe_histogram!(
        RESUME_WAIT_SECONDS,
        Unit::Seconds,
        "How long a cut stream waited from the cut to its continuation's first token."
    );
    describe_groups();
    models::describe();
    store::describe();
    register();
}

/// The rank groups' families: routing, openness, load, warm replays.
fn describe_groups() {
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        "TLS handshakes (TLS_CERT) that failed or did not finish within HEADER_READ_TIMEOUT: a client that does not trust the certificate, has no client certificate under TLS_CLIENT_CA, or speaks no common version."
    );
    describe_counter!(
        TLS_RELOADS,
        "Reads of TLS_CERT/TLS_KEY/TLS_CLIENT_CA after the start (SIGHUP, or a file changed), by outcome: loaded, or refused (the previous certificate keeps serving)."
    );
    describe_gauge!(
        TLS_NOT_AFTER,
        "When the serving certificate expires (its notAfter, Unix seconds); absent without TLS."
    );
    describe_counter!(
        WARM_REPLAYS,
        "Recent conversations' requests replayed into a restarted rank group's prefix cache (WARM_REPLAY_BYTES), by outcome: warmed or failed."
    );
    describe_counter!(GROUP_REQUESTS, "Generations routed to each rank group.");
    describe_counter!(
        MEMORY_HOLDS,
        "Generations the memory guard held in the queue because their prompt's prefill (its estimate times PREFILL_BYTES_PER_TOKEN) would take a node's MemAvailable under MEM_GUARD_GIB; counted once each."
    );
    describe_gauge!(
        MEMORY_HEADROOM,
        "MemAvailable above MEM_GUARD_GIB on the tightest node of the open rank groups at the last sample (negative: under the line); absent without a reading."
    );
    describe_gauge!(GROUP_OPEN, "1 while a rank group takes new requests, by group.");
    describe_gauge!(GROUP_IN_FLIGHT, "Sequences running on each rank group.");
    describe_counter!(
        AFFINITY_WAITS,
        "Generations that let a free slot go to wait for their conversation's full group (AFFINITY_WAIT_MS), by outcome: admitted with a slot of their group free (home), or elsewhere when the wait ran out or the group closed."
    );
}

/// Every family a dashboard queries exists from the start (at zero), so a rate over it is 0,
/// not "no data", until the first event: each labelled counter with every label value it takes.
fn register() {
    for rule in Repair::ALL {
        counter!(REPAIRS, "rule" => rule.label()).absolute(0);
    }
    counter!(BODY_TIMEOUTS).absolute(0);
    counter!(SUSPECTS).absolute(0);
    counter!(MEMORY_HOLDS).absolute(0);
    counter!(RESUMES).absolute(0);
    for outcome in ["warmed", "failed"] {
        counter!(WARM_REPLAYS, "outcome" => outcome).absolute(0);
    }
    for reason in ResumeFailure::ALL {
        counter!(RESUME_FAILURES, "reason" => reason.label()).absolute(0);
    }
    for stage in Waiting::ALL {
        counter!(CLIENT_GONE, "stage" => stage.label()).absolute(0);
    }
    for stage in QuarantineStage::ALL {
        counter!(QUARANTINED, "stage" => stage.label()).absolute(0);
    }
    for reason in Rejection::ALL {
        counter!(REJECTIONS, "reason" => reason.label()).absolute(0);
    }
    for reason in StreamEnd::ALL {
        counter!(STREAM_ERRORS, "reason" => reason.label()).absolute(0);
    }
    for kind in UpstreamErrorKind::ALL {
        counter!(UPSTREAM_ERRORS, "kind" => kind.label()).absolute(0);
    }
    for outcome in Affinity::ALL {
        counter!(AFFINITY_WAITS, "outcome" => outcome.label()).absolute(0);
    }
    gauge!(QUEUE_DEPTH).set(0.0);
    gauge!(IN_FLIGHT).set(0.0);
}

/// Handles of the families every request touches, looked up once: a lookup through the
/// recorder builds a key, hashes the name and labels and searches a map, on every call.
struct Hot {
    queue_wait: Histogram,
    overhead: Histogram,
    ttft: Histogram,
    itl: Histogram,
    queue_depth: Gauge,
    in_flight: Gauge,
    tokens: Vec<(SpecMethod, Counter)>,
    /// A list, not a map: a few dozen pairs at most, found by comparing two short keys for less
    /// than the SipHash of one (measured per request with `tests/overhead/callgrind.sh`).
    by_route: Mutex<Vec<(RouteStatus, Counter, Histogram)>>,
}

/// A route's label and a status code: the labels of REQUESTS.
type RouteStatus = (&'static str, u16);

fn hot() -> &'static Hot {
    static HOT: OnceLock<Hot> = OnceLock::new();
    HOT.get_or_init(|| {
        // Handles taken before the recorder is installed would record nowhere.
        metrics_handle();
        Hot {
            queue_wait: histogram!(QUEUE_WAIT_SECONDS),
            overhead: histogram!(OVERHEAD_SECONDS),
            ttft: histogram!(TTFT_SECONDS),
            itl: histogram!(ITL_SECONDS),
            queue_depth: gauge!(QUEUE_DEPTH),
            in_flight: gauge!(IN_FLIGHT),
            tokens: SpecMethod::ALL
                .into_iter()
                .map(|m| (m, counter!(TOKENS, "mode" => m.as_str())))
                .collect(),
            by_route: Mutex::new(Vec::new()),
        }
    })
}

pub(crate) fn request_done(route: &'static str, status: u16, seconds: f64) {
    let mut by_route = hot().by_route.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let at = match by_route.iter().position(|(key, ..)| *key == (route, status)) {
        Some(at) => at,
        None => {
            let requests = counter!(REQUESTS, "route" => route, "status" => status.to_string());
            by_route.push(((route, status), requests, histogram!(REQUEST_SECONDS, "route" => route)));
            by_route.len() - 1
        }
    };
    let (_, requests, duration) = &by_route[at];
    requests.increment(1);
    duration.record(seconds);
}

pub(crate) fn admission(queued: usize, in_use: u32) {
    let h = hot();
    h.queue_depth.set(queued as f64);
    h.in_flight.set(f64::from(in_use));
}

/// Time a generation waited for its slot.
pub(crate) fn queue_wait(seconds: f64) {
    hot().queue_wait.record(seconds);
}

/// The gateway's own time before the upstream request.
pub(crate) fn overhead(seconds: f64) {
    hot().overhead.record(seconds);
}

pub(crate) fn ttft(seconds: f64) {
    hot().ttft.record(seconds);
}

/// The inter-token histogram, for a stream to keep.
pub(crate) fn itl() -> Histogram {
    hot().itl.clone()
}

/// Completion tokens delivered in `mode`.
pub(crate) fn tokens(mode: SpecMethod, n: u64) {
    if let Some((_, c)) = hot().tokens.iter().find(|(m, _)| *m == mode) {
        c.increment(n);
    }
}

/// Installs the log subscriber: `RUST_LOG`-style filtering via `SPARKGATE_LOG` (default info),
/// text or JSON lines on stderr, written by a thread of their own (`logwriter`). Keep the guard
/// until the end of `main`: dropping it writes what is still queued.
pub fn init_logging(format: sparkgate_config::LogFormat) -> crate::observe::logwriter::LogGuard {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SPARKGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = crate::observe::logwriter::start(std::io::stderr(), journal::priorities());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(false)
        .with_ansi(ansi);
    let _ = match format {
        sparkgate_config::LogFormat::Json => builder.json().flatten_event(true).try_init(),
        // Coloured lines for a terminal; elsewhere the same layout, written faster.
        sparkgate_config::LogFormat::Text if ansi => builder.try_init(),
        sparkgate_config::LogFormat::Text => builder
            .event_format(crate::observe::logline::TextLine::new())
            .try_init(),
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
    /// Prompt tokens from the prefix cache (`*_tokens_details.cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`).
    pub(crate) cached: Option<u64>,
    /// Completion tokens that were reasoning (`*_tokens_details.reasoning_tokens`).
    pub(crate) reasoning: Option<u64>,
}

impl Usage {
    pub(crate) fn of(usage: &serde_json::Value) -> Usage {
        serde_json::from_value::<Counts>(usage.clone()).map_or_else(|_| Usage::default(), Counts::usage)
    }

    /// `newer`'s counts where it has them (Anthropic sends input tokens first, output last).
    pub(crate) fn update(&mut self, newer: Usage) {
        self.prompt = newer.prompt.or(self.prompt);
        self.completion = newer.completion.or(self.completion);
        self.cached = newer.cached.or(self.cached);
        self.reasoning = newer.reasoning.or(self.reasoning);
    }

    /// The `usage` of a complete JSON answer. vLLM writes `usage` after `choices`, so the last
    /// `"usage":` that starts a key (after `{` or `,`, not inside a string, where its quotes
    /// would be escaped) is read alone; an answer where that finds no object is parsed whole.
    pub(crate) fn of_body(body: &[u8]) -> Usage {
        Self::of_usage_key(body).unwrap_or_else(|| Self::of_whole_body(body))
    }

    fn of_usage_key(body: &[u8]) -> Option<Usage> {
        const KEY: &[u8] = b"\"usage\":";
        // Built once: a finder's preprocessing costs more than the search in a small answer. The
        // last match found forward: the forward finder is vectorised, the reverse one is not
        // (about 1 100 instructions a request for a reverse search from the answer's end).
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(KEY));
        let at = FINDER.find_iter(body).last()?;
        let before = body[..at].iter().rev().find(|b| !b.is_ascii_whitespace())?;
        if !matches!(before, b',' | b'{') {
            return None;
        }
        // Read into the four counts, not a value tree; anything else (a count that is not an
        // integer, an array that serde would read as the struct's fields) is left to the whole
        // parse.
        let rest = &body[at + KEY.len()..];
        if !matches!(rest.iter().find(|b| !b.is_ascii_whitespace()), Some(b'{' | b'n')) {
            return None;
        }
        let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<Option<Counts>>();
        match values.next()? {
            Ok(Some(c)) => Some(c.usage()),
            Ok(None) => Some(Usage::default()),
            Err(_) => None,
        }
    }

    fn of_whole_body(body: &[u8]) -> Usage {
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

/// The counts of a usage object under either API's names (other keys are skipped unread).
#[derive(serde::Deserialize)]
struct Counts {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    input_tokens_details: Option<Details>,
    completion_tokens_details: Option<Details>,
    output_tokens_details: Option<Details>,
    cache_read_input_tokens: Option<u64>,
}

#[derive(serde::Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
}

impl Counts {
    fn usage(self) -> Usage {
        let detail = |a: Option<Details>, b: Option<Details>, f: fn(&Details) -> Option<u64>| {
            a.as_ref().and_then(f).or_else(|| b.as_ref().and_then(f))
        };
        Usage {
            prompt: self.prompt_tokens.or(self.input_tokens),
            completion: self.completion_tokens.or(self.output_tokens),
            cached: detail(self.prompt_tokens_details, self.input_tokens_details, |d| {
                d.cached_tokens
            })
            .or(self.cache_read_input_tokens),
            reasoning: detail(self.completion_tokens_details, self.output_tokens_details, |d| {
                d.reasoning_tokens
            }),
        }
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

impl Finished<'_> {
    /// The client's answer was lost: a stream ended by the gateway's error event (rank 0's own
    /// error event is its answer), or a whole answer 5xx that is not a refusal to retry (503).
    fn lost(&self) -> bool {
        let cut = StreamEnd::ALL
            .iter()
            .any(|e| *e != StreamEnd::UpstreamErrorEvent && e.label() == self.outcome);
        match self.status {
            200 => cut,
            503 => false,
            s => s >= 500,
        }
    }
}

/// A generation's one INFO line, and the `request_failed` event when its answer was lost.
pub(crate) fn generation_done(f: &Finished<'_>) {
    if f.lost() {
        sparkgate_events::Event::RequestFailed {
            request_id: f.request_id.to_owned(),
            route: f.route.to_owned(),
            outcome: f.outcome.to_owned(),
        }
        .emit();
    }
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
    }

    #[test]
    fn the_usage_key_is_read_alone_and_agrees_with_a_whole_parse() {
        let bodies: [&[u8]; 9] = [
            br#"{"id":"c","choices":[{"message":{"content":"say \"usage\": {\"completion_tokens\": 99}"}}],"usage":{"prompt_tokens":3,"completion_tokens":7},"kv_transfer_params":null}"#,
            br#"{"id":"m","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":2,"output_tokens":9}}"#,
            br#"{"id":"c","choices":[{"text":"the \"usage\":{} key"}]}"#,
            br#"{"id":"c", "usage": null}"#,
            br#"{"id":"c","choices":[],
  "usage" : {"completion_tokens": 4}}"#,
            br#"not json "usage":{"completion_tokens":1}"#,
            br#"{"id":"c","usage":[1,2,3,4]}"#,
            br#"{"id":"c","usage":{"prompt_tokens":null,"input_tokens":3,"completion_tokens":1.5}}"#,
            br#"{"id":"c","usage":{"prompt_tokens":null,"input_tokens":3,"completion_tokens":2,"details":{"x":[1]}}}"#,
        ];
        for body in bodies {
            assert_eq!(
                Usage::of_body(body),
                Usage::of_whole_body(body),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(
            Usage::of_body(bodies[0]),
            Usage {
                prompt: Some(3),
                completion: Some(7),
                ..Usage::default()
            }
        );
        let details = Usage::of_body(
            br#"{"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":3}}}"#,
        );
        assert_eq!((details.cached, details.reasoning), (Some(8), Some(3)));
        let anthropic =
            Usage::of(&serde_json::json!({"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 1}));
        assert_eq!(anthropic.cached, Some(2));
        let responses = Usage::of(
            &serde_json::json!({"input_tokens": 5, "input_tokens_details": {"cached_tokens": 4}, "output_tokens_details": {"reasoning_tokens": 6}}),
        );
        assert_eq!((responses.cached, responses.reasoning), (Some(4), Some(6)));
        assert!(
            Usage::of_usage_key(bodies[2]).is_none(),
            "a quoted key inside a string is not read"
        );
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
