//! The fronts of the overhead benchmark — none (vllm-sim direct), sparkgate, nginx, SGLang's
//! gateway (SMG) and the LiteLLM proxy, and sparkgate and nginx serving HTTPS (`*-tls`, with a
//! certificate of the harness's own CA, `tls`) — started in front of one vllm-sim, each configured so
//! that its admission limit does not cap the load, and the CPU and memory of a front's process
//! tree read from /proc. A second sparkgate binary (`baseline`, e.g. an earlier commit's build)
//! can run beside the current one, so "no worse than before" is a same-run ratio.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::free_port;

pub mod load;
pub mod ratios;
pub mod ready;
pub mod tls;

/// Which front a measurement goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontKind {
    Direct,
    Sparkgate,
    /// Another sparkgate binary (`--baseline PATH`), configured exactly as `Sparkgate`.
    Baseline,
    Nginx,
    Smg,
    Litellm,
    /// sparkgate with TLS_CERT (HTTPS, HTTP/1.1 by ALPN for this client).
    SparkgateTls,
    /// nginx with `listen … ssl`, configured as `Nginx` otherwise.
    NginxTls,
}

impl FrontKind {
    /// The fronts `--fronts` may name: the default ones, `baseline` and the TLS pair.
    pub const NAMED: [FrontKind; 8] = [
        FrontKind::Direct,
        FrontKind::Sparkgate,
        FrontKind::Baseline,
        FrontKind::Nginx,
        FrontKind::Smg,
        FrontKind::Litellm,
        FrontKind::SparkgateTls,
        FrontKind::NginxTls,
    ];

    /// The fronts run by default (`Baseline` only when a baseline binary is given).
    pub const ALL: [FrontKind; 5] = [
        FrontKind::Direct,
        FrontKind::Sparkgate,
        FrontKind::Nginx,
        FrontKind::Smg,
        FrontKind::Litellm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FrontKind::Direct => "direct",
            FrontKind::Sparkgate => "sparkgate",
            FrontKind::Baseline => "baseline",
            FrontKind::Nginx => "nginx",
            FrontKind::Smg => "smg",
            FrontKind::Litellm => "litellm",
            FrontKind::SparkgateTls => "sparkgate-tls",
            FrontKind::NginxTls => "nginx-tls",
        }
    }

    /// Whether the front serves HTTPS.
    pub fn tls(self) -> bool {
        matches!(self, FrontKind::SparkgateTls | FrontKind::NginxTls)
    }

    /// How the front is configured so that it does not cap the load (for the report).
    pub fn setup_note(self) -> &'static str {
        match self {
            FrontKind::Direct => "vllm-sim itself",
            FrontKind::Sparkgate => "`sparkgate serve --upstream`, MAX_NUM_SEQS=20000, QUEUE_DEPTH=20000, defaults otherwise (access log on)",
            FrontKind::Baseline => "another sparkgate binary (`--baseline`), configured as sparkgate",
            FrontKind::Nginx => "plain reverse proxy: proxy_buffering off, upstream keepalive 256, worker_processes auto, access log to a file (its default)",
            FrontKind::Smg => "`smg launch --policy round_robin --max-concurrent-requests 20000 --rate-limit-tokens-per-second 0 --disable-retries --disable-circuit-breaker`",
            FrontKind::Litellm => "`litellm --config` with `hosted_vllm/` and max_parallel_requests 20000, 1 worker",
            FrontKind::SparkgateTls => "as sparkgate, with TLS_CERT/TLS_KEY (a P-256 certificate of the harness's CA)",
            FrontKind::NginxTls => "as nginx, with `listen … ssl` and the same certificate (nginx's defaults otherwise: TLS 1.2 and 1.3, session tickets)",
        }
    }
}

/// Where the peers were installed (`tests/overhead/run.sh` puts them there).
#[derive(Debug, Clone)]
pub struct Peers {
    pub venv: PathBuf,
    pub nginx: PathBuf,
    /// The `Baseline` front's sparkgate binary.
    pub baseline: Option<PathBuf>,
}

/// A running front: its base URL and the process tree whose CPU and memory count.
#[derive(Debug)]
pub struct Front {
    pub kind: FrontKind,
    pub base: String,
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
}

