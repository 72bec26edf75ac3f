//! `GET /metrics`: the gateway's own `sparkgate_` families and rank 0's `vllm:` families in one
//! exposition, so dashboards and alerts built for vLLM on :8888 keep working behind the gateway.
//! Rank 0's text is fetched with a short timeout and kept for at most a second (a scrape storm
//! costs vLLM one request a second); with rank 0 down the answer is the gateway's families and
//! `sparkgate_upstream_up 0`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;

use crate::upstream::Upstream;

/// How long a fetched upstream exposition is reused.
const FRESH: Duration = Duration::from_secs(1);
/// How long the gateway waits for rank 0's `/metrics`.
const TIMEOUT: Duration = Duration::from_millis(800);

/// Rank 0's last exposition (or its absence) and when it was fetched.
#[derive(Debug, Default)]
pub(crate) struct UpstreamMetrics {
    cached: Mutex<Option<(Instant, Option<Bytes>)>>,
}

impl UpstreamMetrics {
    /// Rank 0's exposition, at most a second old; `None` when it does not answer 200 in time.
    pub(crate) async fn get(&self, upstream: &Upstream) -> Option<Bytes> {
        if let Some((at, text)) = self.cached.lock().expect("metrics cache").as_ref() {
            if at.elapsed() < FRESH {
                return text.clone();
            }
        }
        let text = fetch(upstream).await;
        *self.cached.lock().expect("metrics cache") = Some((Instant::now(), text.clone()));
        text
    }
}

/// Rank 0's requests and engine steps now, read fresh (not from the cache).
pub(crate) async fn engine_progress(upstream: &Upstream) -> Option<sparkgate_supervisor::Progress> {
    let text = fetch(upstream).await?;
    Some(sparkgate_supervisor::Progress::of_exposition(&String::from_utf8_lossy(
        &text,
    )))
}

async fn fetch(upstream: &Upstream) -> Option<Bytes> {
    let headers = HeaderMap::new();
    let send = upstream.send(Method::GET, "/metrics", &headers, "metrics", Bytes::new());
    let resp = tokio::time::timeout(TIMEOUT, send).await.ok()?.ok()?;
    if resp.status() != StatusCode::OK {
        return None;
    }
    let body = tokio::time::timeout(TIMEOUT, resp.into_body().collect())
        .await
        .ok()?
        .ok()?;
    Some(body.to_bytes())
}

/// One exposition: the gateway's families, `sparkgate_upstream_up`, then rank 0's families
/// unchanged (their names never collide: `sparkgate_` against `vllm:`, `http_`, `process_`,
/// `python_`).
pub(crate) fn merge(own: &str, upstream: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(own.len() + upstream.map_or(0, <[u8]>::len) + 160);
    out.extend_from_slice(own.as_bytes());
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    let up = u8::from(upstream.is_some());
    out.extend_from_slice(
        format!(
            "# HELP sparkgate_upstream_up Whether rank 0 answered its /metrics for this scrape.\n\
             # TYPE sparkgate_upstream_up gauge\nsparkgate_upstream_up {up}\n"
        )
        .as_bytes(),
    );
    if let Some(text) = upstream {
        out.extend_from_slice(text);
        if !text.ends_with(b"\n") {
            out.push(b'\n');
        }
    }
    out
}

/// The gateway's families and every group's rank 0 in one exposition: each rank sample gets a
/// `group` label, and each family's HELP and TYPE lines come once, before all groups' samples
/// (an exposition may not repeat a family).
pub(crate) fn merge_groups(own: &str, groups: &[(&str, Option<Bytes>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(own.len() + 4096);
    out.extend_from_slice(own.as_bytes());
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(
        b"# HELP sparkgate_upstream_up Whether rank 0 answered its /metrics for this scrape.\n# TYPE sparkgate_upstream_up gauge\n",
    );
    for (name, text) in groups {
        let up = u8::from(text.is_some());
        out.extend_from_slice(format!("sparkgate_upstream_up{{group=\"{name}\"}} {up}\n").as_bytes());
    }
    // Family name → (its HELP/TYPE lines, every group's samples), in first-seen order.
    let mut families: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for (name, text) in groups {
        let Some(text) = text else { continue };
        let mut current = String::new();
        for line in String::from_utf8_lossy(text).lines() {
            if let Some(rest) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
                current = rest.split_whitespace().next().unwrap_or_default().to_owned();
                let family = family_entry(&mut families, &current);
                if !family.1.iter().any(|l| l == line) {
                    family.1.push(line.to_owned());
                }
            } else if !line.is_empty() && !line.starts_with('#') {
                let labelled = with_group(line, name);
                family_entry(&mut families, &current).2.push(labelled);
            }
        }
    }
    for (_, head, samples) in families {
        for l in head.iter().chain(&samples) {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
    }
    out
}

fn family_entry<'a>(
    families: &'a mut Vec<(String, Vec<String>, Vec<String>)>,
    name: &str,
) -> &'a mut (String, Vec<String>, Vec<String>) {
    match families.iter().position(|(n, _, _)| n == name) {
        Some(i) => &mut families[i],
        None => {
            families.push((name.to_owned(), Vec::new(), Vec::new()));
            families.last_mut().expect("just pushed")
        }
    }
}

/// `name{a="b"} v` → `name{group="g",a="b"} v`; `name v` → `name{group="g"} v`.
fn with_group(sample: &str, group: &str) -> String {
    let cut = sample.find(['{', ' ']).unwrap_or(sample.len());
    let (name, rest) = sample.split_at(cut);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{group=\"{group}\"{labels}"),
        Some(labels) => format!("{name}{{group=\"{group}\",{labels}"),
        None => format!("{name}{{group=\"{group}\"}}{rest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_share_each_family_once_and_label_every_sample() {
        let a = Bytes::from_static(
            b"# HELP vllm:running Running.\n# TYPE vllm:running gauge\nvllm:running{model_name=\"M\"} 1.0\n",
        );
        let b = Bytes::from_static(b"# HELP vllm:running Running.\n# TYPE vllm:running gauge\nvllm:running{model_name=\"M\"} 2.0\n# TYPE x counter\nx 3\n");
        let text = String::from_utf8(merge_groups("own 1", &[("a", Some(a)), ("b", Some(b)), ("c", None)])).unwrap();
        assert_eq!(text.matches("# TYPE vllm:running gauge").count(), 1, "{text}");
        assert!(
            text.contains(
                "vllm:running{group=\"a\",model_name=\"M\"} 1.0\nvllm:running{group=\"b\",model_name=\"M\"} 2.0\n"
            ),
            "{text}"
        );
        assert!(text.contains("x{group=\"b\"} 3\n"), "{text}");
        assert!(text.contains("sparkgate_upstream_up{group=\"c\"} 0\n"), "{text}");
    }

    #[test]
    fn both_sides_and_the_up_gauge_in_one_exposition() {
        let own = "# TYPE sparkgate_requests_total counter\nsparkgate_requests_total 3";
        let rank = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0";
        let text = String::from_utf8(merge(own, Some(rank))).unwrap();
        assert!(text.contains("sparkgate_requests_total 3\n# HELP sparkgate_upstream_up"));
        assert!(text.contains("sparkgate_upstream_up 1\n# TYPE vllm:num_requests_running gauge"));
        assert!(text.ends_with("vllm:num_requests_running 1.0\n"));
        let down = String::from_utf8(merge(own, None)).unwrap();
        assert!(down.ends_with("sparkgate_upstream_up 0\n") && !down.contains("vllm:"));
    }
}
