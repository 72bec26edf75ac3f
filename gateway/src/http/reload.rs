//! What is read again while the gateway runs: the API keys (API_KEYS_FILE) and the TLS
//! certificate (TLS_CERT, TLS_KEY, TLS_CLIENT_CA) — all of them on SIGHUP (`systemctl reload`,
//! told to systemd as RELOADING=1 … READY=1), each alone when its file changes (looked at every
//! 2 s). Whatever does not load keeps what serves and says why; no connection is dropped.

use std::sync::Arc;
use std::time::Duration;

use super::systemd;
use super::tls::Tls;
use crate::control::keys::KeyRing;
use crate::observe;

/// What a reload reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    Keys,
    Certificate,
}

/// What set a reload off: SIGHUP reads everything and is told to systemd; a changed file reads
/// only itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Signal,
    Changed(&'static str),
}

impl Trigger {
    fn why(self) -> &'static str {
        match self {
            Trigger::Signal => "SIGHUP",
            Trigger::Changed(what) => what,
        }
    }
}

/// Starts the reload task.
pub(crate) fn watch(keys: Arc<KeyRing>, tls: Option<Arc<Tls>>, mode: sparkgate_config::QuotaMode) {
    sparkgate_task::spawn("reload", async move {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            let (trigger, what): (Trigger, &[What]) = tokio::select! {
                Some(()) = async { hup.as_mut()?.recv().await } => (Trigger::Signal, &[What::Keys, What::Certificate]),
                _ = tick.tick() => match (keys.file_changed(), tls.as_ref().is_some_and(|t| t.changed())) {
                    (true, true) => (Trigger::Changed("a file changed"), &[What::Keys, What::Certificate]),
                    (true, false) => (Trigger::Changed("API_KEYS_FILE changed"), &[What::Keys]),
                    (false, true) => (Trigger::Changed("a TLS file changed"), &[What::Certificate]),
                    (false, false) => continue,
                },
            };
            if trigger == Trigger::Signal {
                systemd::reloading();
            }
            for w in what {
                match (w, &tls) {
                    (What::Keys, _) => reload_keys(&keys, mode, trigger.why()),
                    (What::Certificate, Some(tls)) => reload_certificate(tls, trigger.why()),
                    (What::Certificate, None) => {}
                }
            }
            if trigger == Trigger::Signal {
                systemd::reloaded();
            }
        }
    });
}

fn reload_keys(keys: &KeyRing, mode: sparkgate_config::QuotaMode, why: &str) {
    match keys.reload() {
        Ok(n) => {
            metrics::counter!(observe::KEY_RELOADS, "outcome" => "loaded").increment(1);
            observe::usage::known(&keys.names(), mode);
            tracing::info!(keys = n, names = ?keys.names(), why, "API keys reloaded");
        }
        Err(e) => {
            metrics::counter!(observe::KEY_RELOADS, "outcome" => "refused").increment(1);
            tracing::error!(error = %e, why, "API keys not reloaded: the previous keys stay");
        }
    }
}

fn reload_certificate(tls: &Tls, why: &str) {
    match tls.reload() {
        Ok(_) => {
            metrics::counter!(observe::TLS_RELOADS, "outcome" => "loaded").increment(1);
            log_loaded(tls, why);
        }
        Err(e) => {
            metrics::counter!(observe::TLS_RELOADS, "outcome" => "refused").increment(1);
            tracing::warn!(error = %e, why, "TLS certificate not reloaded: the previous one keeps serving");
        }
    }
}

/// The log line and gauge of the certificate now serving.
pub(crate) fn log_loaded(tls: &Tls, why: &str) {
    let loaded = tls.loaded();
    #[allow(clippy::cast_precision_loss)]
    metrics::gauge!(observe::TLS_NOT_AFTER).set(loaded.validity.not_after as f64);
    tracing::info!(
        why,
        chain = loaded.chain,
        client_certificates = loaded.client_auth,
        not_after = %super::cert_dates::show(loaded.validity.not_after),
        "TLS certificate serving (HTTPS; h2 and HTTP/1.1 by ALPN)"
    );
}
