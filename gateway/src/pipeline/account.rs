//! A generation's account with its API key (docs/keys.md): opened when the request arrives,
//! its quota reserved once the body is read (before it takes a place in the queue), the fair
//! queue charged its tokens (FAIR_CHARGE=tokens: the prompt's estimate at admission, the output
//! as it streams), and closed once with how it ended — the quota and the queue settled with
//! vLLM's own usage, the usage written to the ledger and the key's metrics counted. When tracing
//! is on it also carries the request's trace (`observe::otel`): its stages marked as they pass,
//! its spans built when it closes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;

use sparkgate_config::{FairCharge, QuotaMode, RequestClass};
use sparkgate_store::UsageKey;

use crate::api::error::GatewayError;
use crate::api::normalize::Normalized;
use crate::app::App;
use crate::control::clients::Caller;
use crate::control::fairq::Client;
use crate::control::inflight::{Listed, Sending};
use crate::control::keys::KeyInfo;
use crate::control::ledger::{now_secs, Committed, ANONYMOUS};
use crate::control::quota::Hold;
use crate::observe::otel::RequestTrace;
use crate::observe::{self, TraceStage};

/// What a request that names no output limit is reserved for.
const DEFAULT_OUTPUT_RESERVE: u64 = 1024;
/// Streamed events between charges of the fair queue (one lock per this many tokens).
const CHARGE_EVERY: u32 = 32;

/// How a generation ended, as its key's usage counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Completed,
    /// Its client left before the end; counted with what was generated until then.
    Disconnected,
    /// Refused for its key's quota.
    Refused,
    Error,
}

impl Ending {
    /// By the outcome a generation's log line names.
    pub(crate) fn of(outcome: &str) -> Ending {
        match outcome {
            "completed" | "resumed" => Ending::Completed,
            "client_disconnected" => Ending::Disconnected,
            "quota" => Ending::Refused,
            _ => Ending::Error,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Disconnected => "disconnected",
            Ending::Refused => "refused",
            Ending::Error => "error",
        }
    }
}

pub(crate) struct Account {
    app: Arc<App>,
    key: Option<KeyInfo>,
    route: &'static str,
    model: Option<Arc<str>>,
    hold: Option<Hold>,
    /// Over its quota (refused, or served in shadow mode).
    refused: bool,
    /// Its prompt's estimate (tokens).
    estimate: u64,
    /// FAIR_CHARGE=tokens: the client charged, and what it was charged so far.
    fair: Option<(Client, u64)>,
    streamed: u32,
    waited: Option<Duration>,
    /// The request's trace (tracing on), and where its stream was cut (a resume span's start).
    trace: Option<Box<RequestTrace>>,
    cut: Option<Instant>,
    finish_reason: Option<String>,
    /// Where the upstream stage began (its lease), and the streaming stage (its first token).
    upstream_from: Option<Instant>,
    streaming_from: Option<Instant>,
    /// Its place among the requests in flight, once sent.
    listed: Option<Listed>,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("key", &self.name())
            .finish_non_exhaustive()
    }
}

impl Account {
    pub(crate) fn open(app: &Arc<App>, caller: &Caller, route: &'static str) -> Account {
        Account {
            app: app.clone(),
            key: caller.key.clone(),
            route,
            model: None,
            hold: None,
            refused: false,
            estimate: 0,
            fair: None,
            streamed: 0,
            waited: None,
            trace: None,
            cut: None,
            finish_reason: None,
            upstream_from: None,
            streaming_from: None,
            listed: None,
        }
    }

    /// With the request's trace, when it has one.
    pub(crate) fn traced(mut self, trace: Option<RequestTrace>) -> Account {
        self.trace = trace.map(Box::new);
        self
    }

    /// A stage of the request's trace (nothing without one).
    pub(crate) fn mark(&mut self, stage: TraceStage, from: Instant, to: Instant) {
        if let Some(t) = self.trace.as_mut() {
            t.stage(stage, from, to);
        }
    }

    /// An answer's bytes (whole, or an event): its finish reason, for the trace.
    pub(crate) fn saw(&mut self, bytes: &[u8]) {
        if self.trace.is_some() {
            if let Some(r) = finish_reason(bytes) {
                self.finish_reason = Some(r);
            }
        }
    }

    /// The stream was cut by its group's loss; `continued` ends the resume span.
    pub(crate) fn cut(&mut self) {
        self.cut.get_or_insert_with(Instant::now);
        if let Some(l) = &self.listed {
            l.resumed();
        }
    }

