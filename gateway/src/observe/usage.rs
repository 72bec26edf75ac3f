//! Per-key metric families (docs/keys.md), labelled by the key's name — bounded by the keys
//! configured; requests without a key fold into `anonymous` — never by the key.

use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};

pub(crate) const KEY_REQUESTS: &str = "sparkgate_key_requests_total";
pub(crate) const KEY_TOKENS: &str = "sparkgate_key_tokens_total";
pub(crate) const KEY_QUEUE_WAIT_SECONDS: &str = "sparkgate_key_queue_wait_seconds";
pub(crate) const KEY_QUOTA_REFUSALS: &str = "sparkgate_key_quota_refusals_total";
pub(crate) const KEY_RELOADS: &str = "sparkgate_key_reloads_total";
pub(crate) const USAGE_WRITE_FAILURES: &str = "sparkgate_usage_write_failures_total";
pub(crate) const USAGE_COMMIT_TIMEOUTS: &str = "sparkgate_usage_commit_timeouts_total";

pub(super) fn describe() {
    describe_counter!(
        KEY_REQUESTS,
        "Generations by API key name, route and outcome (completed, error, disconnected, refused)."
    );
    describe_counter!(
        KEY_TOKENS,
        "Tokens by API key name and kind (prompt, cached, completion, reasoning), from vLLM's own usage."
    );
    describe_histogram!(
        KEY_QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time a key's generations waited for a slot."
    );
    describe_counter!(
        KEY_QUOTA_REFUSALS,
        "Requests over their key's quota, by key name, limit and mode (enforce: refused 429; shadow: served)."
    );
    describe_counter!(
        KEY_RELOADS,
        "Reloads of the API keys (SIGHUP or API_KEYS_FILE changed), by outcome (loaded, refused)."
    );
    describe_counter!(
        USAGE_WRITE_FAILURES,
        "Writes of per-key usage to the store that failed (kept and tried again)."
    );
    describe_counter!(
        USAGE_COMMIT_TIMEOUTS,
        "Answers that ended before their usage was durable in the store: it could not be written within 5 s, or its writes were failing (the usage stays queued and is written once the store is back)."
    );
}

/// One finished generation's counts under its key's name.
pub(crate) fn finished(key: &str, route: &'static str, outcome: &'static str, u: &sparkgate_store::Usage) {
    let key = key.to_owned();
    counter!(KEY_REQUESTS, "key" => key.clone(), "route" => route, "outcome" => outcome).increment(1);
    for (kind, n) in [
        ("prompt", u.prompt),
        ("cached", u.cached),
        ("completion", u.completion),
        ("reasoning", u.reasoning),
    ] {
        if n > 0 {
            counter!(KEY_TOKENS, "key" => key.clone(), "kind" => kind).increment(n);
        }
    }
}

/// A key's queue wait.
pub(crate) fn waited(key: &str, seconds: f64) {
    histogram!(KEY_QUEUE_WAIT_SECONDS, "key" => key.to_owned()).record(seconds);
}

/// A request over its key's quota.
pub(crate) fn refused(key: &str, limit: super::QuotaLimit, mode: sparkgate_config::QuotaMode) {
    counter!(KEY_QUOTA_REFUSALS, "key" => key.to_owned(), "limit" => limit.label(), "mode" => mode.to_string())
        .increment(1);
}

/// Registers each key's quota refusals at zero, so a dashboard sees every key and limit.
pub(crate) fn known(names: &[std::sync::Arc<str>], mode: sparkgate_config::QuotaMode) {
    for name in names {
        for limit in super::QuotaLimit::ALL {
            counter!(KEY_QUOTA_REFUSALS, "key" => name.to_string(), "limit" => limit.label(), "mode" => mode.to_string())
                .increment(0);
        }
    }
}
