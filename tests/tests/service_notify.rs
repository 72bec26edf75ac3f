//! What the gateway tells systemd, read off a NOTIFY_SOCKET datagram socket the test owns (the
//! protocol systemd's manager reads; systemd cannot run as PID 1 on this machine): READY=1 only
//! once the group is ready, STATUS in words, WATCHDOG=1 while the supervisor's actor answers and
//! none once it is frozen (a test hook), RELOADING=1 … READY=1 around SIGHUP, STOPPING=1 at the
//! drain; and journald's priority prefixes when stderr is the JOURNAL_STREAM.

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// The next notification, if one comes within `within`.
fn next(sock: &UnixDatagram, within: Duration) -> Option<String> {
    sock.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Notifications until one starts with `prefix` (which is returned), the others in `seen`.
fn until(sock: &UnixDatagram, prefix: &str, seen: &mut Vec<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(m) = next(sock, Duration::from_secs(5)) {
            if m.starts_with(prefix) {
                return m;
            }
            seen.push(m);
        }
    }
    panic!("no notification starting {prefix:?}; saw {seen:?}");
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn systemd_hears_ready_status_watchdog_reload_and_a_frozen_actor_goes_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    let freeze = dir.path().join("freeze");
    let gw = TestGateway::builder(SIM)
        .envs(&[
            ("NOTIFY_SOCKET", path.display().to_string()),
            ("WATCHDOG_USEC", "1000000".to_owned()),
            ("SPARKGATE_TEST_FREEZE_FILE", freeze.display().to_string()),
            ("SIM_LOAD_SECONDS", "1".to_owned()),
        ])
        .start_unready();
    let mut before = Vec::new();
    let ready = until(&sock, "READY=1", &mut before);
    assert!(
        ready.contains("STATUS=serving: ") && ready.contains("ready (epoch 1)"),
        "{ready}"
    );
    assert!(
        before
            .iter()
            .any(|m| m.starts_with("STATUS=starting: ") && m.contains("starting (epoch 1)")),
        "the start is told before READY: {before:?}"
    );
    assert!(!before.iter().any(|m| m.contains("READY=1")), "{before:?}");
    // The watchdog: every half second while the actor answers.
    let mut seen = Vec::new();
    for _ in 0..3 {
        until(&sock, "WATCHDOG=1", &mut seen);
    }
    signal(gw.proc.pid(), "-HUP");
    let reloading = until(&sock, "RELOADING=1", &mut seen);
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    until(&sock, "READY=1", &mut seen);
    // A frozen actor: the pings go unanswered, the watchdog goes quiet, the log says why.
    std::fs::write(&freeze, "").unwrap();
    gw.proc.wait_for("the supervisor's actor stops here (a test hook)");
    let mut quiet = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        if let Some(m) = next(&sock, Duration::from_millis(500)) {
            quiet.push(m);
        }
    }
    let pings_after = quiet.iter().filter(|m| m.starts_with("WATCHDOG=1")).count();
    assert!(pings_after <= 1, "at most the ping already on its way: {quiet:?}");
    gw.proc.wait_for("did not answer within 0.5 s: no watchdog ping");
}

#[test]
fn gateway_only_is_ready_at_once_says_so_stops_with_stopping_and_prefixes_its_lines_for_journald() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream_url("http://127.0.0.1:9")
        .env("NOTIFY_SOCKET", &path.display().to_string())
        .start_unready();
    let mut seen = Vec::new();
    let ready = until(&sock, "READY=1", &mut seen);
    assert!(
        ready.contains("STATUS=serving (gateway only: the upstream is not supervised)"),
        "{ready}"
    );
    signal(gw.proc.pid(), "-TERM");
    let stopping = until(&sock, "STOPPING=1", &mut seen);
    assert!(stopping.contains("STATUS=draining"), "{stopping}");

    // journald: stderr is the JOURNAL_STREAM → each line starts with its priority.
    let log = dir.path().join("stderr");
    let file = std::fs::File::create(&log).unwrap();
    let meta = file.metadata().unwrap();
    let mut child = std::process::Command::new(sparkgate_tests::test_gateway::sparkgate_bin(SIM))
        .args([
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
        ])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .env("STORE_URL", dir.path().join("s.sqlite").display().to_string())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("does not answer 200") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let listening = text
        .lines()
        .find(|l| l.contains("sparkgate listening on"))
        .expect(&text);
    assert!(listening.starts_with("<6>"), "{text}");
    let down = text.lines().find(|l| l.contains("does not answer 200")).expect(&text);
    assert!(down.starts_with("<4>"), "an unplanned event is a warning: {text}");
    assert!(text.lines().all(|l| l.starts_with('<')), "{text}");
}
