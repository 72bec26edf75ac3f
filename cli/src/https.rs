//! The CLI's one HTTP client, for every command that talks to a gateway: plain HTTP, or HTTPS
//! verified against `--cacert` (SPARKGATE_CACERT) when given, else the system's roots. A gateway
//! with TLS_CERT is addressed as `https://127.0.0.1:PORT` by default (its certificate must name
//! 127.0.0.1, or pass `--url` with the name it has).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;
use sparkgate_config::Config;

pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// `--cacert`, set once from the command line.
static CACERT: OnceLock<Option<PathBuf>> = OnceLock::new();

pub(crate) fn set_cacert(path: Option<PathBuf>) {
    let _ = CACERT.set(path);
}

/// The gateway's base URL on this machine, by its configuration.
pub(crate) fn local_base(config: &Config) -> String {
    let scheme = if config.gateway.tls.is_some() { "https" } else { "http" };
    format!("{scheme}://127.0.0.1:{}", config.ports.public)
}

/// The roots a gateway's certificate is checked against.
fn roots(cacert: Option<&Path>) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    match cacert {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| anyhow::anyhow!("--cacert {}: {e}", path.display()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| anyhow::anyhow!("--cacert {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| anyhow::anyhow!("--cacert {}: {e}", path.display()))?;
            }
            anyhow::ensure!(
                !roots.is_empty(),
                "--cacert {}: holds no PEM certificate",
                path.display()
            );
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::debug!(errors = ?found.errors, "no system root certificates found");
            }
        }
    }
    Ok(roots)
}

/// A client for `base`'s scheme (TCP_NODELAY on). Only an `https://` base reads the roots it
/// trusts (`--cacert`, else the system's: a few hundred certificates), once per process — a
/// command polling a plain-HTTP gateway pays nothing for TLS.
pub(crate) fn client_for(base: &str) -> anyhow::Result<HttpClient> {
    let tls = if base.starts_with("https://") {
        verifying()?
    } else {
        // Never used for an http:// URL; the connector's type wants one.
        std::sync::Arc::new(config(rustls::RootCertStore::empty())?)
    };
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(std::sync::Arc::unwrap_or_clone(tls))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// The configuration that checks a gateway's certificate, built on first use.
fn verifying() -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    static BUILT: OnceLock<std::sync::Arc<rustls::ClientConfig>> = OnceLock::new();
    if let Some(c) = BUILT.get() {
        return Ok(c.clone());
    }
    let cacert = CACERT.get().and_then(|c| c.as_deref());
    let built = std::sync::Arc::new(config(roots(cacert)?)?);
    Ok(BUILT.get_or_init(|| built).clone())
}

fn config(roots: rustls::RootCertStore) -> anyhow::Result<rustls::ClientConfig> {
    // ring, as the gateway's own TLS (gateway/src/http/tls.rs says why).
    #[allow(deprecated)]
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Why a request found no gateway, in words: a failed TLS handshake (a `rustls::Error`
/// somewhere in the chain: an untrusted or mismatched certificate names itself), else whether
/// anything listens, each with the innermost cause.
pub(crate) fn why_not(e: &hyper_util::client::legacy::Error) -> String {
    let mut tls = None;
    let mut cause: &dyn std::error::Error = e;
    loop {
        if let Some(t) = cause.downcast_ref::<rustls::Error>() {
            tls = Some(t.to_string());
        }
        // An io::Error's `source()` skips the error it wraps (hyper-rustls wraps tokio-rustls'
        // io::Error, which wraps the rustls::Error): step into it first.
        let wrapped = cause.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref);
        match wrapped.map(|w| w as &dyn std::error::Error).or_else(|| cause.source()) {
            Some(next) => cause = next,
            None => break,
        }
    }
    match (tls, e.is_connect()) {
        (Some(t), _) => format!("the TLS handshake failed: {t}; trust the gateway's certificate with --cacert FILE"),
        (None, true) => format!("nothing is listening there: {cause}"),
        (None, false) => format!("the connection failed: {cause}"),
    }
}
