//! The gateway's settings: upstream URL, aliases, the reasoning-effort map, queue, timeouts,
//! rate limit and limits.

use super::Builder;
use crate::config::Gateway;
use crate::keys::ApiKey;
use crate::rule;
use crate::secret::Secret;
use crate::tenancy::{KeyQuota, Reserve, Tenancy, Tracing};

impl Builder<'_> {
    pub(super) fn gateway(&mut self) -> Gateway {
        let rpm: u32 = self.num("RATE_LIMIT_RPM");
        Gateway {
            bind: self.ip("BIND_ADDR"),
            upstream: self.text("UPSTREAM_URL").trim_end_matches('/').to_owned(),
            model_aliases: self.list("MODEL_ALIASES"),
            effort_map: self.effort_map(),
            queue_depth: self.num("QUEUE_DEPTH"),
            queue_max_bytes: self.num("QUEUE_MAX_BYTES"),
            queue_timeout: self.seconds("QUEUE_TIMEOUT"),
            queue_policy: self.choice("QUEUE_POLICY"),
            prefill_bytes_per_token: self.num("PREFILL_BYTES_PER_TOKEN"),
            groups_file: self
                .opt_text("GROUPS_FILE")
                .map(|f| std::path::Path::new(&self.r.layers.deploy_dir).join(f)),
            group_routing: self.choice("GROUP_ROUTING"),
            models: self.models(),
            models_file: self
                .opt_text("MODELS_FILE")
                .map(|f| std::path::Path::new(&self.r.layers.deploy_dir).join(f)),
            swap: crate::swap::Swap {
                policy: self.choice("SWAP_POLICY"),
                drain: self.seconds("SWAP_DRAIN_S"),
                min_dwell: self.seconds("SWAP_MIN_DWELL_S"),
                idle_unload: Some(self.seconds("IDLE_UNLOAD_S")).filter(|d| !d.is_zero()),
                memory_margin_gib: self.float("SWAP_MEMORY_MARGIN_GIB"),
                release_timeout: self.seconds("SWAP_RELEASE_TIMEOUT_S"),
            },
            affinity_wait: std::time::Duration::from_millis(self.num("AFFINITY_WAIT_MS")),
            client_weights: self.client_weights(),
            first_token_timeout: self.seconds("FIRST_TOKEN_TIMEOUT"),
            stream_idle_timeout: self.seconds("STREAM_IDLE_TIMEOUT"),
            resume_timeout: self.seconds("RESUME_TIMEOUT"),
            warm_replay_bytes: self.num("WARM_REPLAY_BYTES"),
            console_session: self.seconds("CONSOLE_SESSION_S"),
            store_url: crate::secret::Secret::new(self.text("STORE_URL")),
            store_ttl: self.seconds("STORE_TTL"),
            store_max_bytes: self.num("STORE_MAX_BYTES"),
            request_timeout: self.seconds("REQUEST_TIMEOUT"),
            rate_limit_rpm: (rpm > 0).then_some(rpm),
            rate_limit_burst: self.opt_num("RATE_LIMIT_BURST").unwrap_or(rpm.max(1)),
            metrics_public: self.flag("METRICS_PUBLIC"),
            max_body_bytes: self.num("MAX_BODY_BYTES"),
            header_read_timeout: self.seconds("HEADER_READ_TIMEOUT"),
            body_timeout: self.seconds("BODY_TIMEOUT"),
            body_min_rate: self.num("BODY_MIN_RATE"),
            max_connections: self.num("MAX_CONNECTIONS"),
            drain_timeout: self.seconds("DRAIN_TIMEOUT"),
            log_format: self.choice("LOG_FORMAT"),
            worker_threads: self.num("WORKER_THREADS"),
            tenancy: self.tenancy(),
            tracing: self.opt_text("OTEL_EXPORTER_OTLP_ENDPOINT").map(|endpoint| Tracing {
                endpoint: endpoint.trim_end_matches('/').to_owned(),
                protocol: self.choice("OTEL_EXPORTER_OTLP_PROTOCOL"),
                service_name: self.text("OTEL_SERVICE_NAME"),
            }),
            tls: self.tls(),
        }
    }

    /// TLS_CERT with TLS_KEY, or neither; TLS_CLIENT_CA only with them. Whether the files hold
    /// a usable certificate is the gateway's to say (it reads them again on a reload).
    fn tls(&mut self) -> Option<crate::tenancy::TlsFiles> {
        let path = |b: &Self, name| {
            b.opt_text(name)
                .map(|f| std::path::Path::new(&b.r.layers.deploy_dir).join(f))
        };
        let (cert, key, client_ca) = (
            path(self, "TLS_CERT"),
            path(self, "TLS_KEY"),
            path(self, "TLS_CLIENT_CA"),
        );
        match (cert, key) {
            (Some(cert), Some(key)) => Some(crate::tenancy::TlsFiles { cert, key, client_ca }),
            (Some(_), None) => {
                self.fail("TLS_CERT", "needs TLS_KEY, the certificate's private key");
                None
            }
            (None, Some(_)) => {
                self.fail("TLS_KEY", "needs TLS_CERT, the certificate it is the key of");
                None
            }
            (None, None) => {
                if client_ca.is_some() {
                    self.fail(
                        "TLS_CLIENT_CA",
                        "needs TLS_CERT and TLS_KEY: client certificates are asked for in a TLS handshake",
                    );
                }
                None
            }
        }
    }

    /// MODELS as profiles (words its rule refused were reported); one model is no MODELS.
    fn models(&self) -> Vec<crate::profile::ProfileId> {
        let models: Vec<_> = self.list("MODELS").iter().filter_map(|w| w.parse().ok()).collect();
        if models.len() < 2 {
            return Vec::new();
        }
        models
    }

    fn tenancy(&self) -> Tenancy {
        Tenancy {
            keys_file: self
                .opt_text("API_KEYS_FILE")
                .map(|f| std::path::Path::new(&self.r.layers.deploy_dir).join(f)),
            quota: KeyQuota {
                tokens_per_minute: self.num("KEY_TOKENS_PER_MINUTE"),
                tokens_per_day: self.num("KEY_TOKENS_PER_DAY"),
                max_sequences: self.num("KEY_MAX_SEQUENCES"),
            },
            quota_mode: self.choice("QUOTA_MODE"),
            fair_charge: self.choice("FAIR_CHARGE"),
            session_header: self
                .opt_text("SESSION_HEADER")
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty()),
            reserve: Reserve {
                slots: self.num("INTERACTIVE_RESERVE"),
                long_prompt_tokens: self.num("LONG_PROMPT_TOKENS"),
                active: self.seconds("INTERACTIVE_ACTIVE_S"),
                max_wait: self.seconds("LONG_MAX_WAIT_S"),
            },
            quarantine_ttl: self.seconds("QUARANTINE_TTL"),
        }
    }

    /// API_KEYS as entries; a name given twice is reported.
    pub(super) fn api_keys(&mut self) -> Vec<ApiKey> {
        let keys: Vec<ApiKey> = self.list("API_KEYS").iter().map(|e| ApiKey::parse(e)).collect();
        let mut names: Vec<&str> = keys.iter().filter_map(|k| k.name.as_deref()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            let twice = w[0].to_owned();
            self.fail("API_KEYS", format!("names {twice} twice"));
        }
        keys
    }

    /// `client=weight,…` with the pairs the knob's rule refused left out (they were reported).
    fn client_weights(&self) -> Vec<(Secret, u32)> {
        self.list("CLIENT_WEIGHTS")
            .iter()
            .filter_map(|pair| rule::weight_pair(pair).ok())
            .map(|(client, weight)| (Secret::new(client), weight))
            .collect()
    }

    /// `from=to,…` with the pairs the knob's rule refused left out (they were reported).
    fn effort_map(&self) -> Vec<(String, String)> {
        self.list("REASONING_EFFORT_MAP")
            .iter()
            .filter_map(|pair| rule::effort_pair(pair, self.r.profile).ok())
            .map(|(from, to)| (from.to_owned(), to.to_owned()))
            .collect()
    }
}
