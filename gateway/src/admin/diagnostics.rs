//! `GET /admin/diagnostics` (docs/operations.md, "Diagnostics"): the diagnostics bundles every
//! unplanned restart wrote under LOG_DIR, of each group (`?group=NAME`: one) — as JSON, or with
//! `?epoch=N` that bundle's files as text, each under a `==> name <==` header (`sparkgate logs
//! --diagnostics`).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::error::GatewayError;
use crate::app::Shared;

pub(crate) async fn diagnostics(
    State(app): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, GatewayError> {
    let groups: Vec<_> = match q.get("group") {
        Some(name) => vec![app
            .groups
            .named(name)
            .ok_or_else(|| GatewayError::bad_request(format!("no group named {name}"), "group"))?
            .clone()],
        None => app.groups.all().to_vec(),
    };
    let mut bundles = Vec::new();
    for g in &groups {
        let Some(sup) = &g.supervisor else { continue };
        bundles.extend(sup.diagnostics().into_iter().map(|b| (g.name.clone(), b)));
    }
    let Some(epoch) = q.get("epoch") else {
        let list: Vec<_> = bundles
            .iter()
            .map(|(group, b)| json!({"group": group, "epoch": b.epoch, "path": b.path, "reason": b.reason, "files": b.files}))
            .collect();
        let body = json!({ "bundles": list });
        return Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response());
    };
    let epoch: u64 = epoch
        .parse()
        .map_err(|_| GatewayError::bad_request("epoch must be a number", "epoch"))?;
    let Some((_, bundle)) = bundles.iter().find(|(_, b)| b.epoch == epoch) else {
        return Err(GatewayError::bad_request(
            format!("no diagnostics bundle for epoch {epoch}"),
            "epoch",
        ));
    };
    let mut text = String::new();
    for file in &bundle.files {
        let raw = tokio::fs::read(std::path::Path::new(&bundle.path).join(file))
            .await
            .unwrap_or_default();
        text.push_str(&format!(
            "==> {file} <==\n{}\n",
            String::from_utf8_lossy(&raw).trim_end()
        ));
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}