impl Front {
    /// Starts `kind` in front of the simulator at `backend` (host:port) and waits until it
    /// answers `GET /v1/models` with 200. Err: why it could not run.
    pub fn start(
        kind: FrontKind,
        backend: &str,
        model: &str,
        sparkgate: &Path,
        peers: &Peers,
    ) -> Result<Front, String> {
        if kind == FrontKind::Direct {
            return Ok(Front {
                kind,
                base: format!("http://{backend}"),
                child: None,
                _dir: None,
            });
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let launch = Launch {
            backend,
            model,
            dir: dir.path(),
            port: free_port(),
        };
        let mut cmd = match kind {
            FrontKind::Direct => unreachable!(),
            FrontKind::Sparkgate => launch.sparkgate(sparkgate),
            FrontKind::SparkgateTls => {
                let (cert, key) = tls::leaf()?;
                let mut c = launch.sparkgate(sparkgate);
                c.env("TLS_CERT", cert).env("TLS_KEY", key);
                c
            }
            FrontKind::NginxTls => launch.nginx_tls(&peers.nginx)?,
            FrontKind::Baseline => launch.sparkgate(peers.baseline.as_deref().ok_or("no --baseline binary given")?),
            FrontKind::Nginx => launch.nginx(&peers.nginx)?,
            FrontKind::Smg => launch.smg(&peers.venv.join("bin/smg")),
            FrontKind::Litellm => launch.litellm(&peers.venv.join("bin/litellm"))?,
        };
        let program = cmd.get_program().to_owned();
        if !Path::new(&program).exists() && kind != FrontKind::Sparkgate {
            return Err(format!(
                "{} is not installed (run tests/overhead/run.sh)",
                program.to_string_lossy()
            ));
        }
        let log = std::fs::File::create(dir.path().join("front.log")).map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            // Each front leads its own process group, so stopping it stops its workers.
            .process_group(0);
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", program.to_string_lossy()))?;
        let scheme = if kind.tls() { "https" } else { "http" };
        let mut front = Front {
            kind,
            base: format!("{scheme}://127.0.0.1:{}", launch.port),
            child: Some(child),
            _dir: Some(dir),
        };
        front.wait_answering(Duration::from_secs(180))?;
        Ok(front)
    }

    /// Waits until the front answers `GET /v1/models` with 200, so no load goes through it
    /// before it listens and serves; Err: what the last probe saw (or how it exited), and the
    /// end of its log.
    fn wait_answering(&mut self, within: Duration) -> Result<(), String> {
        let addr: SocketAddr = self
            .base
            .split_once("://")
            .map_or(self.base.as_str(), |(_, a)| a)
            .parse()
            .map_err(|e| format!("{}: {e}", self.base))?;
        // The probe speaks plain HTTP: a TLS front listening answers it 400 (both sparkgate and
        // nginx say "send HTTPS"); the load's first second is its warm-up either way.
        let serving = if self.kind.tls() { 400 } else { 200 };
        let child = &mut self.child;
        let exited = || {
            child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .map(|status| status.to_string())
        };
        ready::wait_ready(addr, "/v1/models", serving, within, exited).map_err(|why| {
            format!(
                "{} at {addr} {why} (GET /v1/models): {}",
                self.kind.name(),
                self.log_tail()
            )
        })
    }

    fn log_tail(&self) -> String {
        let Some(dir) = &self._dir else { return String::new() };
        let text = std::fs::read_to_string(dir.path().join("front.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The front's process tree: CPU seconds used so far and resident memory now.
    pub fn usage(&self) -> Option<TreeUsage> {
        self.child.as_ref().map(|c| tree_usage(c.id()))
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pgid = child.id() as i32;
            // SIGTERM to the whole group (nginx workers, LiteLLM's uvicorn), then reap.
            // `--` so the negative process-group id is not read as an option.
            let _ = Command::new("kill")
                .args(["-s", "TERM", "--", &format!("-{pgid}")])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{pgid}")])
                .status();
            let _ = child.wait();
        }
    }
}

use std::os::unix::process::CommandExt as _;

/// Where a front is started: the simulator it fronts, the model it serves, its own directory
/// (configuration, logs) and the port it listens on, on 127.0.0.1.
#[derive(Debug)]
struct Launch<'a> {
    backend: &'a str,
    model: &'a str,
    dir: &'a Path,
    port: u16,
}

impl Launch<'_> {
    /// `sparkgate serve --upstream` (the binary `bin`) with admission wide enough for any load.
    fn sparkgate(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.args([
            "serve",
            "--upstream",
            &format!("http://{}", self.backend),
            "--port",
            &self.port.to_string(),
        ])
        .env("PROFILE", "deepseek-v4.1-flash")
        .env("SERVED_MODEL_NAME", self.model)
        .env("MAX_NUM_SEQS", "20000")
        .env("QUEUE_DEPTH", "20000")
        .env("DEPLOY_DIR", self.dir);
        c
    }

    fn nginx(&self, bin: &Path) -> Result<Command, String> {
        self.nginx_with(bin, "")
    }

    fn nginx_tls(&self, bin: &Path) -> Result<Command, String> {
        let (cert, key) = tls::leaf()?;
        let ssl = format!(
            " ssl;\n        ssl_certificate {};\n        ssl_certificate_key {}",
            cert.display(),
            key.display()
        );
        self.nginx_with(bin, &ssl)
    }

    /// nginx with `listen` followed by `listen_extra` (`ssl` and its certificate, or nothing).
    fn nginx_with(&self, bin: &Path, listen_extra: &str) -> Result<Command, String> {
        let conf = self.dir.join("nginx.conf");
        let text = nginx_conf(self.port, self.backend, self.dir).replacen(
            &format!("listen 127.0.0.1:{};", self.port),
            &format!("listen 127.0.0.1:{}{listen_extra};", self.port),
            1,
        );
        std::fs::write(&conf, text).map_err(|e| e.to_string())?;
        let mut c = Command::new(bin);
        c.args(["-e", "stderr", "-p"])
            .arg(self.dir)
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"]);
        Ok(c)
    }

    fn smg(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.args([
            "launch",
            "--worker-urls",
            &format!("http://{}", self.backend),
            "--host",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
            "--policy",
            "round_robin",
            "--max-concurrent-requests",
            "20000",
            "--rate-limit-tokens-per-second",
            "0",
            "--queue-size",
            "20000",
            "--queue-timeout-secs",
            "600",
            "--disable-retries",
            "--disable-circuit-breaker",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &free_port().to_string(),
        ]);
        c
    }

    fn litellm(&self, bin: &Path) -> Result<Command, String> {
        let cfg = self.dir.join("litellm.yaml");
        std::fs::write(&cfg, litellm_conf(self.backend, self.model)).map_err(|e| e.to_string())?;
        let mut c = Command::new(bin);
        c.arg("--config")
            .arg(&cfg)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .env("LITELLM_LOG", "ERROR");
        Ok(c)
    }
}

fn nginx_conf(port: u16, backend: &str, dir: &Path) -> String {
    format!(
        "worker_processes auto;
worker_rlimit_nofile 200000;
pid {dir}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 60000; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    upstream sim {{ server {backend}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
        }}
    }}
}}
",
        dir = dir.display()
    )
}

