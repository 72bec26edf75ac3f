//! A read-only Docker registry (distribution API v2) on 127.0.0.1 for pull tests: it serves one
//! image taken from a `docker save` of the head's daemon as a schema-2 manifest with uncompressed
//! layers, and asks for HTTP Basic credentials when given some (as GHCR does for private images).
//! Docker treats 127.0.0.0/8 registries as insecure, so plain HTTP works without daemon settings.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;

use sha2::{Digest, Sha256};

fn digest(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Standard base64, padded (for the expected `Authorization: Basic …` value).
fn base64(input: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(input)
}

struct Content {
    manifest: Vec<u8>,
    manifest_digest: String,
    blobs: HashMap<String, Vec<u8>>,
    /// `Basic …` the client must send, when credentials are required.
    auth: Option<String>,
}

/// The registry; it serves until dropped (the listener thread ends with the process).
#[derive(Debug)]
pub struct Registry {
    pub addr: SocketAddr,
}

impl Registry {
    /// Serves `image` (present on the machine's daemon) as `<name>:<tag>` for any name and tag;
    /// with `credentials` (user, password) every request needs them.
    pub fn serve(image: &str, credentials: Option<(&str, &str)>) -> Registry {
        let out = Command::new("docker")
            .args(["save", image])
            .output()
            .expect("docker save");
        assert!(
            out.status.success(),
            "docker save: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut files: HashMap<String, Vec<u8>> = HashMap::new();
        let mut archive = tar::Archive::new(&out.stdout[..]);
        for entry in archive.entries().expect("save tar") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("read entry");
            files.insert(path, data);
        }
        let manifest: serde_json::Value = serde_json::from_slice(&files["manifest.json"]).expect("manifest.json");
        let config = files[manifest[0]["Config"].as_str().expect("Config")].clone();
        let mut blobs = HashMap::new();
        let mut layers = Vec::new();
        for layer in manifest[0]["Layers"].as_array().expect("Layers") {
            let data = files[layer.as_str().expect("layer path")].clone();
            let d = digest(&data);
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar",
                "size": data.len(),
                "digest": d,
            }));
            blobs.insert(d, data);
        }
        let config_digest = digest(&config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": config.len(),
                "digest": config_digest,
            },
            "layers": layers,
        }))
        .expect("manifest");
        blobs.insert(config_digest, config);
        let content = Arc::new(Content {
            manifest_digest: digest(&manifest),
            manifest,
            blobs,
            auth: credentials.map(|(u, p)| format!("Basic {}", base64(format!("{u}:{p}").as_bytes()))),
        });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let content = content.clone();
                std::thread::spawn(move || {
                    let _ = handle(conn, &content);
                });
            }
        });
        Registry { addr }
    }
}

fn handle(conn: TcpStream, content: &Content) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request)? == 0 {
            return Ok(());
        }
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        let mut parts = request.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let authorized = content
            .auth
            .as_ref()
            .is_none_or(|want| headers.get("authorization") == Some(want));
        let (status, kind, body, digest): (&str, &str, &[u8], Option<&str>) = if !authorized {
            (
                "401 Unauthorized",
                "application/json",
                br#"{"errors":[{"code":"UNAUTHORIZED"}]}"#,
                None,
            )
        } else if path == "/v2/" || path == "/v2" {
            ("200 OK", "application/json", b"{}", None)
        } else if path.contains("/manifests/") {
            (
                "200 OK",
                "application/vnd.docker.distribution.manifest.v2+json",
                &content.manifest,
                Some(&content.manifest_digest),
            )
        } else if let Some(d) = path.split("/blobs/").nth(1) {
            match content.blobs.get(d) {
                Some(b) => ("200 OK", "application/octet-stream", b, Some(d)),
                None => (
                    "404 Not Found",
                    "application/json",
                    br#"{"errors":[{"code":"BLOB_UNKNOWN"}]}"#,
                    None,
                ),
            }
        } else {
            (
                "404 Not Found",
                "application/json",
                br#"{"errors":[{"code":"NAME_UNKNOWN"}]}"#,
                None,
            )
        };
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nDocker-Distribution-API-Version: registry/2.0\r\n",
            body.len()
        );
        if let Some(d) = digest {
            head.push_str(&format!("Docker-Content-Digest: {d}\r\n"));
        }
        if !authorized {
            head.push_str("WWW-Authenticate: Basic realm=\"sparkgate-test\"\r\n");
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes())?;
        if method != "HEAD" {
            conn.write_all(body)?;
        }
        conn.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b"u:t"), "dTp0");
        assert_eq!(base64(b"user:tok"), "dXNlcjp0b2s=");
        assert_eq!(base64(b"ab"), "YWI=");
    }
}