    pub(crate) fn continued(&mut self) {
        if let Some(from) = self.cut.take() {
            self.mark(TraceStage::Resume, from, Instant::now());
        }
    }

    fn name(&self) -> &str {
        self.key.as_ref().map_or(ANONYMOUS, |k| &k.name)
    }

    /// Reserves the request's cost under its key's quotas: its prompt's estimate plus its output
    /// limit, for each sequence. Over a quota: 429 (enforced) or counted and served (shadow).
    pub(crate) fn reserve(&mut self, norm: &Normalized, output: Option<u64>, bytes: usize) -> Result<(), GatewayError> {
        let from = Instant::now();
        let reserved = self.reserve_quota(norm, output, bytes);
        self.mark(TraceStage::Admission, from, Instant::now());
        reserved
    }

    fn reserve_quota(&mut self, norm: &Normalized, output: Option<u64>, bytes: usize) -> Result<(), GatewayError> {
        self.model = norm.model.clone();
        self.estimate = crate::control::memory::prompt_estimate(bytes);
        let Some(key) = &self.key else { return Ok(()) };
        let seqs = norm.sequences.total();
        let output = output.unwrap_or(DEFAULT_OUTPUT_RESERVE);
        let cost = self.estimate + output * u64::from(seqs);
        let quotas = &self.app.quotas;
        let (hold, refusal) = quotas.reserve(key, cost, seqs, now_secs());
        self.hold = hold;
        let Some(r) = refusal else { return Ok(()) };
        self.refused = true;
        observe::usage::refused(&key.name, r.limit, quotas.mode);
        let retry_after_s = r.retry_after.as_secs();
        match quotas.mode {
            QuotaMode::Enforce => {
                tracing::warn!(key = %key.name, limit = r.limit.label(), quota = r.quota, retry_after_s, "quota: refused");
                Err(GatewayError::QuotaExceeded {
                    limit: r.limit.label(),
                    quota: r.quota,
                    retry_after: r.retry_after,
                })
            }
            QuotaMode::Shadow => {
                tracing::warn!(key = %key.name, limit = r.limit.label(), quota = r.quota, retry_after_s, "quota (shadow): would have refused");
                Ok(())
            }
        }
    }

    /// The queue's client for this request, charged its prompt's estimate when the queue
    /// charges tokens, and long or not for the interactive reserve: its key's `class=`, else
    /// its prompt's estimate against LONG_PROMPT_TOKENS.
    pub(crate) fn client(&self, client: Client) -> Client {
        let client = match self.app.fair_charge {
            FairCharge::Tokens => client.costing(self.estimate),
            FairCharge::Sequences => client,
        };
        let long = match self.key.as_ref().and_then(|k| k.settings.class) {
            Some(RequestClass::Batch) => true,
            Some(RequestClass::Interactive) => false,
            None => self.estimate > self.app.long_prompt_tokens,
        };
        client.long(long)
    }

    /// Admitted after `waited` in the queue as `client`.
    pub(crate) fn admitted(&mut self, client: Client, waited: Duration) {
        self.waited = Some(waited);
        if self.app.fair_charge == FairCharge::Tokens {
            self.fair = Some((client, self.estimate.max(1)));
        }
        observe::usage::waited(self.name(), waited.as_secs_f64());
    }

    /// Sent to rank 0 of `group`: a slot was leased at `leased` after the send began at `from`.
    pub(crate) fn sent(&mut self, request_id: &str, group: &str, (from, leased): (Instant, Instant)) {
        self.listed = Some(self.app.in_flight.enter(Sending {
            request_id,
            key: self.name(),
            route: self.route,
            group,
            model: self.model.as_deref().unwrap_or("-"),
            prompt_estimate: self.estimate,
        }));
        if self.trace.is_some() {
            self.mark(TraceStage::Lease, from, leased);
            self.upstream_from = Some(leased);
        }
    }

    /// Rank 0's first token (a stream) or its whole answer: the upstream stage ends.
    pub(crate) fn first_token(&mut self, streaming: bool) {
        if let Some(from) = self.upstream_from.take() {
            let now = Instant::now();
            self.mark(TraceStage::Upstream, from, now);
            self.streaming_from = streaming.then_some(now);
        }
    }

