//! The abort fence: a generation cut before vLLM's answer ended (a stream whose client left or
//! that the gateway ended, a request given up on while it waited) keeps its slots until vLLM has
//! let go of the request, judged from rank 0's own counts (`let_go`), so the queued request the
//! release admits never makes one more than MAX_NUM_SEQS inside vLLM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sparkgate_supervisor::Progress;

use super::group::{Fenced, Group, Lease};

impl Lease {
    /// Keeps this lease, and `with` (the request's admission permit), until vLLM has let go of
    /// the cut request: rank 0's own running + waiting count no more than the
    /// group's other leases, the group closed, or [`FENCE_MAX`] passed. vLLM aborts a request
    /// when it notices its connection closed, a moment after the gateway closed it; a queued
    /// request sent in that moment would make one more than MAX_NUM_SEQS inside vLLM.
    pub(crate) fn release_after_abort<T: Send + 'static>(self, with: T) {
        let group = self.group.clone();
        let now = Instant::now();
        let fenced = Fenced {
            seqs: self.seqs,
            since: now,
            until: now + FENCE_MAX,
            _held: Box::new((self, with)),
        };
        // Outside a runtime (the process is ending) there is nobody to wait for: released now.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut fence = group.fence.lock().expect("fence");
        fence.push(fenced);
        if fence.len() == 1 {
            let _enter = runtime.enter();
            sparkgate_task::spawn("abort-fence", watch_fence(group.clone()));
        }
    }
}

/// How long a cut generation's slots wait for vLLM to let go of it at most.
const FENCE_MAX: Duration = Duration::from_secs(2);
/// An engine with no step for this long has no request running (its counts are stale).
const FENCE_IDLE: Duration = Duration::from_millis(250);
/// How often rank 0's load is read while slots are fenced.
const FENCE_POLL: Duration = Duration::from_millis(20);

/// Whether vLLM has let go of the fenced requests: rank 0's running + waiting count no more
/// than the group's other leases; or its engine has made no step for [`FENCE_IDLE`] while it
/// counts more — an idle engine publishes no new counts, so the last ones (taken before the
/// aborts) stay, while a fenced request still running would step.
fn let_go(now: &Progress, others: u32, still_for: Duration) -> bool {
    now.running + now.waiting <= f64::from(others) || still_for >= FENCE_IDLE
}

/// Releases a group's fenced slots as vLLM lets go of their requests; ends when none is left.
async fn watch_fence(group: Arc<Group>) {
    // The engine's step count and since when it has not moved.
    let mut still: Option<(f64, Instant)> = None;
    loop {
        tokio::time::sleep(FENCE_POLL).await;
        let progress = crate::upstream::exposition::engine_progress(&group.upstream).await;
        let now = Instant::now();
        if let Some(p) = &progress {
            if still.is_none_or(|(steps, _)| steps != p.steps) {
                still = Some((p.steps, now));
            }
        }
        let still_for = still.map_or(Duration::ZERO, |(_, since)| now.duration_since(since));
        let released: Vec<Fenced> = {
            let mut fence = group.fence.lock().expect("fence");
            let fenced: u32 = fence.iter().map(|f| f.seqs).sum();
            let others = group.in_use().saturating_sub(fenced);
            let let_go = progress.as_ref().is_some_and(|p| let_go(p, others, still_for)) || !group.open();
            let (out, kept): (Vec<Fenced>, Vec<Fenced>) = std::mem::take(&mut *fence)
                .into_iter()
                .partition(|f| let_go || f.until <= now);
            *fence = kept;
            let outcome = if let_go { "released" } else { "timed_out" };
            for f in &out {
                let held = now.duration_since(f.since).as_secs_f64();
                metrics::histogram!(crate::observe::ABORT_FENCE_SECONDS, "outcome" => outcome).record(held);
            }
            if fence.is_empty() {
                drop(fence);
                drop(out);
                return;
            }
            out
        };
        drop(released);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_slots_are_let_go_when_vllm_counts_no_more_than_the_others_or_stops_stepping() {
        let p = |running: f64, waiting: f64| Progress {
            running,
            waiting,
            generated: 0.0,
            steps: 7.0,
        };
        let moving = Duration::from_millis(20);
        assert!(!let_go(&p(2.0, 0.0), 1, moving), "vLLM still holds the cut request");
        assert!(!let_go(&p(1.0, 1.0), 1, moving), "waiting counts too");
        assert!(let_go(&p(1.0, 0.0), 1, moving), "only the other lease is left");
        assert!(let_go(&p(0.0, 0.0), 0, moving));
        assert!(
            let_go(&p(2.0, 0.0), 0, FENCE_IDLE),
            "an engine that stopped stepping holds nothing: its counts are stale"
        );
    }
}
