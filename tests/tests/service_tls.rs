//! HTTPS on the gateway's port (TLS_CERT, TLS_KEY) with real clients: curl over h2 and
//! HTTP/1.1, the openai and anthropic SDKs verifying against a test CA, `sparkgate status
//! --cacert`, a certificate rotated under 20 open streams (none lost, the new one served), plain
//! HTTP answered with the fix, and certificates that cannot serve refused at start with the
//! reason — and at a reload, keeping the old one. Certificates are made with openssl's CLI.

use std::path::{Path, PathBuf};
use std::process::Command;

use sparkgate_tests::harness::{Proc, Sim};
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA in `dir`: `ca.pem`, `ca.key`.
fn ca(dir: &Path) {
    let (pem, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=sparkgate test CA",
        "-keyout",
        &s(&key),
        "-out",
        &s(&pem),
    ]);
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A leaf for localhost and 127.0.0.1 signed by the CA (a server's or a client's): `{name}.pem`, `{name}.key`, valid for
/// two days or expired since yesterday.
fn leaf(dir: &Path, name: &str, expired: bool) -> (PathBuf, PathBuf) {
    let (pem, key, csr, ext) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.csr")),
        dir.join("ext"),
    );
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &s(&key),
        "-out",
        &s(&csr),
    ]);
    let mut args = vec![
        "x509",
        "-req",
        "-in",
        &s(&csr),
        "-CA",
        &s(&dir.join("ca.pem")),
        "-CAkey",
        &s(&dir.join("ca.key")),
        "-set_serial",
        if expired { "7" } else { "0x1234" },
        "-extfile",
        &s(&ext),
        "-out",
        &s(&pem),
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    // `-days -1`: it expired a day ago.
    args.extend(["-days", if expired { "-1" } else { "2" }].map(str::to_owned));
    openssl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    (pem, key)
}

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn real_clients_speak_https_and_a_rotation_loses_no_stream() {
    let dir = tempfile::tempdir().unwrap();
    ca(dir.path());
    let (cert, key) = leaf(dir.path(), "first", false);
    let (new_cert, new_key) = leaf(dir.path(), "second", false);
    let sim = Sim::start(SIM, &sparkgate_tests::load::DEEPSEEK_SIM_ARGS, &[("SIM_SPEED", "1")]);
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .envs(&[
            ("TLS_CERT", s(&cert)),
            ("TLS_KEY", s(&key)),
            ("MAX_NUM_SEQS", "32".into()),
        ])
        .start_unready();
    let base = format!("https://localhost:{}", gw.addr.port());
    let ca = s(&dir.path().join("ca.pem"));
    let (h2, _) = curl(&[
        "--cacert",
        &ca,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        &format!("{base}/health"),
    ]);
    assert_eq!(h2, "200 2", "h2 by ALPN");
    let (h1, _) = curl(&[
        "--http1.1",
        "--cacert",
        &ca,
        "-w",
        " %{http_code} %{http_version}",
        &format!("{base}/v1/models"),
    ]);
    assert!(h1.ends_with(" 200 1.1") && h1.contains(MODEL), "{h1}");
    let (plain, _) = curl(&[
        "-w",
        " %{http_code}",
        &format!("http://127.0.0.1:{}/health", gw.addr.port()),
    ]);
    assert!(
        plain.ends_with(" 400") && plain.contains("this port serves HTTPS"),
        "{plain}"
    );
    let status = Command::new(sparkgate_bin(SIM))
        .args(["status", "--url", &base, "--cacert", &ca])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && table.contains(MODEL),
        "{table}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let bench = Command::new(sparkgate_bin(SIM))
        .args(["bench", "--url", &format!("{base}/v1"), "--cacert", &ca])
        .args([
            "--runs",
            "1",
            "--concurrency",
            "1",
            "--max-tokens",
            "16",
            "--phase",
            "prose",
            "--skip-coherence",
        ])
        .output()
        .unwrap();
    let told = String::from_utf8_lossy(&bench.stderr);
    assert!(
        bench.status.success(),
        "bench over HTTPS: {told}{}",
        String::from_utf8_lossy(&bench.stdout)
    );
    let untrusting = Command::new(sparkgate_bin(SIM))
        .args(["status", "--url", &base])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&untrusting.stderr);
    assert!(
        !untrusting.status.success() && said.contains("the TLS handshake failed"),
        "{said}"
    );

    let pid = gw.proc.pid().to_string();
    let [cert, key, new_cert, new_key] = [&cert, &key, &new_cert, &new_key].map(|p| s(p));
    let env = [
        ("SPARKGATE_BASE_URL", base.as_str()),
        ("SPARKGATE_MODEL", MODEL),
        ("SPARKGATE_CA", &ca),
        ("SPARKGATE_PID", &pid),
        ("SPARKGATE_CERT", &cert),
        ("SPARKGATE_KEY", &key),
        ("SPARKGATE_NEW_CERT", &new_cert),
        ("SPARKGATE_NEW_KEY", &new_key),
    ];
    let got = sparkgate_tests::python::script("tls_clients.py", &[], &env)
        .unwrap_or_else(|e| panic!("{e}"))
        .last_json();
    assert_eq!(got["openai"], "323", "{got}");
    assert!(
        ["end_turn", "max_tokens"].contains(&got["anthropic"].as_str().unwrap()),
        "{got}"
    );
    assert!(got["untrusted"].as_str().unwrap().starts_with("refused"), "{got}");
    let streams = got["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 20);
    for s in streams {
        assert_eq!(s[0], "length", "every stream open across the rotation finished: {got}");
    }
    assert_ne!(got["before"], got["after"], "{got}");
    assert_eq!(got["new_is_served"], true, "{got}");
    gw.proc
        .wait_for("TLS certificate serving (HTTPS; h2 and HTTP/1.1 by ALPN) why=\"SIGHUP\"");
}

