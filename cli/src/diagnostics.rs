//! `sparkgate logs --diagnostics [EPOCH]`: the diagnostics bundles unplanned restarts wrote
//! (from `/admin/diagnostics`), one line each, then one bundle's files in full — the newest, or
//! the epoch given.

use std::process::ExitCode;

use bytes::Bytes;

use crate::admin::{call, refusal, Endpoint};

pub(crate) fn run(ep: &Endpoint, epoch: &str) -> anyhow::Result<ExitCode> {
    let (status, body) = call(ep, "GET", "/admin/diagnostics", Bytes::new(), false)?;
    if status >= 300 {
        eprintln!("sparkgate: {}", refusal(status, &body));
        return Ok(ExitCode::FAILURE);
    }
    let list: serde_json::Value = serde_json::from_slice(&body)?;
    let bundles = list["bundles"].as_array().cloned().unwrap_or_default();
    if bundles.is_empty() {
        crate::emit("no diagnostics bundles: no unplanned restart wrote one\n")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = String::new();
    // The reason's first words: its whole text (with the ranks' last lines) is in the bundle.
    let short = |r: &str| match r.char_indices().nth(100) {
        Some((at, _)) => format!("{}…", &r[..at]),
        None => r.to_owned(),
    };
    for b in &bundles {
        out.push_str(&format!(
            "epoch {:<5} group {:<10} {}\n            {}\n",
            b["epoch"],
            b["group"].as_str().unwrap_or("-"),
            short(b["reason"].as_str().unwrap_or("")),
            b["path"].as_str().unwrap_or("")
        ));
    }
    let chosen = match epoch {
        "newest" => bundles.last().and_then(|b| b["epoch"].as_u64()).unwrap_or(0),
        n => n
            .parse()
            .map_err(|_| anyhow::anyhow!("--diagnostics takes an epoch number, got {n}"))?,
    };
    out.push('\n');
    let (status, body) = call(
        ep,
        "GET",
        &format!("/admin/diagnostics?epoch={chosen}"),
        Bytes::new(),
        false,
    )?;
    if status >= 300 {
        eprintln!("sparkgate: {}", refusal(status, &body));
        return Ok(ExitCode::FAILURE);
    }
    out.push_str(&String::from_utf8_lossy(&body));
    crate::emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