fn litellm_conf(backend: &str, model: &str) -> String {
    format!(
        "model_list:
  - model_name: {model}
    litellm_params:
      model: hosted_vllm/{model}
      api_base: http://{backend}/v1
      api_key: none
      max_parallel_requests: 20000
litellm_settings:
  drop_params: false
  request_timeout: 3600
"
    )
}

/// CPU and memory of a process and its descendants.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TreeUsage {
    pub cpu_s: f64,
    pub rss_kib: u64,
    pub processes: usize,
}

/// Sums utime+stime (from /proc/PID/stat) and VmRSS over `root` and its descendants.
pub fn tree_usage(root: u32) -> TreeUsage {
    let ticks = 100.0; // USER_HZ on Linux
    let mut procs: Vec<(u32, u32, f64)> = Vec::new(); // (pid, ppid, cpu s)
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // Fields after the parenthesised command: state ppid … utime(14) stime(15).
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            let (Some(ppid), Some(ut), Some(st)) = (
                f.get(1).and_then(|v| v.parse().ok()),
                f.get(11).and_then(|v| v.parse::<f64>().ok()),
                f.get(12).and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            procs.push((pid, ppid, (ut + st) / ticks));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(procs.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    let mut usage = TreeUsage::default();
    for pid in &tree {
        if let Some(p) = procs.iter().find(|p| p.0 == *pid) {
            usage.cpu_s += p.2;
            usage.processes += 1;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(kib) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        {
            usage.rss_kib += kib;
        }
    }
    usage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_of_this_process_counts_itself_and_a_child() {
        let mut child = Command::new("sleep").arg("5").spawn().expect("sleep");
        let usage = tree_usage(std::process::id());
        assert!(usage.processes >= 2, "{usage:?}");
        assert!(usage.rss_kib > 0);
        child.kill().ok();
        child.wait().ok();
    }

    #[test]
    fn generated_configs_point_at_the_backend() {
        let n = nginx_conf(4321, "127.0.0.1:9999", Path::new("/tmp/x"));
        assert!(n.contains("listen 127.0.0.1:4321;") && n.contains("server 127.0.0.1:9999;"));
        assert!(n.contains("proxy_buffering off;"));
        let l = litellm_conf("127.0.0.1:9999", "M");
        assert!(l.contains("model: hosted_vllm/M") && l.contains("api_base: http://127.0.0.1:9999/v1"));
    }
}