/// `sparkgate serve` with these TLS files, to its exit.
fn refused_at_start(cert: &Path, key: &Path) -> String {
    let mut gw: Proc = TestGateway::builder(SIM)
        .upstream_url("http://127.0.0.1:9")
        .envs(&[("TLS_CERT", s(cert)), ("TLS_KEY", s(key))])
        .spawn();
    let status = gw.wait_exit(std::time::Duration::from_secs(30));
    assert!(!status.success());
    gw.log().join("\n")
}

#[test]
fn certificates_that_cannot_serve_are_refused_at_start_and_kept_out_at_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    ca(dir.path());
    let (cert, key) = leaf(dir.path(), "good", false);
    let (old, old_key) = leaf(dir.path(), "old", true);
    let (_, other_key) = leaf(dir.path(), "other", false);
    let log = refused_at_start(&old, &old_key);
    assert!(
        log.contains("the certificate expired on ") && log.contains(" UTC (notAfter); renew it"),
        "{log}"
    );
    let log = refused_at_start(&cert, &other_key);
    assert!(log.contains("is not the key of TLS_CERT"), "{log}");
    let log = refused_at_start(&dir.path().join("missing.pem"), &key);
    assert!(log.contains("missing.pem: cannot read it"), "{log}");
    let log = refused_at_start(&key, &key);
    assert!(log.contains("holds no PEM certificate"), "{log}");

    // Running: a bad certificate at a reload is refused with a warning; the good one serves on.
    let live = dir.path().join("live.pem");
    std::fs::copy(&cert, &live).unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream_url("http://127.0.0.1:9")
        .envs(&[("TLS_CERT", s(&live)), ("TLS_KEY", s(&key))])
        .start_unready();
    gw.proc.wait_for("TLS certificate serving");
    std::fs::copy(&old, &live).unwrap();
    gw.proc
        .wait_for("TLS certificate not reloaded: the previous one keeps serving");
    let ca = s(&dir.path().join("ca.pem"));
    let (code, err) = curl(&[
        "--cacert",
        &ca,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://localhost:{}/health", gw.addr.port()),
    ]);
    assert_eq!(code, "200", "the old certificate still serves: {err}");
}

#[test]
fn with_client_ca_only_a_client_with_its_certificate_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    ca(dir.path());
    let (cert, key) = leaf(dir.path(), "server", false);
    let (client, client_key) = leaf(dir.path(), "client", false);
    let ca = s(&dir.path().join("ca.pem"));
    let gw = TestGateway::builder(SIM)
        .upstream_url("http://127.0.0.1:9")
        .envs(&[
            ("TLS_CERT", s(&cert)),
            ("TLS_KEY", s(&key)),
            ("TLS_CLIENT_CA", ca.clone()),
        ])
        .start_unready();
    gw.proc.wait_for("client_certificates=true");
    let url = format!("https://localhost:{}/health", gw.addr.port());
    let (code, err) = curl(&["--cacert", &ca, "-o", "/dev/null", "-w", "%{http_code}", &url]);
    assert_eq!(code, "000", "no client certificate, no connection: {err}");
    let (code, err) = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &s(&client),
        "--key",
        &s(&client_key),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &url,
    ]);
    assert_eq!(code, "200", "{err}");
}
