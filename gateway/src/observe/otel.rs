//! OpenTelemetry traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT; docs/observability.md). A
//! generation's trace is recorded as plain timestamps while it runs — a stage is two instants —
//! and turned into spans once, when it ends: a root span (its route, the key's name, the GenAI
//! attributes) with a child per stage. The ids are chosen when the request arrives, so the
//! upstream stage's span id can go to rank 0 as `traceparent` (vLLM's own spans join the trace
//! under it) before that span exists; the SDK takes them from `Chosen`. The exporter posts with a
//! hyper client on a runtime of its own (the SDK's batch thread blocks on it). Off, a request
//! pays one load of a `OnceLock`.

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime};

use axum::http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider};

use super::TraceStage;

const TRACEPARENT: &str = "traceparent";

struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

static TRACING: std::sync::OnceLock<Tracing> = std::sync::OnceLock::new();

thread_local! {
    /// The ids the next span built on this thread takes (`Chosen`).
    static NEXT: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// The SDK's id generator, giving the span being built the ids chosen for it.
#[derive(Debug, Default)]
struct Chosen(RandomIdGenerator);

impl IdGenerator for Chosen {
    fn new_trace_id(&self) -> TraceId {
        NEXT.get().map_or_else(|| self.0.new_trace_id(), |(t, _)| t)
    }

    fn new_span_id(&self) -> SpanId {
        NEXT.get().map_or_else(|| self.0.new_span_id(), |(_, s)| s)
    }
}

/// Starts exporting to `config`'s collector; the gateway traces every generation from now on.
pub(crate) fn init(config: &sparkgate_config::Tracing) -> Result<(), String> {
    use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
    let protocol = match config.protocol {
        sparkgate_config::OtlpProtocol::HttpProtobuf => Protocol::HttpBinary,
        sparkgate_config::OtlpProtocol::HttpJson => Protocol::HttpJson,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Poster::new()?)
        .with_endpoint(config.traces_url())
        .with_protocol(protocol)
        .build()
        .map_err(|e| e.to_string())?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_id_generator(Chosen::default())
        .with_resource(resource)
        .build();
    let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "sparkgate");
    TRACING
        .set(Tracing { provider, tracer })
        .map_err(|_| "tracing was already started".to_owned())?;
    let stages: Vec<&str> = TraceStage::ALL.iter().map(|s| s.label()).collect();
    tracing::info!(endpoint = %config.traces_url(), ?stages, "tracing generations over OTLP");
    Ok(())
}

/// Sends every span ended so far (the gateway's exit); blocks until they went or failed.
pub(crate) fn flush() {
    if let Some(t) = TRACING.get() {
        if let Err(e) = t.provider.force_flush() {
            tracing::warn!(error = %e, "traces not all sent");
        }
    }
}

/// One generation's trace in the making.
#[derive(Debug)]
pub(crate) struct RequestTrace {
    /// The client's span, when its `traceparent` named one.
    parent: Option<SpanContext>,
    trace_id: TraceId,
    flags: TraceFlags,
    root: SpanId,
    /// The upstream stage's span: the parent of vLLM's spans.
    upstream: SpanId,
    name: &'static str,
    begun: (SystemTime, Instant),
    stages: Vec<(TraceStage, Instant, Instant)>,
    attributes: Vec<KeyValue>,
}

