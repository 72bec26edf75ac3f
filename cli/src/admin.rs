//! Operator commands that talk to a running gateway's `/admin` API: `status`, `restart`,
//! `stop`, `start`, `logs` — the reference launchers' subcommands, over HTTP.

use std::io::Write as _;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use sparkgate_config::{Config, SpecMethod};

use super::wait::{Goal, WaitArgs};

/// Which gateway to talk to.
#[derive(Debug, Args)]
pub struct Target {
    /// The gateway's base URL [default: http://127.0.0.1:PORT, PORT from the environment or
    /// the env file]. With --url no serving configuration is needed.
    #[arg(long, value_name = "URL")]
    pub(super) url: Option<String>,
}

/// How the gateway's address was chosen (for the fix when nothing answers there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chosen {
    /// `--url` named it.
    Url,
    /// `http://127.0.0.1:PORT` from the configuration.
    Port,
}

/// Where the gateway is and the admin token it wants.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    base: String,
    token: Option<String>,
    from: Chosen,
}

impl Endpoint {
    pub(super) fn of(config: &Config, target: &Target) -> Endpoint {
        let (base, from) = match &target.url {
            Some(url) => (url.clone(), Chosen::Url),
            None => (super::https::local_base(config), Chosen::Port),
        };
        Endpoint {
            base: base.trim_end_matches('/').to_owned(),
            token: config.secrets.admin_token.as_ref().map(|t| t.expose().to_owned()),
            from,
        }
    }

    pub(super) fn base(&self) -> &str {
        &self.base
    }

    /// `GET path` as JSON; a refusal or a gateway that does not answer is the error, in words.
    pub(super) fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        get_json(self, path)
    }

    /// `GET path` as text (`/metrics`).
    pub(super) fn text(&self, path: &str) -> anyhow::Result<String> {
        let (status, body) = call(self, "GET", path, Bytes::new(), false)?;
        anyhow::ensure!(status < 300, "{}", refusal(status, &body));
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// `--url` given: no serving configuration is loaded; ADMIN_TOKEN comes from the
    /// environment.
    pub(super) fn from_url(url: &str) -> Endpoint {
        Endpoint {
            base: url.trim_end_matches('/').to_owned(),
            token: std::env::var("ADMIN_TOKEN").ok().filter(|t| !t.is_empty()),
            from: Chosen::Url,
        }
    }
}

