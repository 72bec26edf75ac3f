//! Test harness: start `vllm-sim` (or any server that logs like it) as a child process and wait
//! on its log lines instead of sleeping; the raw HTTP/1.1 the tests speak is `http`'s.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::http::{post_json, request};

/// How long a test waits for a process to reach a log line before failing.
pub const STARTUP: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Lines {
    lines: Vec<String>,
    closed: bool,
}

/// A child process whose stdout is collected line by line.
pub struct Proc {
    child: Child,
    lines: Arc<(Mutex<Lines>, Condvar)>,
    /// A directory the process works in that goes when it does (removed after the kill).
    dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc").field("pid", &self.child.id()).finish()
    }
}

impl Proc {
    /// Spawns `program args…` with extra environment; stdout and stderr are both collected.
    pub fn spawn(program: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        Self::spawn_as(program, args, env, false)
    }

    /// `spawn`, the child leading a process group of its own when `own_group` (as a shell's
    /// foreground job does: a terminal's Ctrl-C goes to that whole group).
    pub fn spawn_as(program: &str, args: &[String], env: &[(&str, &str)], own_group: bool) -> Proc {
        use std::os::unix::process::CommandExt as _;
        let mut cmd = Command::new(program);
        if own_group {
            cmd.process_group(0);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let lines: Arc<(Mutex<Lines>, Condvar)> = Arc::default();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(2));
        for stream in [Box::new(out) as Box<dyn Read + Send>, Box::new(err)] {
            let lines = lines.clone();
            let open = open.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let (m, cv) = &*lines;
                    m.lock().expect("lines").lines.push(line);
                    cv.notify_all();
                }
                if open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                    let (m, cv) = &*lines;
                    m.lock().expect("lines").closed = true;
                    cv.notify_all();
                }
            });
        }
        Proc {
            child,
            lines,
            dir: None,
        }
    }

    /// This process, keeping `dir` until the process is gone.
    pub fn keeping(mut self, dir: tempfile::TempDir) -> Proc {
        self.dir = Some(dir);
        self
    }

    /// The first line containing `needle` (waiting for it), or a panic with the log so far.
    pub fn wait_for(&self, needle: &str) -> String {
        self.wait_for_within(needle, STARTUP)
    }

    pub fn wait_for_within(&self, needle: &str, timeout: Duration) -> String {
        self.try_wait_for(needle, timeout).unwrap_or_else(|| {
            panic!(
                "no line containing {needle:?} within {timeout:?}; log:\n{}",
                self.log().join("\n")
            )
        })
    }

    /// The first line containing `needle`, waiting up to `timeout`; `None` if it never came
    /// (or the process closed its output first).
    pub fn try_wait_for(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let (m, cv) = &*self.lines;
        let mut g = m.lock().expect("lines");
        loop {
            if let Some(l) = g.lines.iter().find(|l| l.contains(needle)) {
                return Some(l.clone());
            }
            let now = Instant::now();
            if g.closed || now >= deadline {
                return None;
            }
            g = cv.wait_timeout(g, deadline - now).expect("lines").0;
        }
    }

    pub fn log(&self) -> Vec<String> {
        self.lines.0.lock().expect("lines").lines.clone()
    }

    pub fn has_line(&self, needle: &str) -> bool {
        self.log().iter().any(|l| l.contains(needle))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, as `docker stop` or an init system sends it: the process decides how to end.
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM to {}: {sent}", self.pid());
    }

    /// SIGKILL, as a crashing node or `docker kill` would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own, and for its output to be fully collected.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let (m, cv) = &*self.lines;
                let mut g = m.lock().expect("lines");
                while !g.closed && Instant::now() < deadline {
                    g = cv.wait_timeout(g, Duration::from_millis(100)).expect("lines").0;
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} still running after {timeout:?}; log:\n{}",
                self.pid(),
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }
}