impl RequestTrace {
    /// A trace for a request with `headers` on `route`, when tracing is on: the client's
    /// `traceparent` is continued, and replaced by the one rank 0 is sent.
    pub(crate) fn begin(headers: &mut HeaderMap, route: &'static str) -> Option<RequestTrace> {
        TRACING.get()?;
        let ids = RandomIdGenerator::default();
        let parent = headers
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent);
        let (trace_id, flags) = parent.as_ref().map_or((ids.new_trace_id(), TraceFlags::SAMPLED), |p| {
            (p.trace_id(), p.trace_flags())
        });
        let trace = RequestTrace {
            parent,
            trace_id,
            flags,
            root: ids.new_span_id(),
            upstream: ids.new_span_id(),
            name: route,
            begun: (SystemTime::now(), Instant::now()),
            stages: Vec::with_capacity(8),
            attributes: Vec::with_capacity(12),
        };
        let upstream = format!("00-{}-{}-{:02x}", trace.trace_id, trace.upstream, trace.flags.to_u8());
        headers.insert(TRACEPARENT, HeaderValue::from_str(&upstream).expect("hex and dashes"));
        Some(trace)
    }

    /// A stage that ran from `from` to `to`.
    pub(crate) fn stage(&mut self, stage: TraceStage, from: Instant, to: Instant) {
        self.stages.push((stage, from, to));
    }

    /// An attribute of the request's span.
    pub(crate) fn attribute(&mut self, kv: KeyValue) {
        self.attributes.push(kv);
    }

    fn at(&self, t: Instant) -> SystemTime {
        self.begun.0 + t.saturating_duration_since(self.begun.1)
    }

    /// Builds the request's spans and hands them to the exporter.
    pub(crate) fn end(self) {
        let Some(t) = TRACING.get() else { return };
        let ended = SystemTime::now();
        let client = self
            .parent
            .clone()
            .map_or_else(Context::new, |p| Context::new().with_remote_span_context(p));
        NEXT.set(Some((self.trace_id, self.root)));
        let root = t
            .tracer
            .span_builder(self.name)
            .with_kind(SpanKind::Server)
            .with_start_time(self.begun.0)
            .with_attributes(self.attributes.clone())
            .start_with_context(&t.tracer, &client);
        let root_context = SpanContext::new(self.trace_id, self.root, self.flags, false, TraceState::default());
        let under_root = Context::new().with_remote_span_context(root_context);
        let ids = RandomIdGenerator::default();
        for (stage, from, to) in &self.stages {
            let id = if *stage == TraceStage::Upstream {
                self.upstream
            } else {
                ids.new_span_id()
            };
            NEXT.set(Some((self.trace_id, id)));
            let kind = if *stage == TraceStage::Upstream {
                SpanKind::Client
            } else {
                SpanKind::Internal
            };
            let mut span = t
                .tracer
                .span_builder(stage.label())
                .with_kind(kind)
                .with_start_time(self.at(*from))
                .start_with_context(&t.tracer, &under_root);
            opentelemetry::trace::Span::end_with_timestamp(&mut span, self.at(*to));
        }
        NEXT.set(None);
        let mut root = root;
        opentelemetry::trace::Span::end_with_timestamp(&mut root, ended);
    }
}

/// A W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), as the remote span it names.
fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & 1),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// The exporter's HTTP client: hyper on a current-thread runtime of its own, driven by the
/// SDK's batch thread (which blocks on each export).
#[derive(Debug)]
struct Poster {
    runtime: tokio::runtime::Runtime,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
}

impl Poster {
    fn new() -> Result<Poster, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Ok(Poster { runtime, client })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Poster {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<bytes::Bytes>,
    ) -> Result<opentelemetry_http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        use http_body_util::BodyExt as _;
        let (parts, body) = request.into_parts();
        let request = hyper::Request::from_parts(parts, http_body_util::Full::new(body));
        self.runtime.block_on(async {
            let sent = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
                .await
                .map_err(|_| "the collector did not answer within 10 s")??;
            let (parts, body) = sent.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok(opentelemetry_http::Response::from_parts(parts, body))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_as_w3c_writes_it() {
        let p = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(p.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id().to_string(), "00f067aa0ba902b7");
        assert!(p.is_sampled() && p.is_remote());
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "nonsense",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn tracing_off_leaves_the_headers_and_makes_no_trace() {
        let mut headers = HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        assert!(RequestTrace::begin(&mut headers, "chat").is_none());
        assert_eq!(
            headers[TRACEPARENT],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }
}