/// Sends one admin request; streams the body to stdout when `stream` is set.
pub(crate) fn call(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Bytes,
    stream: bool,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let url = format!("{}{path}", ep.base);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = super::https::client_for(&ep.base)?;
        let mut req = hyper::Request::builder().method(method).uri(&url);
        if let Some(t) = &ep.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let resp = client.request(req.body(Full::new(body))?).await.map_err(|e| {
            let why = super::https::why_not(&e);
            let fix = match ep.from {
                Chosen::Url => "check the URL given with --url",
                Chosen::Port => {
                    "start it with `sparkgate serve` (or `sparkgate demo`), or point at it: set PORT or pass --url URL"
                }
            };
            anyhow::anyhow!("no sparkgate answers at {} ({why}); {fix}", ep.base)
        })?;
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

/// A refusal in words: the gateway's message, then the status for the record.
pub(crate) fn refusal(status: u16, body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    let hint = match status {
        401 => "; set ADMIN_TOKEN to the gateway's admin token",
        403 => "; set ADMIN_TOKEN (without one the gateway answers only loopback clients)",
        _ => "",
    };
    format!("{message}{hint} (HTTP {status})")
}

pub(super) fn get_json(ep: &Endpoint, path: &str) -> anyhow::Result<serde_json::Value> {
    let (status, body) = call(ep, "GET", path, Bytes::new(), false)?;
    anyhow::ensure!(status < 300, "{}", refusal(status, &body));
    Ok(serde_json::from_slice(&body)?)
}

/// A command that changes the group.
#[derive(Debug, Clone)]
pub(super) enum Change {
    Restart { force: bool, group: Option<String> },
    Stop,
    Start,
    Spec { mode: SpecMethod, force: bool },
    Model { name: String },
}

/// Sends `change`, then (unless `--no-wait`) waits for its outcome, showing the phases.
pub(super) fn change(ep: &Endpoint, change: Change, wait: &WaitArgs) -> anyhow::Result<ExitCode> {
    // A group's restart is followed in that group's supervisor, shown where the group's is.
    let group = match &change {
        Change::Restart { group: Some(g), .. } => Some(g.clone()),
        _ => None,
    };
    let group_status = || -> anyhow::Result<serde_json::Value> {
        let mut s = get_json(ep, "/admin/status")?;
        if let Some(name) = &group {
            let found = s["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|g| g["name"] == name.as_str()).cloned());
            if let Some(g) = found {
                s["supervisor"] = g["supervisor"].clone();
            }
        }
        Ok(s)
    };
    let before = group_status()?;
    let epoch = before["supervisor"]["epoch"].as_u64().unwrap_or(0);
    let force = |f: bool| if f { "?force=1" } else { "" };
    let (path, body, goal) = match &change {
        Change::Restart { force: f, group } => (
            match group {
                Some(g) => format!("/admin/restart?group={g}{}", if *f { "&force=1" } else { "" }),
                None => format!("/admin/restart{}", force(*f)),
            },
            Bytes::new(),
            Goal::Ready { after: epoch },
        ),
        Change::Stop => ("/admin/stop".to_owned(), Bytes::new(), Goal::Stopped),
        Change::Model { name } => (
            "/admin/model".to_owned(),
            Bytes::from(serde_json::json!({ "model": name }).to_string()),
            Goal::Model { name: name.clone() },
        ),
        Change::Start => ("/admin/start".to_owned(), Bytes::new(), Goal::Ready { after: epoch }),
        Change::Spec { mode, force: f } => (
            format!("/admin/spec{}", force(*f)),
            Bytes::from(serde_json::json!({ "mode": mode }).to_string()),
            Goal::Mode {
                mode: *mode,
                after: epoch,
            },
        ),
    };
    let (status, answer) = call(ep, "POST", &path, body, false)?;
    if status >= 300 {
        eprintln!("sparkgate: {}", refusal(status, &answer));
        return Ok(ExitCode::FAILURE);
    }
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    // 200: nothing needed doing (already running, stopped, or in that mode); 202: under way.
    if status != 202 || wait.no_wait {
        if wait.json {
            println!("{answer}");
        } else {
            println!("{}", taken(&change, status, &answer));
        }
        return Ok(ExitCode::SUCCESS);
    }
    super::wait::wait(&goal, wait, group_status)
}

/// What the gateway said to a change it took, or why nothing needed doing.
fn taken(change: &Change, status: u16, answer: &serde_json::Value) -> String {
    let state = answer["state"].as_str().unwrap_or("?");
    match (change, status) {
        (_, 200) if answer["already_running"] == true => format!("already running ({state}); nothing changed"),
        (_, 200) if answer["already_stopped"] == true => "already stopped; nothing changed".to_owned(),
        (Change::Spec { mode, .. }, 200) => format!("already in mode {mode}; nothing changed"),
        (Change::Model { .. }, 200) => format!(
            "{} is loaded already; nothing changed",
            answer["loaded"].as_str().unwrap_or("?")
        ),
        (Change::Model { .. }, _) => format!(
            "swapping {} for {}; `sparkgate model` follows it",
            answer["from"].as_str().unwrap_or("nothing"),
            answer["to"].as_str().unwrap_or("?")
        ),
        (Change::Restart { .. }, _) => format!(
            "restarting (drain up to {} s); `sparkgate status` follows it",
            answer["drain_timeout_s"].as_f64().unwrap_or(0.0)
        ),
        (Change::Spec { mode, .. }, _) => format!("switching to {mode}; `sparkgate status` follows it"),
        (Change::Stop, _) => "stopping; `sparkgate status` follows it".to_owned(),
        (Change::Start, _) => "starting; `sparkgate status` follows it".to_owned(),
    }
}

/// `sparkgate spec` without a mode: the active mode and the profile's modes.
pub(super) fn show_spec(ep: &Endpoint) -> anyhow::Result<ExitCode> {
    let v = get_json(ep, "/admin/spec")?;
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
    Ok(ExitCode::SUCCESS)
}

/// `sparkgate status`: the gateway's state as a table (`--json`: the raw answer).
pub(super) fn status(ep: &Endpoint, json: bool) -> anyhow::Result<ExitCode> {
    let v = get_json(ep, "/admin/status")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", status_table(&v));
    }
    Ok(ExitCode::SUCCESS)
}

/// A duration as an operator reads it: `42 s`, `3 min 5 s`, `2 h 10 min`.
fn age(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

fn text(v: &serde_json::Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

/// `/admin/status` as the table `sparkgate status` prints.
pub(super) fn status_table(v: &serde_json::Value) -> String {
    let mut out = gateway_lines(v);
    let groups: Vec<&serde_json::Value> = v["groups"].as_array().into_iter().flatten().collect();
    if groups.len() > 1 {
        // Several groups: one line each; `sparkgate status --json` has every group's ranks.
        for g in groups {
            out += &group_line(g);
        }
        return out;
    }
    let Some(s) = v.get("supervisor").filter(|s| !s.is_null()) else {
        out += &format!(
            "group      not supervised (gateway-only, upstream {})\n",
            text(&v["upstream_url"])
        );
        return out;
    };
    out += &supervisor_lines(v, s);
    out += &rank_lines(s);
    out
}

/// The gateway's lines: model, readiness and mode, admission, throughput.
fn gateway_lines(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let a = &v["admission"];
    let _ = writeln!(out, "model      {} ({})", text(&v["model"]), text(&v["profile"]));
    out += &super::models::line(v);
    let ready = if v["ready"] == true { "ready" } else { "not ready" };
    let upstream = v["upstream"]["state"]
        .as_str()
        .map_or_else(|| text(&v["upstream"]), str::to_owned);
    let _ = writeln!(
        out,
        "gateway    {ready} · upstream {upstream} · mode {}",
        text(&v["mode"])
    );
    let open = if a["open"] == true { "open" } else { "held" };
    let _ = writeln!(
        out,
        "admission  {} in flight · {} queued · capacity {} · {open}",
        a["in_flight"], a["queued"], a["capacity"]
    );
    if let Some(rate) = v["tokens_per_s"].as_f64() {
        let _ = writeln!(out, "throughput {rate:.1} tokens/s over the last 10 s");
    }
    out += &vllm_lines(&v["vllm"]);
    out += &store_line(&v["store"]);
    out += &quarantine_line(v);
    out
}

/// `sparkgate status`'s line, when any body is quarantined.
fn quarantine_line(v: &serde_json::Value) -> String {
    let entries = v["quarantine"].as_array().map(Vec::as_slice).unwrap_or_default();
    if entries.is_empty() {
        return String::new();
    }
    let refused = entries
        .iter()
        .filter(|e| e["quarantines"].as_u64().unwrap_or(0) >= 2)
        .count();
    let bodies = if entries.len() == 1 { "body" } else { "bodies" };
    format!(
        "quarantine {} {bodies} ({refused} refused at arrival) · `sparkgate quarantine` lists them\n",
        entries.len()
    )
}

/// The response store: where, and what the last sweep found.
fn store_line(s: &serde_json::Value) -> String {
    let Some(url) = s["url"].as_str() else {
        return String::new();
    };
    let held = match (s["open"].as_bool(), s["records"].as_u64(), s["bytes"].as_u64()) {
        (Some(false), _, _) => "not opened yet (no request needed it)".to_owned(),
        (_, Some(records), Some(bytes)) => format!("{records} responses · {bytes} bytes"),
        _ => "open · size at the next sweep".to_owned(),
    };
    format!("store      {url} · {held} · {} evicted\n", s["evicted"])
}

/// Rank 0's vLLM and the release whose rules the gateway applies, with the warning when those
/// are not its own.
fn vllm_lines(v: &serde_json::Value) -> String {
    let mut out = match v["version"].as_str() {
        Some(version) => format!("vllm       {version} · rules {}\n", text(&v["rules"])),
        None if v.is_object() => format!("vllm       not reported yet · rules {}\n", text(&v["rules"])),
        None => String::new(),
    };
    if let Some(w) = v["warning"].as_str() {
        out += &format!("warning    {w}\n");
    }
    out
}

/// One group's line when the gateway has several.
fn group_line(g: &serde_json::Value) -> String {
    let state = g["upstream"]["state"].as_str().unwrap_or("?");
    format!(
        "group {:<4} {state} · mode {} · {} in flight of {} · epoch {} · {} routed · {}\n",
        text(&g["name"]),
        text(&g["mode"]),
        g["in_flight"],
        g["capacity"],
        g["supervisor"]["epoch"],
        g["routed"],
        text(&g["upstream_url"])
    )
}

/// The supervised group's lines: phase and restarts, the last restart, the nodes' memory.
fn supervisor_lines(v: &serde_json::Value, s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group      {} · {} runtime · {} restarts",
        super::wait::phase_of(v),
        text(&s["runtime"]),
        s["restarts"]
    );
    if let Some(r) = s.get("last_restart").filter(|r| !r.is_null()) {
        let detected = r["detected_in_s"]
            .as_f64()
            .map(|d| format!(", noticed in {d:.1} s"))
            .unwrap_or_default();
        let _ = writeln!(out, "last       {}{detected}", text(&r["reason"]));
        if let Some(d) = r["diagnostics"].as_str() {
            let _ = writeln!(out, "diagnosed  {d} (sparkgate logs --diagnostics)");
        }
    }
    let memory: Vec<String> = s["memory"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some(format!(
                "{} {:.1} GiB free",
                text(&m["node"]),
                m["mem_available_gib"].as_f64()?
            ))
        })
        .collect();
    if !memory.is_empty() {
        let _ = writeln!(out, "memory     {}", memory.join(" · "));
    }
    out.push_str(&gpu_lines(s));
    out
}

/// Each node's GPUs (utilisation, power) and the newest kernel event, when there are any.
fn gpu_lines(s: &serde_json::Value) -> String {
    let num = |v: &serde_json::Value| v.as_f64().map_or("?".to_owned(), |n| format!("{n:.0}"));
    let gpus: Vec<String> = s["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| {
            n["gpus"].as_array().into_iter().flatten().map(move |g| {
                format!(
                    "{} {}: {} % at {} W",
                    text(&n["node"]),
                    g["index"],
                    num(&g["utilization_pct"]),
                    num(&g["power_w"])
                )
            })
        })
        .collect();
    let mut out = String::new();
    if !gpus.is_empty() {
        out.push_str(&format!("gpus       {}\n", gpus.join(" · ")));
    }
    if let Some(e) = s["kernel_events"].as_array().and_then(|k| k.last()) {
        out.push_str(&format!("kernel     {}: {}\n", text(&e["node"]), text(&e["line"])));
    }
    out
}

