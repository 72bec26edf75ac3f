//! What a start needs from the nodes besides the ranks: node preparation before the first
//! start (with its progress in the published status) and, after a load, dropping the page
//! cache the weights filled (RUNTIME=docker).

use std::path::Path;

use sparkgate_config::RankPlan;

/// DSV41_DROP_PAGE_CACHE: after a load, the page cache the weights filled is dropped on each
/// node, so the GPU driver sees the memory as free (unified memory counts page cache as used).
/// Needs root on the node; otherwise it is skipped with a note.
pub(crate) async fn drop_page_cache(backend: &crate::rank::Backend) {
    let crate::rank::Backend::Docker { head, workers } = backend else {
        return;
    };
    let mut nodes = vec![head.clone()];
    for w in workers {
        nodes.extend(w.node().await.ok());
    }
    const SCRIPT: &str = "if [ \"$(id -u)\" != 0 ]; then echo 'skipped: not root'; \
        elif [ ! -w /proc/sys/vm/drop_caches ]; then echo 'skipped: /proc/sys/vm/drop_caches is read-only here'; \
        else sync && echo 1 > /proc/sys/vm/drop_caches && echo dropped; fi";
    for node in &nodes {
        match node.shell(SCRIPT).await {
            Ok(out) if out.trim() == "dropped" => tracing::info!(node = node.name(), "page cache dropped"),
            Ok(out) => tracing::info!(node = node.name(), note = out.trim(), "page cache not dropped"),
            Err(e) => tracing::warn!(node = node.name(), error = %e, "page cache not dropped"),
        }
    }
}

/// RUNTIME=docker, before the first start: node preparation ([`sparkgate_prepare::for_start`],
/// progress into the log), then the image's self-check on the head when SELF_CHECK_CMD is set.
pub(crate) async fn prepare_nodes(
    config: &sparkgate_config::Config,
    backend: &crate::rank::Backend,
    self_check_cmd: &[String],
    rank0: Option<&RankPlan>,
    log_dir: &Path,
    report: &dyn sparkgate_prepare::progress::Report,
) -> Result<(), String> {
    let crate::rank::Backend::Docker { head, workers } = backend else {
        return Ok(());
    };
    let mut remotes = Vec::new();
    for link in workers {
        let worker = config
            .nodes
            .worker(link.rank)
            .expect("a link per configured worker")
            .clone();
        let node = link.node().await.map_err(|e| e.to_string())?;
        remotes.push(sparkgate_prepare::verify::Remote { worker, node });
    }
    sparkgate_prepare::for_start(config, head, &remotes, report)
        .await
        .map_err(|e| format!("node preparation: {e}"))?;
    if let (false, Some(rank0)) = (self_check_cmd.is_empty(), rank0) {
        let log = log_dir.join("overlay-verify.log");
        sparkgate_prepare::verify::self_check(head, rank0, self_check_cmd, &log)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(log = %log.display(), "self-check passed");
    }
    Ok(())
}

/// Preparation's progress into the log and into the published status (`preparing`), so
/// `sparkgate status` shows a long download or ship while the group is starting. Byte progress
/// updates the status at most once a second: the gateway mirrors every status change.
pub(crate) struct StatusReport<'a> {
    status: &'a tokio::sync::watch::Sender<crate::Status>,
    log: sparkgate_prepare::progress::Log,
    last_bytes: std::sync::Mutex<Option<std::time::Instant>>,
}

impl<'a> StatusReport<'a> {
    pub(crate) fn new(status: &'a tokio::sync::watch::Sender<crate::Status>) -> Self {
        StatusReport {
            status,
            log: sparkgate_prepare::progress::Log::new(),
            last_bytes: std::sync::Mutex::new(None),
        }
    }

    fn show(&self, text: String) {
        self.status.send_modify(|s| s.preparing = Some(text));
    }
}

impl std::fmt::Debug for StatusReport<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusReport").finish_non_exhaustive()
    }
}

impl sparkgate_prepare::progress::Report for StatusReport<'_> {
    fn line(&self, text: &str) {
        self.log.line(text);
        self.show(text.to_owned());
    }

    fn bytes(&self, label: &str, done: u64, total: Option<u64>) {
        use sparkgate_prepare::progress::human_bytes;
        self.log.bytes(label, done, total);
        let mut last = self.last_bytes.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return;
        }
        *last = Some(std::time::Instant::now());
        self.show(match total.filter(|t| *t > 0) {
            Some(t) => format!(
                "{label}: {} of {} ({:.0}%)",
                human_bytes(done),
                human_bytes(t),
                (done as f64 / t as f64 * 100.0).min(100.0)
            ),
            None => format!("{label}: {}", human_bytes(done)),
        });
    }
}

#[cfg(test)]
mod tests {
    use sparkgate_prepare::progress::Report;

    use super::*;
    use crate::{GroupState, Status};

    #[test]
    fn preparation_progress_is_published_in_the_status() {
        let (tx, rx) = tokio::sync::watch::channel(Status::fresh(
            GroupState::Starting { epoch: 1 },
            1,
            sparkgate_config::SpecMethod::None,
            4,
            sparkgate_config::Runtime::Docker,
        ));
        let report = StatusReport::new(&tx);
        report.line("image x: streaming head → worker");
        assert_eq!(
            rx.borrow().preparing.as_deref(),
            Some("image x: streaming head → worker")
        );
        report.bytes("stream", 512 << 20, Some(1 << 30));
        assert_eq!(
            rx.borrow().preparing.as_deref(),
            Some("stream: 512.0 MiB of 1.0 GiB (50%)")
        );
        report.bytes("stream", 768 << 20, Some(1 << 30));
        assert!(
            rx.borrow().preparing.as_deref().unwrap().contains("512.0 MiB"),
            "byte progress is published at most once a second"
        );
        let json = serde_json::to_value(&*rx.borrow()).unwrap();
        assert_eq!(json["preparing"], "stream: 512.0 MiB of 1.0 GiB (50%)");
    }
}
