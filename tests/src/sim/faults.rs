//! Fault injection: environment variables read at start, and a control endpoint
//! (`SIM_CONTROL_PORT`) that arms the same faults at run time.
//!
//! | variable | effect |
//! |---|---|
//! | `SIM_FAULT_CRASH_AFTER_REQUESTS=N` | exit abruptly (status 1, an engine that died of its own error) when the N-th request finishes |
//! | `SIM_FAULT_CRASH_AFTER_S=T` | exit abruptly T seconds after start |
//! | `SIM_FAULT_HANG_AFTER_REQUESTS=N` | after N finished requests, stop stepping and stop logging |
//! | `SIM_FAULT_HANG_AFTER_S=T` | the same, T seconds after start |
//! | `SIM_FAULT_HANG_AT_START=1` | print the first load lines, then hang before ready |
//! | `SIM_FAULT_STREAM_ERROR_AFTER_TOKENS=N` | every request fails after N tokens (SSE error event + `[DONE]`, or 500) |
//! | `SIM_FAULT_CRASH_ON=MARKER` | exit abruptly (status 1, an engine that died of its own error) when the engine schedules a request whose prompt contains MARKER (a poison request) |
//! | `SIM_FAULT_REFUSE_CONNECTIONS=1` | never accept HTTP connections (the port is bound but refuses) |
//! | `SIM_LOG_INVALID_UTF8=1` | print a line with bytes that are not UTF-8 early in the start (native libraries do) |
//! | `SIM_SPAWN_HELPER=1` | start a helper process (`sleep`), as vLLM starts its engine and worker processes, and log its pid |

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use tokio::sync::Notify;

use super::log;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn env_secs(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(Duration::from_secs_f64)
}

/// Armed faults, shared by the engine, the HTTP server and the control endpoint.
#[derive(Debug)]
pub(crate) struct Faults {
    hung: AtomicBool,
    /// Wakes whoever parked on a hang when it is cleared.
    unhang: Notify,
    crash_after_requests: AtomicU64,
    hang_after_requests: AtomicU64,
    finished: AtomicU64,
    /// 0 = off; N = fail every request after N tokens.
    stream_error_after_tokens: AtomicU64,
    pub(crate) refuse_connections: AtomicBool,
    pub(crate) hang_at_start: bool,
    /// SIM_FAULT_CRASH_ON: a request whose prompt holds this crashes the engine.
    crash_on: Option<String>,
    pub(crate) crash_after: Option<Duration>,
    pub(crate) hang_after: Option<Duration>,
}

impl Faults {
    pub(crate) fn from_env() -> Self {
        Self {
            hung: AtomicBool::new(false),
            unhang: Notify::new(),
            crash_after_requests: AtomicU64::new(env_u64("SIM_FAULT_CRASH_AFTER_REQUESTS").unwrap_or(0)),
            hang_after_requests: AtomicU64::new(env_u64("SIM_FAULT_HANG_AFTER_REQUESTS").unwrap_or(0)),
            finished: AtomicU64::new(0),
            stream_error_after_tokens: AtomicU64::new(env_u64("SIM_FAULT_STREAM_ERROR_AFTER_TOKENS").unwrap_or(0)),
            refuse_connections: AtomicBool::new(env_u64("SIM_FAULT_REFUSE_CONNECTIONS") == Some(1)),
            hang_at_start: env_u64("SIM_FAULT_HANG_AT_START") == Some(1),
            crash_on: std::env::var("SIM_FAULT_CRASH_ON").ok().filter(|m| !m.is_empty()),
            crash_after: env_secs("SIM_FAULT_CRASH_AFTER_S"),
            hang_after: env_secs("SIM_FAULT_HANG_AFTER_S"),
        }
    }

    /// Exits the process as a rank whose engine died of its own error does: no goodbye,
    /// status 1 (a kill from outside, the OOM killer's or an operator's, is a signal instead —
    /// which the supervisor tells apart, `LossCause`).
    pub(crate) fn crash(&self) -> ! {
        std::process::exit(1)
    }

    /// Whether any of `prompts` holds SIM_FAULT_CRASH_ON's marker.
    pub(crate) fn is_poison(&self, prompts: &[&str]) -> bool {
        self.crash_on
            .as_deref()
            .is_some_and(|m| prompts.iter().any(|p| p.contains(m)))
    }

    pub(crate) fn hang(&self) {
        self.hung.store(true, SeqCst);
        log::set_silent(true);
    }

    pub(crate) fn clear(&self) {
        self.hung.store(false, SeqCst);
        self.stream_error_after_tokens.store(0, SeqCst);
        self.refuse_connections.store(false, SeqCst);
        self.crash_after_requests.store(0, SeqCst);
        self.hang_after_requests.store(0, SeqCst);
        log::set_silent(false);
        self.unhang.notify_waiters();
    }

    pub(crate) fn is_hung(&self) -> bool {
        self.hung.load(SeqCst)
    }

    /// Parks while a hang is armed.
    pub(crate) async fn wait_while_hung(&self) {
        while self.is_hung() {
            let notified = self.unhang.notified();
            if !self.is_hung() {
                break;
            }
            notified.await;
        }
    }

    pub(crate) fn set_stream_error_after(&self, tokens: u64) {
        self.stream_error_after_tokens.store(tokens, SeqCst);
    }

    pub(crate) fn stream_error_after(&self) -> Option<u64> {
        Some(self.stream_error_after_tokens.load(SeqCst)).filter(|n| *n > 0)
    }

    pub(crate) fn arm_crash_after_requests(&self, n: u64) {
        self.crash_after_requests.store(self.finished.load(SeqCst) + n, SeqCst);
    }

    /// Counts a finished request and fires request-count faults.
    pub(crate) fn request_finished(&self) {
        let n = self.finished.fetch_add(1, SeqCst) + 1;
        if self.crash_after_requests.load(SeqCst) == n {
            self.crash();
        }
        if self.hang_after_requests.load(SeqCst) == n {
            self.hang();
        }
    }
}

/// What a real rank does at start that the supervisor must survive: invalid UTF-8 on stdout
/// (`SIM_LOG_INVALID_UTF8=1`) and processes of its own (`SIM_SPAWN_HELPER=1`), which a stop
/// must take down with it.
pub(crate) fn startup_quirks() {
    use std::io::Write as _;
    if env_u64("SIM_LOG_INVALID_UTF8") == Some(1) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"(APIServer) WARNING native: \xff\xfe\xc3 binary noise\n");
        let _ = out.flush();
    }
    if env_u64("SIM_SPAWN_HELPER") == Some(1) {
        match std::process::Command::new("sleep").arg("86400").spawn() {
            Ok(child) => log::info(
                "APIServer",
                "multiproc_executor.py:120",
                &format!("spawned helper pid {}", child.id()),
            ),
            Err(e) => log::info(
                "APIServer",
                "multiproc_executor.py:120",
                &format!("helper not spawned: {e}"),
            ),
        }
    }
}