/// The ranks' table, by rank.
fn rank_lines(s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut ranks: Vec<&serde_json::Value> = s["ranks"].as_array().into_iter().flatten().collect();
    ranks.sort_by_key(|r| r["rank"].as_u64());
    if !ranks.is_empty() {
        let _ = writeln!(out, "\nrank  node    state    process       uptime       log");
    }
    for r in ranks {
        let process = match (r["pid"].as_u64(), r["container"].as_str()) {
            (Some(pid), _) => format!("pid {pid}"),
            (None, Some(c)) => c.chars().take(12).collect(),
            _ => "—".to_owned(),
        };
        let state = if r["running"] == true { "running" } else { "exited" };
        let _ = writeln!(
            out,
            "{:<5} {:<7} {state:<8} {process:<13} {:<12} {}",
            r["rank"].as_u64().map_or_else(|| "?".to_owned(), |n| n.to_string()),
            text(&r["node"]),
            age(r["uptime_s"].as_f64().unwrap_or(0.0)),
            text(&r["log"])
        );
    }
    out
}

pub(super) fn logs(ep: &Endpoint, which: &[String], tail: usize, follow: bool) -> anyhow::Result<ExitCode> {
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
    let (status, body) = call(ep, "GET", &path, Bytes::new(), true)?;
    if status >= 300 {
        eprintln!("sparkgate: {}", refusal(status, &body));
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_table_lists_ranks_in_order_with_words_not_json() {
        let v = json!({
            "ready": true, "upstream": {"state": "ready"}, "upstream_url": "http://127.0.0.1:18888",
            "profile": "deepseek-v4.1-flash", "model": "DS", "mode": "dspark", "tokens_per_s": 41.5,
            "vllm": {"version": "0.34.0", "rules": "0.34.0", "fit": "known", "warning": null},
            "admission": {"open": true, "capacity": 2, "in_flight": 1, "queued": 0},
            "supervisor": {"state": "ready", "epoch": 3, "mode": "dspark", "runtime": "process", "restarts": 2,
                "last_restart": {"reason": "rank 1 exited (signal 9)", "detected_in_s": 0.01,
                    "diagnostics": "/l/epoch-2/diagnostics"},
                "memory": [{"node": "head", "mem_available_gib": 20.44}],
                "gpus": [{"node": "worker", "gpus": [{"index": 0, "utilization_pct": 99.0, "power_w": 31.4,
                    "power_limit_w": null, "temperature_c": 60.0}]}],
                "kernel_events": [{"node": "worker", "kind": {"xid": {"xid": 13, "fatal": false}},
                    "line": "NVRM: Xid (PCI:0000:01:00): 13, pid=9, Graphics SM Warp Exception", "at_unix": 1}],
                "ranks": [
                    {"rank": 1, "node": "worker", "pid": 11, "running": true, "uptime_s": 65.2, "log": "/l/rank1.log"},
                    {"rank": 0, "node": "head", "pid": 10, "running": true, "uptime_s": 3700.0, "log": "/l/rank0.log"}
                ]}
        });
        let t = status_table(&v);
        assert!(t.contains("gateway    ready · upstream ready · mode dspark"), "{t}");
        assert!(
            t.contains("admission  1 in flight · 0 queued · capacity 2 · open"),
            "{t}"
        );
        assert!(
            t.contains("group      ready: epoch 3, mode dspark · process runtime · 2 restarts"),
            "{t}"
        );
        assert!(
            t.contains("last       rank 1 exited (signal 9), noticed in 0.0 s"),
            "{t}"
        );
        assert!(
            t.contains("diagnosed  /l/epoch-2/diagnostics (sparkgate logs --diagnostics)"),
            "{t}"
        );
        assert!(t.contains("memory     head 20.4 GiB free"), "{t}");
        assert!(t.contains("gpus       worker 0: 99 % at 31 W\n"), "{t}");
        assert!(t.contains("kernel     worker: NVRM: Xid (PCI:0000:01:00): 13"), "{t}");
        assert!(t.contains("throughput 41.5 tokens/s over the last 10 s"), "{t}");
        let rank0 = t.find("\n0     head").expect("rank 0 row");
        let rank1 = t.find("\n1     worker").expect("rank 1 row");
        assert!(rank0 < rank1, "ranks in order:\n{t}");
        assert!(t.contains("1 h 1 min") && t.contains("1 min 5 s"), "{t}");
        assert!(!t.contains('{'), "no raw JSON:\n{t}");
        assert!(
            t.contains("vllm       0.34.0 · rules 0.34.0\n") && !t.contains("warning"),
            "{t}"
        );
    }

    #[test]
    fn a_release_sparkgate_was_not_tested_with_is_named_with_its_warning() {
        let v = json!({"vllm": {"version": "0.36.0", "rules": "0.34.0", "fit": "newer", "warning": "vLLM 0.36.0 is newer"}});
        assert_eq!(
            vllm_lines(&v["vllm"]),
            "vllm       0.36.0 · rules 0.34.0\nwarning    vLLM 0.36.0 is newer\n"
        );
        let v = json!({"vllm": {"version": null, "rules": "0.33.0"}});
        assert_eq!(vllm_lines(&v["vllm"]), "vllm       not reported yet · rules 0.33.0\n");
        assert_eq!(vllm_lines(&json!(null)), "", "an older gateway's status has no vllm");
    }
}

#[cfg(test)]
mod quarantine_line_tests {
    use serde_json::json;

    #[test]
    fn the_status_line_counts_the_bodies_and_the_refused() {
        let two = json!({"quarantine": [{"quarantines": 2}, {"quarantines": 1}]});
        assert_eq!(
            super::quarantine_line(&two),
            "quarantine 2 bodies (1 refused at arrival) · `sparkgate quarantine` lists them\n"
        );
        assert_eq!(super::quarantine_line(&json!({"quarantine": []})), "");
    }
}
