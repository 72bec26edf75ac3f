//! The TLS fronts' certificate: one CA and one P-256 server certificate for 127.0.0.1, made once
//! per run with openssl's CLI in a directory that lives as long as the process; the load client
//! trusts the CA.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The directory with `ca.pem`, `leaf.pem` and `leaf.key`, or why it could not be made.
fn dir() -> Result<&'static Path, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(make).as_deref().map_err(Clone::clone)
}

fn openssl(args: &[&str], dir: &Path) -> Result<(), String> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr))),
    }
}

fn make() -> Result<PathBuf, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let ca = [
        &["req", "-x509"][..],
        &ec,
        &[
            "-days",
            "2",
            "-subj",
            "/CN=overhead CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    ]
    .concat();
    openssl(&ca, &dir)?;
    let csr = [
        &["req"][..],
        &ec,
        &["-subj", "/CN=127.0.0.1", "-keyout", "leaf.key", "-out", "leaf.csr"],
    ]
    .concat();
    openssl(&csr, &dir)?;
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| e.to_string())?;
    let sign = [
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-set_serial",
        "1",
        "-days",
        "2",
        "-extfile",
        "ext",
        "-out",
        "leaf.pem",
    ];
    openssl(&sign, &dir)?;
    Ok(dir)
}

/// The server certificate and its key.
pub fn leaf() -> Result<(PathBuf, PathBuf), String> {
    let d = dir()?;
    Ok((d.join("leaf.pem"), d.join("leaf.key")))
}

/// The CA the load client trusts (made on first use).
pub fn ca() -> Result<PathBuf, String> {
    Ok(dir()?.join("ca.pem"))
}
