//! `sparkgate install` under real systemd (PID 1 in a container built from Debian's packages,
//! `sparkgate_tests::systemd`), the gateway supervising two vllm-sim ranks as processes: the unit
//! installs and a re-run names what changed; `systemctl start` returns only once the group is
//! ready; `systemctl reload` reads the keys; a SIGKILLed rank is one warning in
//! `journalctl -p warning`; a SIGKILLed gateway is restarted with no rank left over; a frozen
//! supervisor is restarted by the watchdog; `systemctl stop` drains an open stream; uninstall
//! removes the unit.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sparkgate_tests::harness::free_port;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::systemd::{SystemdHost, BIN};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// The rank processes' pids (their process name, so a shell's own command line never matches).
fn ranks(host: &SystemdHost) -> Vec<String> {
    host.sh("pgrep -x vllm-sim || true")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn ready(addr: SocketAddr) -> bool {
    std::net::TcpStream::connect(addr).is_ok() && request(addr, "GET", "/ready", &[], b"").status == 200
}

fn models(addr: SocketAddr, key: &str) -> u16 {
    let auth = format!("Bearer {key}");
    request(addr, "GET", "/v1/models", &[("authorization", &auth)], b"").status
}

/// Waits for systemd to have started a new main process (not `old`) that serves again.
fn serving_again(host: &SystemdHost, addr: SocketAddr, old: &str) {
    host.wait("the restart", Duration::from_secs(90), |h| {
        let pid = h.property("sparkgate", "MainPID");
        let active = h.property("sparkgate", "ActiveState") == "active";
        (pid != old && pid != "0" && active && ready(addr)).then_some(())
    });
}

#[test]
fn the_unit_under_real_systemd_starts_reloads_restarts_and_drains() {
    let host = SystemdHost::boot(Path::new(SIM).parent().unwrap());
    let (sparkgate, sim) = (format!("{BIN}/sparkgate"), format!("{BIN}/vllm-sim"));
    let (port, vllm, master) = (free_port(), free_port(), free_port());
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    host.ok("mkdir -p /srv/sg");
    host.write("/srv/sg/keys", "alice sk-alice\n");
    let env = format!(
        "RUNTIME=process\nVLLM_BIN={sim}\nPORT={port}\nBIND_ADDR=127.0.0.1\nHEAD_IP=127.0.0.1\nWORKER_IP=127.0.0.1\n\
         VLLM_PORT={vllm}\nMASTER_PORT={master}\nLOG_DIR=/srv/sg/logs\nREADY_TIMEOUT=60\nWEIGHTS_GIB_PER_RANK=\n\
         API_KEYS_FILE=keys\nRESTART_BACKOFF_INITIAL=0.2\nRANK_ENV=SIM_LOAD_SECONDS=3,SIM_SPEED=1\n"
    );
    host.write("/srv/sg/.env", &env);
    let installed = host.ok(&format!("cd /srv/sg && {sparkgate} install"));
    assert!(
        installed.contains("/etc/systemd/system/sparkgate.service written"),
        "{installed}"
    );
    host.write("/srv/sg/.env", &format!("{env}DRAIN_TIMEOUT=30\n"));
    let updated = host.ok(&format!("cd /srv/sg && {sparkgate} install"));
    assert!(
        updated.contains("-TimeoutStopSec=242") && updated.contains("+TimeoutStopSec=212"),
        "{updated}"
    );
    host.ok("systemd-analyze verify /etc/systemd/system/sparkgate.service");

    // Type=notify: the start returns once the group is ready (the ranks take 3 s to load), not
    // once the gateway listens.
    host.ok("systemctl start sparkgate");
    assert!(ready(addr), "active only once ready: {}", host.journal());
    let status = host.property("sparkgate", "StatusText");
    assert_eq!(status, "serving: main ready (epoch 1)");

    // systemctl reload: SIGHUP reads the keys (RELOADING=1 … READY=1 around it).
    assert_eq!(models(addr, "sk-bob"), 401);
    host.write("/srv/sg/keys", "alice sk-alice\nbob sk-bob\n");
    host.ok("systemctl reload sparkgate");
    host.wait("the reload's log line", Duration::from_secs(10), |h| {
        h.journal().contains("API keys reloaded").then_some(())
    });
    assert!(host.journal().contains("why=\"SIGHUP\""), "{}", host.journal());
    assert_eq!(models(addr, "sk-bob"), 200);

    // A SIGKILLed rank: one warning in the journal, with its reason.
    // `[n]`: the pattern does not match the shell's own command line.
    host.ok("pkill -KILL -f '[n]ode-rank 1'");
    host.wait("epoch 2", Duration::from_secs(60), |h| {
        (h.property("sparkgate", "StatusText") == "serving: main ready (epoch 2)").then_some(())
    });
    let warnings = host.sh("journalctl -u sparkgate -p warning --no-pager -o cat");
    let lines: Vec<&str> = warnings.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly the unplanned event: {warnings}");
    assert!(
        lines[0].contains("WARN group main: epoch 1 lost (killed): rank 1 exited"),
        "{warnings}"
    );

    // A SIGKILLed gateway: systemd restarts it, no rank of the old one is left.
    let before = ranks(&host);
    assert_eq!(before.len(), 2, "{before:?}");
    let killed = host.property("sparkgate", "MainPID");
    host.ok("systemctl kill -s KILL sparkgate");
    serving_again(&host, addr, &killed);
    assert_eq!(host.property("sparkgate", "NRestarts"), "1");
    let after = ranks(&host);
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        before.iter().all(|p| !after.contains(p)),
        "an old rank lives on: {before:?} {after:?}"
    );

    // The watchdog: a frozen supervisor stops the pings; systemd restarts the gateway.
    host.ok("mkdir -p /etc/systemd/system/sparkgate.service.d");
    host.write(
        "/etc/systemd/system/sparkgate.service.d/watchdog.conf",
        "[Service]\nWatchdogSec=4\nEnvironment=SPARKGATE_TEST_FREEZE_FILE=/srv/sg/freeze\n",
    );
    host.ok("systemctl daemon-reload && systemctl restart sparkgate");
    assert!(ready(addr));
    let frozen = host.property("sparkgate", "MainPID");
    host.ok("touch /srv/sg/freeze");
    host.wait("the frozen actor", Duration::from_secs(10), |h| {
        h.journal()
            .contains("the supervisor's actor stops here (a test hook)")
            .then_some(())
    });
    host.ok("rm /srv/sg/freeze");
    host.wait("the watchdog's verdict", Duration::from_secs(20), |h| {
        h.sh("journalctl -u sparkgate --no-pager")
            .contains("Failed with result 'watchdog'")
            .then_some(())
    });
    serving_again(&host, addr, &frozen);

    // systemctl stop: the drain lets an open stream finish, then the ranks stop.
    let body = serde_json::json!({"messages": [{"role": "user", "content": "Count."}], "max_tokens": 64, "stream": true, "ignore_eos": true});
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    let mut stream = Streaming::open(
        addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    );
    assert_eq!(stream.status, 200);
    let first = stream.next_chunk().expect("a first event");
    assert!(!first.is_empty());
    // The stream is read to its end while systemctl stop waits for the drain.
    let rest = std::thread::scope(|s| {
        let reader = s.spawn(move || String::from_utf8_lossy(&stream.read_all()).into_owned());
        host.ok("systemctl stop sparkgate");
        reader.join().unwrap()
    });
    assert!(
        rest.contains("\"finish_reason\":\"length\"") && rest.trim_end().ends_with("data: [DONE]"),
        "{rest}"
    );
    assert_eq!(host.property("sparkgate", "ActiveState"), "inactive");
    assert!(ranks(&host).is_empty(), "the ranks stopped with the gateway");
    assert!(host.journal().contains("event=\"draining\""), "{}", host.journal());

    let removed = host.ok(&format!("{sparkgate} uninstall"));
    assert!(
        removed.contains("/etc/systemd/system/sparkgate.service removed"),
        "{removed}"
    );
    assert!(host
        .sh("test -e /etc/systemd/system/sparkgate.service && echo present")
        .trim()
        .is_empty());
}
