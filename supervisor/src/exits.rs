//! A rank's exit as the actor hears it, and the watcher every runtime uses to report it (a leaf:
//! the runtimes and the actor both import this, not each other).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// A rank of `epoch` exited with `status` (as the runtime describes it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RankExit {
    pub(crate) epoch: u64,
    pub(crate) rank: u32,
    pub(crate) status: String,
}

/// Whether a rank has exited, shared between its watcher and its handle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Exited(Arc<AtomicBool>);

impl Exited {
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Watches a rank's exit, whatever runs it: when `status` resolves, the flag turns true and the
/// exit is reported.
pub(crate) fn watch_exit(
    epoch: u64,
    rank: u32,
    exits: mpsc::UnboundedSender<RankExit>,
    status: impl Future<Output = String> + Send + 'static,
) -> Exited {
    let exited = Exited::default();
    let flag = exited.clone();
    sparkgate_task::spawn("exit-watch", async move {
        let status = status.await;
        flag.0.store(true, Ordering::SeqCst);
        let _ = exits.send(RankExit { epoch, rank, status });
    });
    exited
}
