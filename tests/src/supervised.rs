//! `sparkgate serve` supervising its own ranks (RUNTIME=process, VLLM_BIN=vllm-sim) for the
//! supervisor's tests: fresh loopback ports, fast simulated loads, status polling.

use std::time::{Duration, Instant};

use crate::harness::{addr_in, free_port, request, Gateway, Proc, STARTUP};

impl Gateway {
    /// `sparkgate serve` supervising its own ranks (RUNTIME=process, VLLM_BIN=vllm-sim), on
    /// loopback with fresh ports; waits until `/ready` answers 200.
    pub fn supervise(
        sparkgate: &str,
        sim: &str,
        profile: &str,
        log_dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Gateway {
        let gw = Self::supervise_unready(sparkgate, sim, profile, log_dir, env);
        gw.wait_ready();
        gw
    }

    pub fn supervise_unready(
        sparkgate: &str,
        sim: &str,
        profile: &str,
        log_dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Gateway {
        let proc = Self::supervise_process(sparkgate, sim, profile, log_dir, env);
        let addr = addr_in(&proc.wait_for("sparkgate listening on http://"));
        Gateway { proc, addr }
    }

    /// The `sparkgate serve` process of `supervise`, without waiting for anything.
    pub fn supervise_process(
        sparkgate: &str,
        sim: &str,
        profile: &str,
        log_dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Proc {
        Self::supervise_process_as(sparkgate, sim, profile, log_dir, env, false)
    }

    /// `supervise_process`, the gateway leading its own process group when `own_group`.
    pub fn supervise_process_as(
        sparkgate: &str,
        sim: &str,
        profile: &str,
        log_dir: &std::path::Path,
        env: &[(&str, &str)],
        own_group: bool,
    ) -> Proc {
        let (vllm_port, master_port) = (free_port().to_string(), free_port().to_string());
        let log = log_dir.display().to_string();
        let mut full: Vec<(&str, &str)> = vec![
            ("RUNTIME", "process"),
            ("VLLM_BIN", sim),
            ("PORT", "0"),
            ("BIND_ADDR", "127.0.0.1"),
            ("HEAD_IP", "127.0.0.1"),
            ("WORKER_IP", "127.0.0.1"),
            ("VLLM_PORT", &vllm_port),
            ("MASTER_PORT", &master_port),
            ("LOG_DIR", &log),
            ("SIM_LOAD_SECONDS", "0"),
            ("SIM_SPEED", "instant"),
            ("RESTART_BACKOFF_INITIAL", "0.2"),
            ("READY_TIMEOUT", "60"),
            ("WEIGHTS_GIB_PER_RANK", ""),
            ("SPARKGATE_LOG", "info"),
        ];
        // WORKERS lists the workers itself: the one-worker form may not be set beside it.
        if env.iter().any(|(k, _)| *k == "WORKERS") {
            full.retain(|(k, _)| *k != "WORKER_IP");
        }
        full.extend_from_slice(env);
        // The ranks get only the plan's environment: the simulator's settings go by RANK_ENV.
        let mut sim: Vec<(&str, &str)> = Vec::new();
        for (k, v) in full.iter().filter(|(k, _)| k.starts_with("SIM_")) {
            sim.retain(|(seen, _)| seen != k);
            sim.push((k, v));
        }
        let given = full
            .iter()
            .filter(|(k, v)| *k == "RANK_ENV" && !v.is_empty())
            .map(|(_, v)| v.to_string());
        let rank_env: Vec<String> = sim.iter().map(|(k, v)| format!("{k}={v}")).chain(given).collect();
        let rank_env = rank_env.join(",");
        full.retain(|(k, _)| *k != "RANK_ENV");
        full.push(("RANK_ENV", &rank_env));
        let args: Vec<String> = ["--profile", profile, "serve"].map(String::from).to_vec();
        Proc::spawn_as(sparkgate, &args, &full, own_group)
    }

    /// `GET /admin/status` (loopback, no token) as JSON.
    pub fn status(&self) -> serde_json::Value {
        request(self.addr, "GET", "/admin/status", &[], b"").json()
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
