//! Operator commands that talk to a running gateway's `/admin` API: `status`, `restart`,
//! `stop`, `start`, `logs` — the reference launchers' subcommands, over HTTP.

use std::io::Write as _;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sparkgate_config::Config;

/// Which gateway to talk to.
#[derive(Debug, Args)]
pub struct Target {
    /// The gateway's base URL [default: http://127.0.0.1:PORT].
    #[arg(long, value_name = "URL")]
    url: Option<String>,
}

fn base(config: &Config, target: &Target) -> String {
    target
        .url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", config.ports.public))
        .trim_end_matches('/')
        .to_owned()
}

/// Sends one admin request; streams the body to stdout when `stream` is set.
fn call(
    config: &Config,
    target: &Target,
    method: &str,
    path: &str,
    body: Bytes,
    stream: bool,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let url = format!("{}{path}", base(config, target));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let mut req = hyper::Request::builder().method(method).uri(&url);
        if let Some(t) = &config.secrets.admin_token {
            req = req.header("authorization", format!("Bearer {}", t.expose()));
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let resp = client
            .request(req.body(Full::new(body))?)
            .await
            .map_err(|e| anyhow::anyhow!("no sparkgate answers at {url} ({e}); is `sparkgate serve` running?"))?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut all = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                if stream && status < 300 {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&data)?;
                    out.flush()?;
                } else {
                    all.extend_from_slice(&data);
                }
            }
        }
        Ok((status, all))
    })
}

fn report(status: u16, body: &[u8]) -> ExitCode {
    let text = String::from_utf8_lossy(body);
    if status < 300 {
        println!("{}", text.trim_end());
        ExitCode::SUCCESS
    } else {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.into_owned());
        eprintln!("sparkgate: {status}: {message}");
        ExitCode::FAILURE
    }
}

pub(super) fn post(config: &Config, target: &Target, path: &str) -> anyhow::Result<ExitCode> {
    let (status, body) = call(config, target, "POST", path, Bytes::new(), false)?;
    Ok(report(status, &body))
}

/// `sparkgate spec`: the active mode and the profile's modes; `sparkgate spec MODE`: drain, then
/// restart into MODE.
pub(super) fn spec(config: &Config, target: &Target, mode: Option<&str>, force: bool) -> anyhow::Result<ExitCode> {
    let Some(mode) = mode else {
        let (status, body) = call(config, target, "GET", "/admin/spec", Bytes::new(), false)?;
        if status >= 300 {
            return Ok(report(status, &body));
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        println!(
            "mode      {} (policy {})",
            v["mode"].as_str().unwrap_or("?"),
            v["policy"].as_str().unwrap_or("?")
        );
        for m in v["modes"].as_array().into_iter().flatten() {
            let table: Vec<String> = m["throughput"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("×{} {}", p["width"], p["tokens_per_s"]))
                .collect();
            println!(
                "  {:<7} max_num_seqs {}  tokens/s {}",
                m["mode"].as_str().unwrap_or("?"),
                m["max_num_seqs"],
                table.join(", ")
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let path = if force { "/admin/spec?force=1" } else { "/admin/spec" };
    let body = Bytes::from(serde_json::json!({ "mode": mode }).to_string());
    let (status, body) = call(config, target, "POST", path, body, false)?;
    Ok(report(status, &body))
}

pub(super) fn status(config: &Config, target: &Target, json: bool) -> anyhow::Result<ExitCode> {
    let (status, body) = call(config, target, "GET", "/admin/status", Bytes::new(), false)?;
    if json || status >= 300 {
        return Ok(report(status, &body));
    }
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    let a = &v["admission"];
    println!(
        "model     {} ({}), mode {}",
        v["model"].as_str().unwrap_or("?"),
        v["profile"].as_str().unwrap_or("?"),
        v["mode"].as_str().unwrap_or("?")
    );
    println!("ready     {}  upstream {}", v["ready"], v["upstream"]);
    println!(
        "admission capacity {} in flight {} queued {} open {}",
        a["capacity"], a["in_flight"], a["queued"], a["open"]
    );
    if let Some(s) = v.get("supervisor") {
        println!(
            "group     {} epoch {} restarts {} runtime {}",
            s["state"].as_str().unwrap_or("?"),
            s["epoch"],
            s["restarts"],
            s["runtime"].as_str().unwrap_or("?")
        );
        if let Some(p) = s.get("preparing").and_then(|p| p.as_str()) {
            println!("preparing {p}");
        }
        if let Some(r) = s.get("last_restart").filter(|r| !r.is_null()) {
            println!("last      {}", r["reason"].as_str().unwrap_or("?"));
        }
        for r in s["ranks"].as_array().into_iter().flatten() {
            println!(
                "rank {}    {} pid {} running {} up {:.0}s log {}",
                r["rank"],
                r["node"].as_str().unwrap_or("?"),
                r["pid"],
                r["running"],
                r["uptime_s"].as_f64().unwrap_or(0.0),
                r["log"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn logs(
    config: &Config,
    target: &Target,
    which: &[String],
    tail: usize,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    let rank = match which.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] | ["head"] => 0,
        ["worker"] => 1,
        ["rank", n] => n
            .parse()
            .map_err(|_| anyhow::anyhow!("`logs rank N` needs a number, got {n}"))?,
        other => anyhow::bail!("unknown log selector {other:?}: use `logs`, `logs worker` or `logs rank N`"),
    };
    let path = format!(
        "/admin/logs?rank={rank}&tail={tail}{}",
        if follow { "&follow=1" } else { "" }
    );
    let (status, body) = call(config, target, "GET", &path, Bytes::new(), true)?;
    if status >= 300 {
        return Ok(report(status, &body));
    }
    Ok(ExitCode::SUCCESS)
}
