//! The gateway's settings: upstream URL, aliases, the reasoning-effort map, queue, timeouts,
//! rate limit and limits.

use std::time::Duration;

use super::Builder;
use crate::config::Gateway;
use crate::profile::ProfileId;

impl Builder<'_> {
    pub(super) fn gateway(&mut self, profile: ProfileId) -> Gateway {
        let upstream = self.string("UPSTREAM_URL");
        if !upstream_ok(upstream.trim_end_matches('/')) {
            self.fail("UPSTREAM_URL", "must be an http:// URL such as http://127.0.0.1:18888");
        }
        let model_aliases: Vec<String> = self
            .string("MODEL_ALIASES")
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        let effort_map = self.effort_map(profile);
        let rpm = self.int("RATE_LIMIT_RPM", 0..=1_000_000u32);
        let burst = self.opt_int("RATE_LIMIT_BURST", 1..=1_000_000u32).unwrap_or(rpm.max(1));
        let log = self.one_of("LOG_FORMAT", &["text", "json"]);
        Gateway {
            bind: self.ip("BIND_ADDR"),
            upstream: upstream.trim_end_matches('/').to_owned(),
            model_aliases,
            effort_map,
            queue_depth: self.int("QUEUE_DEPTH", 0..=1_000_000usize),
            queue_max_bytes: self.int("QUEUE_MAX_BYTES", 0..=68_719_476_736usize),
            queue_timeout: Duration::from_secs(self.int("QUEUE_TIMEOUT", 0..=86_400u64)),
            first_token_timeout: self.seconds("FIRST_TOKEN_TIMEOUT"),
            stream_idle_timeout: self.seconds("STREAM_IDLE_TIMEOUT"),
            request_timeout: self.seconds("REQUEST_TIMEOUT"),
            rate_limit_rpm: (rpm > 0).then_some(rpm),
            rate_limit_burst: burst,
            metrics_public: self.flag("METRICS_PUBLIC"),
            max_body_bytes: self.int("MAX_BODY_BYTES", 1024..=1_073_741_824usize),
            header_read_timeout: self.seconds("HEADER_READ_TIMEOUT"),
            max_connections: self.int("MAX_CONNECTIONS", 1..=1_000_000usize),
            drain_timeout: Duration::from_secs(self.int("DRAIN_TIMEOUT", 0..=86_400u64)),
            log_json: log == "json",
            worker_threads: self.int("WORKER_THREADS", 0..=1024usize),
        }
    }
}

/// Whether the gateway can build upstream request URIs on `base` (`{base}{path}`), checked
/// with the same parser it builds them with: `http://` and a host, no path, query or fragment.
fn upstream_ok(base: &str) -> bool {
    let Some(rest) = base.strip_prefix("http://") else {
        return false;
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return false;
    }
    format!("{base}/v1/models?x=1").parse::<http::Uri>().is_ok_and(|u| {
        u.scheme_str() == Some("http")
            && u.authority()
                .is_some_and(|a| !a.host().is_empty() && port_ok(a.as_str()))
    })
}

/// An authority's port, when it has one, is a number the connector can dial.
fn port_ok(authority: &str) -> bool {
    // After an IPv6 literal's `]`, or after the host.
    let tail = authority.rsplit_once(']').map_or(authority, |(_, t)| t);
    match tail.rsplit_once(':') {
        Some((_, port)) => port.parse::<u16>().is_ok(),
        None => true,
    }
}

impl Builder<'_> {
    /// `from=to,…`: `from` an OpenAI effort name, `to` one the profile's template accepts.
    fn effort_map(&mut self, profile: ProfileId) -> Vec<(String, String)> {
        const OPENAI: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];
        let facts = profile.reasoning();
        let raw = self.string("REASONING_EFFORT_MAP");
        let mut map = Vec::new();
        for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((from, to)) = pair.split_once('=').map(|(f, t)| (f.trim(), t.trim())) else {
                self.fail("REASONING_EFFORT_MAP", format!("`{pair}` must be from=to"));
                continue;
            };
            let to_ok = to == "none"
                || facts.named.iter().any(|(n, _)| *n == to)
                || (profile == ProfileId::Glm53Flash && to == "max")
                || facts
                    .integer_range
                    .is_some_and(|(lo, hi)| to.parse::<u8>().is_ok_and(|v| (lo..=hi).contains(&v)));
            if !OPENAI.contains(&from) {
                self.fail(
                    "REASONING_EFFORT_MAP",
                    format!("`{from}` is not an effort name ({})", OPENAI.join(", ")),
                );
            } else if !to_ok {
                self.fail(
                    "REASONING_EFFORT_MAP",
                    format!("`{from}={to}`: {profile} accepts {}", accepted_efforts(profile)),
                );
            } else {
                map.push((from.to_owned(), to.to_owned()));
            }
        }
        map
    }
}

/// The effort values a profile's template takes, for messages.
pub(crate) fn accepted_efforts(profile: ProfileId) -> String {
    let facts = profile.reasoning();
    let mut names: Vec<String> = facts.named.iter().map(|(n, _)| (*n).to_owned()).collect();
    if profile == ProfileId::Glm53Flash {
        names.push("max".into());
    }
    names.push("none".into());
    if let Some((lo, hi)) = facts.integer_range {
        names.push(format!("an integer {lo}-{hi}"));
    }
    names.join(", ")
}
