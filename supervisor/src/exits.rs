//! A rank's exit as the actor hears it, and the watcher every runtime uses to report it (a leaf:
//! the runtimes and the actor both import this, not each other).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::status::LossCause;

/// A rank of `epoch` exited with `status` (as the runtime describes it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RankExit {
    pub(crate) epoch: u64,
    pub(crate) rank: u32,
    pub(crate) status: String,
    pub(crate) kind: ExitKind,
}

/// How a rank ended, as far as its runtime can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitKind {
    /// It exited with this code (Docker and shells report a signal death as 128 + n).
    Code(i64),
    /// A signal ended it.
    Signal,
    /// The runtime lost sight of it.
    Unknown,
}

impl ExitKind {
    /// What the exit says about the group's loss.
    pub(crate) fn cause(self) -> LossCause {
        match self {
            ExitKind::Code(c) if (0..128).contains(&c) => LossCause::Crashed,
            ExitKind::Code(_) | ExitKind::Signal => LossCause::Killed,
            ExitKind::Unknown => LossCause::Unreachable,
        }
    }

    /// A local process's exit status.
    pub(crate) fn of_status(status: &std::process::ExitStatus) -> ExitKind {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(c), _) => ExitKind::Code(i64::from(c)),
            (None, Some(_)) => ExitKind::Signal,
            (None, None) => ExitKind::Unknown,
        }
    }
}

/// Whether a rank has exited, shared between its watcher and its handle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Exited(Arc<AtomicBool>);

impl Exited {
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Watches a rank's exit, whatever runs it: when `status` (its words and kind) resolves, the
/// flag turns true and the exit is reported.
pub(crate) fn watch_exit(
    epoch: u64,
    rank: u32,
    exits: mpsc::UnboundedSender<RankExit>,
    status: impl Future<Output = (String, ExitKind)> + Send + 'static,
) -> Exited {
    let exited = Exited::default();
    let flag = exited.clone();
    sparkgate_task::spawn("exit-watch", async move {
        let (status, kind) = status.await;
        flag.0.store(true, Ordering::SeqCst);
        let _ = exits.send(RankExit {
            epoch,
            rank,
            status,
            kind,
        });
    });
    exited
}

/// How long a rank's exit that looks like a crash waits for its group's other exits before the
/// loss is judged: a rank killed from outside takes its peers down with it (they exit by
/// themselves, with code 1 — a crash to look at), and the first exit reported may be a peer's.
pub(crate) const DECIDING: std::time::Duration = std::time::Duration::from_secs(1);

/// Which of one epoch's exits (in the order they were reported) tells the loss's cause: the
/// first one that is not a crash (a kill or a lost rank explains the crashes beside it), else
/// the first.
pub(crate) fn telling(exits: &[RankExit]) -> usize {
    exits
        .iter()
        .position(|e| e.kind.cause() != LossCause::Crashed)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(rank: u32, kind: ExitKind) -> RankExit {
        RankExit {
            epoch: 1,
            rank,
            status: String::new(),
            kind,
        }
    }

    #[test]
    fn a_peers_crash_reported_before_a_kill_is_explained_by_the_kill() {
        let crash = exit(1, ExitKind::Code(1));
        assert_eq!(telling(std::slice::from_ref(&crash)), 0);
        assert_eq!(telling(&[crash.clone(), exit(0, ExitKind::Signal)]), 1);
        assert_eq!(telling(&[crash.clone(), exit(0, ExitKind::Code(2))]), 0, "two crashes");
        assert_eq!(telling(&[exit(0, ExitKind::Code(137)), crash]), 0);
    }

    #[test]
    fn an_exit_code_below_128_is_a_crash_and_a_signal_or_128_plus_n_a_kill() {
        assert_eq!(ExitKind::Code(1).cause(), LossCause::Crashed);
        assert_eq!(ExitKind::Code(0).cause(), LossCause::Crashed);
        assert_eq!(ExitKind::Code(137).cause(), LossCause::Killed);
        assert_eq!(ExitKind::Signal.cause(), LossCause::Killed);
        assert_eq!(ExitKind::Unknown.cause(), LossCause::Unreachable);
        use std::os::unix::process::ExitStatusExt as _;
        let killed = std::process::ExitStatus::from_raw(9);
        assert_eq!(ExitKind::of_status(&killed), ExitKind::Signal);
        let exited = std::process::ExitStatus::from_raw(3 << 8);
        assert_eq!(ExitKind::of_status(&exited), ExitKind::Code(3));
    }
}
