//! `sparkgate top` in a real pseudo-terminal (a tmux session) against a supervised gateway with
//! simulated ranks: it renders the group's state, admission, tokens/s and ranks, follows a
//! restart to the next epoch, says so when the gateway is gone, and quits on `q`.

use std::process::Command;
use std::time::{Duration, Instant};

use sparkgate_tests::http::request;
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// A detached tmux session, killed when dropped.
struct Session(String);

impl Session {
    fn start(command: &str) -> Session {
        let name = format!("sgtop-{}", std::process::id());
        let ok = Command::new("tmux")
            .args(["new-session", "-d", "-s", &name, "-x", "110", "-y", "36", command])
            .status()
            .expect("tmux runs");
        assert!(ok.success(), "tmux new-session");
        Session(name)
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.0])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen shows `what`; the screen then.
    fn wait_for(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.screen();
            if s.contains(what) {
                return s;
            }
            assert!(Instant::now() < deadline, "the screen never showed {what:?}:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["has-session", "-t", &self.0])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.0]).output();
    }
}

#[test]
fn top_renders_the_group_follows_a_restart_and_quits_on_q() {
    let gw = TestGateway::builder(SIM).start();
    let top = format!("{} top --url http://{} --interval-ms 200", sparkgate_bin(SIM), gw.addr);
    let session = Session::start(&top);
    let screen = session.wait_for("ready: epoch 1, mode dspark");
    for part in [
        "sparkgate top",
        "admission",
        "in flight of 2",
        "tokens/s",
        "TTFT",
        "ranks",
        "head",
        "worker",
    ] {
        assert!(screen.contains(part), "{part:?} on the screen:\n{screen}");
    }
    let r = request(gw.addr, "POST", "/admin/restart?force=1", &[], b"");
    assert_eq!(r.status, 202, "{}", r.text());
    let screen = session.wait_for("ready: epoch 2, mode dspark");
    assert!(screen.contains("restarts 1"), "{screen}");
    assert!(
        screen.contains("operator restart"),
        "the last restart's reason:\n{screen}"
    );
    // The gateway gone: the view says so and keeps trying.
    drop(gw);
    session.wait_for("no sparkgate answers");
    let quit = Command::new("tmux")
        .args(["send-keys", "-t", &session.0, "q"])
        .status()
        .unwrap();
    assert!(quit.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while session.alive() {
        assert!(Instant::now() < deadline, "q quits:\n{}", session.screen());
        std::thread::sleep(Duration::from_millis(50));
    }
}