impl Drop for Proc {
    /// SIGTERM first, so a supervising gateway stops its rank processes instead of orphaning
    /// them; SIGKILL after 5 s.
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a log line: the first `http://ADDR`, else the last word
/// (`Starting vLLM server on http://127.0.0.1:43861`, `… listening on 127.0.0.1:29501`).
pub fn addr_in(line: &str) -> SocketAddr {
    let word = match line.split_once("https://").or_else(|| line.split_once("http://")) {
        Some((_, rest)) => rest.split_whitespace().next().unwrap_or(rest),
        None => line.split_whitespace().last().unwrap_or(line),
    };
    word.trim_matches(|c: char| c == '"' || c == '/')
        .parse()
        .unwrap_or_else(|_| panic!("no address in {line:?}"))
}

/// A simulated rank started as a process.
#[derive(Debug)]
pub struct Sim {
    pub proc: Proc,
    pub http: Option<SocketAddr>,
    pub control: Option<SocketAddr>,
}

impl Sim {
    /// Starts `vllm-sim serve MODEL args…` and, unless headless, waits until it serves HTTP.
    /// `--host 127.0.0.1 --port 0` and a control port are added.
    pub fn start(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Sim {
        let mut argv: Vec<String> = vec!["serve".into()];
        argv.extend(args.iter().map(|s| (*s).to_owned()));
        let headless = args.contains(&"--headless");
        if !args.contains(&"--port") {
            argv.extend(["--host", "127.0.0.1", "--port", "0"].map(String::from));
        }
        let mut full_env: Vec<(&str, &str)> = vec![
            ("SIM_LOAD_SECONDS", "0"),
            ("SIM_CONTROL_PORT", "0"),
            ("SIM_SPEED", "instant"),
        ];
        full_env.extend_from_slice(env);
        let proc = Proc::spawn(bin, &argv, &full_env);
        if headless {
            return Sim {
                proc,
                http: None,
                control: None,
            };
        }
        let http = addr_in(&proc.wait_for("Starting vLLM server on http://"));
        proc.wait_for("Application startup complete.");
        let control = addr_in(&proc.wait_for("vllm-sim control endpoint on http://"));
        Sim {
            proc,
            http: Some(http),
            control: Some(control),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.http.expect("rank 0 serves HTTP")
    }

    /// JSON state from the control endpoint.
    pub fn state(&self) -> serde_json::Value {
        let r = request(self.control.expect("control endpoint"), "GET", "/state", &[], b"");
        serde_json::from_slice(&r.body).expect("state JSON")
    }

    pub fn fault(&self, path: &str) {
        let r = request(self.control.expect("control endpoint"), "POST", path, &[], b"");
        assert!(r.status < 300, "fault {path}: {}", r.status);
    }

    /// Polls the control state until `pred` holds (a readiness signal, not a fixed sleep).
    pub fn wait_state(&self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.state();
            if pred(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "state never reached {what}: {s}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The value after `flag` in a benchmark binary's arguments (`--seconds 5`).
pub fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// A free TCP port on 127.0.0.1 for tools that cannot take port 0 (a rank's VLLM_PORT, the
/// rendezvous port). Chosen below the kernel's ephemeral range (32768+), so no `port 0` socket of
/// another test can take it between this check and its use; test processes stride apart by pid.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7919);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (base.wrapping_add(n.wrapping_mul(104_729)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
        {
            return port;
        }
    }
}

/// A binary built next to `sibling` in the same target directory (e.g. `sparkgate` next to
/// `vllm-sim`); `cargo build --workspace` builds both.
pub fn binary_next_to(sibling: &str, name: &str) -> String {
    let path = std::path::Path::new(sibling).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo build --workspace)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// `sparkgate serve` in gateway-only mode in front of `upstream`, as a process.
#[derive(Debug)]
pub struct Gateway {
    pub proc: Proc,
    pub addr: SocketAddr,
}

/// The guides' smoke question; the simulated model answers `323`.
pub const SMOKE: &str = "What is 17*19? Reply with the integer only.";

impl Gateway {
    /// The guides' smoke request (thinking off, 32 tokens) through this gateway, as JSON.
    pub fn smoke(&self) -> serde_json::Value {
        let body = serde_json::json!({"messages": [{"role": "user", "content": SMOKE}], "max_tokens": 32, "chat_template_kwargs": {"enable_thinking": false}});
        post_json(self.addr, "/v1/chat/completions", &body).json()
    }

    /// The gateway `proc` runs, once its log says where it listens.
    pub fn listening(proc: Proc) -> Gateway {
        let addr = addr_in(&proc.wait_for("sparkgate listening on "));
        Gateway { proc, addr }
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + STARTUP;
        while request(self.addr, "GET", "/ready", &[], b"").status != 200 {
            assert!(
                Instant::now() < deadline,
                "gateway never became ready; log:\n{}",
                self.proc.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

/// Waits until the wall clock's minute has at least 15 s left, so requests meant to share a
/// minute window (a per-minute quota's) do.
pub fn early_in_a_minute() {
    loop {
        let s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
            % 60;
        if s < 45 {
            return;
        }
        std::thread::sleep(Duration::from_secs(60 - s));
    }
}
