//! HTTPS on the gateway's port (TLS_CERT, TLS_KEY, optionally TLS_CLIENT_CA for mutual TLS):
//! rustls with ring, h2 and HTTP/1.1 offered by ALPN. The files are read at start — a
//! certificate that cannot serve (unreadable, no key, a key of another certificate, expired or
//! not yet valid) stops the start with the reason — and again on SIGHUP and when one of them
//! changes: the new configuration serves the next handshake, open connections keep theirs, and
//! one that does not load leaves the old one serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use sparkgate_config::TlsFiles;

use super::cert_dates::{self, Validity};

/// Why a certificate cannot serve, naming the setting and the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("{knob} {}: cannot read it: {source}", path.display())]
    Unreadable {
        knob: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{knob} {}: {what}", path.display())]
    Pem {
        knob: &'static str,
        path: PathBuf,
        what: String,
    },
    #[error("TLS_CERT {}: the certificate expired on {} (notAfter); renew it", path.display(), cert_dates::show(*not_after))]
    Expired { path: PathBuf, not_after: i64 },
    #[error("TLS_CERT {}: the certificate is not valid before {} (notBefore); is the clock right?", path.display(), cert_dates::show(*not_before))]
    NotYetValid { path: PathBuf, not_before: i64 },
    #[error("TLS_CERT {}: the certificate's dates cannot be read (not an X.509 certificate?)", path.display())]
    NoDates { path: PathBuf },
    #[error("TLS_KEY {} is not the key of TLS_CERT {}'s certificate ({reason})", key.display(), cert.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("TLS_CLIENT_CA {}: {reason}", path.display())]
    ClientCa { path: PathBuf, reason: String },
}

/// What was loaded, for the log line and `/admin/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub(crate) validity: Validity,
    pub(crate) chain: usize,
    pub(crate) client_auth: bool,
}

/// The serving configuration and what it was built from.
#[derive(Debug)]
pub(crate) struct Tls {
    files: TlsFiles,
    /// The configuration serving, and what it was loaded from (swapped together).
    current: RwLock<(Arc<ServerConfig>, Loaded)>,
    /// The files' modification times and sizes when last read.
    stamp: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

/// The protocols offered by ALPN, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

impl Tls {
    /// Reads the files; the error says what is wrong with which.
    pub(crate) fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let stamp = stamps(files);
        let (config, loaded) = build(files, now())?;
        Ok(Tls {
            files: files.clone(),
            current: RwLock::new((Arc::new(config), loaded)),
            stamp: Mutex::new(stamp),
        })
    }

    /// The configuration the next handshake uses.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().expect("tls lock").0.clone())
    }

    pub(crate) fn loaded(&self) -> Loaded {
        self.current.read().expect("tls lock").1
    }

    /// Whether a file changed since it was last read (its time or size).
    pub(crate) fn changed(&self) -> bool {
        *self.stamp.lock().expect("tls lock") != stamps(&self.files)
    }

    /// Reads the files again; on an error the configuration in place stays.
    pub(crate) fn reload(&self) -> Result<Loaded, TlsError> {
        // Stamped first: a file that changes while it is read is read again next time.
        *self.stamp.lock().expect("tls lock") = stamps(&self.files);
        let (config, loaded) = build(&self.files, now())?;
        *self.current.write().expect("tls lock") = (Arc::new(config), loaded);
        Ok(loaded)
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn stamps(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    let paths = [Some(&files.cert), Some(&files.key), files.client_ca.as_ref()];
    paths
        .into_iter()
        .flatten()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

fn read(knob: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        knob,
        path: path.to_owned(),
        source,
    })
}

fn pem_error(knob: &'static str, path: &Path, e: rustls::pki_types::pem::Error) -> TlsError {
    let what = match e {
        rustls::pki_types::pem::Error::NoItemsFound => match knob {
            "TLS_KEY" => "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned(),
            _ => "holds no PEM certificate".to_owned(),
        },
        other => format!("is not valid PEM: {other}"),
    };
    TlsError::Pem {
        knob,
        path: path.to_owned(),
        what,
    }
}

/// The certificate chain of TLS_CERT, its leaf's dates checked against `now`.
fn chain(path: &Path, now: i64) -> Result<(Vec<CertificateDer<'static>>, Validity), TlsError> {
    let pem = read("TLS_CERT", path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error("TLS_CERT", path, e))?;
    let Some(leaf) = certs.first() else {
        return Err(pem_error("TLS_CERT", path, rustls::pki_types::pem::Error::NoItemsFound));
    };
    let validity = cert_dates::validity(leaf).ok_or_else(|| TlsError::NoDates { path: path.to_owned() })?;
    if validity.not_after < now {
        return Err(TlsError::Expired {
            path: path.to_owned(),
            not_after: validity.not_after,
        });
    }
    if validity.not_before > now {
        return Err(TlsError::NotYetValid {
            path: path.to_owned(),
            not_before: validity.not_before,
        });
    }
    Ok((certs, validity))
}

/// The client-certificate verifier of TLS_CLIENT_CA.
fn client_verifier(
    path: &Path,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let pem = read("TLS_CLIENT_CA", path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| pem_error("TLS_CLIENT_CA", path, e))?;
        roots.add(cert).map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// The server configuration of `files` as they are now.
fn build(files: &TlsFiles, now: i64) -> Result<(ServerConfig, Loaded), TlsError> {
    let (certs, validity) = chain(&files.cert, now)?;
    let key_pem = read("TLS_KEY", &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| pem_error("TLS_KEY", &files.key, e))?;
    // ring, not aws-lc-rs: no C library of 200 000 lines to build on the head node; its one
    // loss is the post-quantum key exchange (X25519MLKEM768), which rustls 0.23.48 flags by
    // deprecating this constructor. X25519 and the P-curves remain.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    let builder = match &files.client_ca {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, &provider)?),
        None => builder.with_no_client_auth(),
    };
    let chain_len = certs.len();
    let mut config = builder.with_single_cert(certs, key).map_err(|e| TlsError::Mismatch {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason: e.to_string(),
    })?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    let loaded = Loaded {
        validity,
        chain: chain_len,
        client_auth: files.client_ca.is_some(),
    };
    Ok((config, loaded))
}

/// A TLS record's first byte is its content type; a handshake is 22. Anything else on the TLS
/// port is most likely plain HTTP (`GET /…`, `POST …`), answered with the fix.
pub(crate) const HANDSHAKE: u8 = 0x16;
