//! The one way sparkgate starts a background task (`clippy.toml` disallows a bare
//! `tokio::spawn`): every task has a name, the live ones are counted by name (`live`), and a
//! task that panics is logged with its name instead of vanishing into the runtime's stderr.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use tokio::task::JoinHandle;

/// Live tasks by name. A `BTreeMap` keeps `live()` in name order; spawning is rare (per
/// connection at most), so one lock is cheaper than anything cleverer.
static LIVE: Mutex<BTreeMap<&'static str, usize>> = Mutex::new(BTreeMap::new());

/// Starts `fut` on the current runtime as the task `name`.
pub fn spawn<F>(name: &'static str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let entry = Entry::enter(name);
    #[allow(clippy::disallowed_methods)] // the one place a task is started
    tokio::spawn(async move {
        let _entry = entry;
        fut.await
    })
}

/// The tasks alive now, by name, with how many of each.
pub fn live() -> Vec<(&'static str, usize)> {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter().map(|(n, c)| (*n, *c)).collect()
}

/// One live task's count, given back when the task ends — returned, cancelled or panicked.
#[derive(Debug)]
struct Entry(&'static str);

impl Entry {
    fn enter(name: &'static str) -> Entry {
        *LIVE.lock().unwrap_or_else(|e| e.into_inner()).entry(name).or_default() += 1;
        Entry(name)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(task = self.0, "background task panicked");
        }
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = live.get_mut(self.0) {
            *n -= 1;
            if *n == 0 {
                live.remove(self.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(name: &str) -> usize {
        live().into_iter().find(|(n, _)| *n == name).map_or(0, |(_, c)| c)
    }

    #[tokio::test]
    async fn a_task_is_counted_while_it_lives_and_not_after() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = spawn("test-waiting", async move { rx.await.is_ok() });
        assert_eq!(count("test-waiting"), 1);
        tx.send(()).unwrap();
        assert!(task.await.unwrap());
        assert_eq!(count("test-waiting"), 0);
    }

    #[tokio::test]
    async fn a_panicking_or_aborted_task_gives_its_count_back() {
        let panicked = spawn("test-panics", async { panic!("on purpose") });
        assert!(panicked.await.unwrap_err().is_panic());
        let forever = spawn("test-aborted", std::future::pending::<()>());
        assert_eq!(count("test-aborted"), 1);
        forever.abort();
        assert!(forever.await.unwrap_err().is_cancelled());
        assert_eq!((count("test-panics"), count("test-aborted")), (0, 0));
    }
}
