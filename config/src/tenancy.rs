//! Who the gateway's clients are and what each may use (named keys' quotas, the fair queue's
//! charge, the session header) and tracing: the typed settings of docs/keys.md and
//! docs/observability.md.

use std::path::PathBuf;

use crate::choice::choice;

choice! {
    /// QUOTA_MODE: whether a key over its quota is refused or only counted.
    pub enum QuotaMode {
        /// Answered 429 with Retry-After.
        Enforce = "enforce",
        /// Served; the refusal it would have been is counted and logged.
        Shadow = "shadow",
    }
}

choice! {
    /// FAIR_CHARGE: what the fair queue charges a client for a request.
    pub enum FairCharge {
        /// The tokens it is served: prompt at admission, output as it streams, settled at the end.
        Tokens = "tokens",
        /// One per sequence, whatever its size.
        Sequences = "sequences",
    }
}

choice! {
    /// OTEL_EXPORTER_OTLP_PROTOCOL: how spans are sent to the collector.
    pub enum OtlpProtocol {
        HttpProtobuf = "http/protobuf",
        HttpJson = "http/json",
    }
}

/// Per-key limits (KEY_TOKENS_PER_MINUTE, KEY_TOKENS_PER_DAY, KEY_MAX_SEQUENCES); 0: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyQuota {
    pub tokens_per_minute: u64,
    pub tokens_per_day: u64,
    pub max_sequences: u32,
}

/// Who the gateway's clients are and what each may use (docs/keys.md).
#[derive(Debug, Clone, PartialEq)]
pub struct Tenancy {
    /// API_KEYS_FILE, resolved against DEPLOY_DIR.
    pub keys_file: Option<PathBuf>,
    /// The quota of a key its file line does not override.
    pub quota: KeyQuota,
    pub quota_mode: QuotaMode,
    pub fair_charge: FairCharge,
    /// SESSION_HEADER, lower-cased; `None` when empty.
    pub session_header: Option<String>,
    /// INTERACTIVE_RESERVE and its companions.
    pub reserve: Reserve,
    /// QUARANTINE_TTL.
    pub quarantine_ttl: std::time::Duration,
}

/// The interactive reserve (docs/keys.md): slots long requests leave free while others are
/// active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    /// INTERACTIVE_RESERVE as set (admission bounds it by MAX_NUM_SEQS - 1).
    pub slots: u32,
    /// LONG_PROMPT_TOKENS.
    pub long_prompt_tokens: u64,
    /// INTERACTIVE_ACTIVE_S.
    pub active: std::time::Duration,
    /// LONG_MAX_WAIT_S.
    pub max_wait: std::time::Duration,
}

/// HTTPS on the gateway's port (TLS_CERT, TLS_KEY, TLS_CLIENT_CA), each resolved against
/// DEPLOY_DIR; their content is read by the gateway (a certificate can change while it runs).
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// Client certificates are required, signed by one of these authorities (mutual TLS).
    pub client_ca: Option<std::path::PathBuf>,
}

/// OpenTelemetry tracing (OTEL_EXPORTER_OTLP_*), on when an endpoint is set.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    /// The collector's base URL, without a trailing slash (`/v1/traces` is added).
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub service_name: String,
}

impl Tracing {
    /// Where spans are posted: the endpoint's `/v1/traces`, as the OTLP/HTTP specification
    /// derives a signal's URL from OTEL_EXPORTER_OTLP_ENDPOINT.
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint)
    }
}
