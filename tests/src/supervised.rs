//! What the supervisor's tests ask of a gateway that supervises its own ranks (started by
//! `test_gateway::TestGateway`): its status, polled until a condition holds, and its upstream.

use std::time::{Duration, Instant};

use crate::harness::{Gateway, STARTUP};
use crate::http::{request, HttpResponse};

impl Gateway {
    /// `GET /admin/status` (loopback, no token) as JSON.
    pub fn status(&self) -> serde_json::Value {
        request(self.addr, "GET", "/admin/status", &[], b"").json()
    }

    /// Rank `rank`'s pid, from `/admin/status` (a process runtime's).
    pub fn rank_pid(&self, rank: u64) -> u32 {
        let status = self.status();
        status["supervisor"]["ranks"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["rank"] == rank))
            .and_then(|r| r["pid"].as_u64())
            .unwrap_or_else(|| panic!("no rank {rank} pid in /admin/status: {status}")) as u32
    }

    pub fn rank0_pid(&self) -> u32 {
        self.rank_pid(0)
    }

    /// Sends `signal` (`-KILL`, `-STOP`) to rank `rank`; returns its pid. The signal must land.
    pub fn signal_rank(&self, rank: u64, signal: &str) -> u32 {
        let pid = self.rank_pid(rank);
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "kill {signal} {pid} (rank {rank})");
        pid
    }

    /// `method path` without a body, with `Authorization: Bearer token`.
    pub fn with_token(&self, method: &str, path: &str, token: &str) -> HttpResponse {
        request(
            self.addr,
            method,
            path,
            &[("Authorization", &format!("Bearer {token}"))],
            b"",
        )
    }

    /// Polls `/admin/status` until `pred` holds.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + STARTUP;
        loop {
            let s = self.status();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "status never reached {what}: {s}\nlog:\n{}",
                self.proc.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The port of the vLLM this gateway fronts (rank 0's), from its start-up log line.
    pub fn upstream_port(&self) -> u16 {
        self.proc
            .log()
            .iter()
            .find_map(|l| {
                l.split("upstream=http://127.0.0.1:")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .expect("the upstream port in the gateway's log")
    }
}