    /// One streamed event (about a token): the queue is charged for every `CHARGE_EVERY`.
    pub(crate) fn streamed(&mut self, event: &[u8]) {
        if self.trace.is_some() {
            self.saw(event);
        }
        self.streamed += 1;
        if let Some(l) = &self.listed {
            l.streamed();
        }
        if self.streamed % CHARGE_EVERY == 0 {
            if let Some((client, charged)) = self.fair.as_mut() {
                *charged += u64::from(CHARGE_EVERY);
                self.app.control.admission().charge(client, i64::from(CHARGE_EVERY));
            }
        }
    }

    /// The events streamed so far.
    pub(crate) fn events(&self) -> u32 {
        self.streamed
    }

    /// Closes the account with vLLM's usage and how the request ended; the ticket says when its
    /// usage is durable (the answer's end waits for it).
    pub(crate) fn close(mut self, usage: &observe::Usage, ending: Ending) -> Committed {
        let ending = if self.refused && self.hold.is_none() {
            Ending::Refused
        } else {
            ending
        };
        let (prompt, completion) = (usage.prompt.unwrap_or(0), usage.completion.unwrap_or(0));
        if let Some(hold) = self.hold.take() {
            self.app.quotas.settle(hold, prompt + completion);
        }
        if let Some((client, charged)) = self.fair.take() {
            let delta = (prompt + completion) as i64 - charged as i64;
            self.app.control.admission().charge(&client, delta);
        }
        let mut counted = sparkgate_store::Usage {
            requests: 1,
            errors: u64::from(ending == Ending::Error),
            disconnects: u64::from(ending == Ending::Disconnected),
            refusals: u64::from(self.refused),
            prompt,
            cached: usage.cached.unwrap_or(0),
            completion,
            reasoning: usage.reasoning.unwrap_or(0),
            ..Default::default()
        };
        if let Some(w) = self.waited {
            counted.waited(w.as_millis() as u64);
        }
        observe::usage::finished(self.name(), self.route, ending.label(), &counted);
        if self.trace.is_some() {
            let now = Instant::now();
            if let Some(from) = self.upstream_from.take() {
                self.mark(TraceStage::Upstream, from, now);
            }
            if let Some(from) = self.streaming_from.take() {
                self.mark(TraceStage::Streaming, from, now);
            }
        }
        if let Some(trace) = self.trace.take() {
            self.end_trace(*trace, &counted, ending);
        }
        let who = UsageKey {
            key: self.name().to_owned(),
            model: self.model.as_deref().unwrap_or("-").to_owned(),
            route: self.route.to_owned(),
        };
        self.app.ledger.add(who, counted)
    }
}

impl Account {
    /// The request's span's attributes (GenAI semantic conventions, and the key's name), then its
    /// spans to the exporter.
    fn end_trace(&self, mut trace: RequestTrace, counted: &sparkgate_store::Usage, ending: Ending) {
        let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut attributes = vec![
            KeyValue::new("gen_ai.provider.name", "vllm"),
            KeyValue::new("gen_ai.operation.name", operation(self.route)),
            KeyValue::new("gen_ai.usage.input_tokens", i(counted.prompt)),
            KeyValue::new("gen_ai.usage.output_tokens", i(counted.completion)),
            KeyValue::new("http.route", self.route),
            KeyValue::new("sparkgate.key", self.name().to_owned()),
            KeyValue::new("sparkgate.outcome", ending.label()),
        ];
        if let Some(model) = &self.model {
            attributes.push(KeyValue::new("gen_ai.request.model", model.to_string()));
        }
        if let Some(reason) = &self.finish_reason {
            let reasons = opentelemetry::Value::Array(opentelemetry::Array::String(vec![reason.clone().into()]));
            attributes.push(KeyValue::new("gen_ai.response.finish_reasons", reasons));
        }
        for kv in attributes {
            trace.attribute(kv);
        }
        trace.end();
    }
}

/// `gen_ai.operation.name` for a route.
fn operation(route: &str) -> &'static str {
    match route {
        "completions" => "text_completion",
        "responses" => "generate_content",
        _ => "chat",
    }
}

/// The finish reason an answer's bytes name: OpenAI's `finish_reason`, Anthropic's
/// `stop_reason`, the last one given.
fn finish_reason(bytes: &[u8]) -> Option<String> {
    let mut found = None;
    for key in [&b"\"finish_reason\":\""[..], b"\"stop_reason\":\""] {
        for at in memchr::memmem::find_iter(bytes, key) {
            let rest = &bytes[at + key.len()..];
            let end = memchr::memchr(b'"', rest)?;
            found = std::str::from_utf8(&rest[..end]).ok().map(str::to_owned);
        }
    }
    found
}
