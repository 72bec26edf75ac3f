//! Operator speculation-mode switches through `/admin/spec` and `sparkgate spec`: drain, restart
//! into the mode with its own MAX_NUM_SEQS, admission capacity following; bad input refused in
//! the error envelope.

use serde_json::json;
use sparkgate_tests::http::{post_json, request};
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const AUTH: (&str, &str) = ("Authorization", "Bearer t0ken");

#[test]
fn an_operator_switch_restarts_into_the_mode_with_its_capacity() {
    let logs = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(SIM)
        .logs(logs.path())
        .env("SIM_SPEED", "1")
        .start();
    let spec = request(gw.addr, "GET", "/admin/spec", &[AUTH], b"").json();
    assert_eq!(spec["mode"], "dspark");
    let none = spec["modes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mode"] == "none")
        .unwrap()
        .clone();
    assert_eq!(none["max_num_seqs"], 4);
    assert_eq!(none["throughput"][3]["tokens_per_s"], 53.7);
    assert_eq!(gw.status()["admission"]["capacity"], 2);

    let json_body = [AUTH, ("Content-Type", "application/json")];
    for (body, param, says) in [
        (&b"{\"mode\": \"turbo\"}"[..], "mode", "one of dspark, none"),
        (b"not json", "body", "must be JSON"),
        (b"{}", "mode", "is required"),
        (b"{\"mode\": \"none\", \"policy\": \"yolo\"}", "policy", "must be"),
    ] {
        let r = request(gw.addr, "POST", "/admin/spec", &json_body, body);
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(says), "{e}");
    }
    assert_eq!(gw.status()["supervisor"]["epoch"], 1, "nothing restarted on bad input");

    // A request running when the switch is asked for finishes first (drain).
    let addr = gw.addr;
    let running = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "ignore_eos": true}),
        )
    });
    gw.wait_status("one request running", |s| s["admission"]["in_flight"] == 1);
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["spec", "none"])
        .env("PORT", gw.addr.port().to_string())
        .env("ADMIN_TOKEN", "t0ken")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("ready in ") && text.contains("mode none"),
        "{text}"
    );
    let done = running.join().unwrap();
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.json()["usage"]["completion_tokens"], 40);

    // The switch is the next start: epoch 2, unless the group restarted for another reason just
    // before it (then the switch is kept for the start after).
    // The gateway mirrors the supervisor's status a moment later: wait for both.
    let s = gw.wait_status("ready in mode none", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["mode"] == "none" && s["mode"] == "none"
    });
    if s["supervisor"]["restarts"].as_u64() > Some(1) {
        eprintln!("restarts beside the switch: {s}\n{}", gw.proc.log().join("\n"));
    }
    let epoch = s["supervisor"]["epoch"].as_u64().unwrap() as u32;
    assert!(
        epoch == 2 || s["supervisor"]["restarts"].as_u64() > Some(1),
        "one restart for one switch: {s}\n{}",
        gw.proc.log().join("\n")
    );
    assert_eq!(s["supervisor"]["max_num_seqs"], 4);
    assert_eq!(s["mode"], "none");
    assert_eq!(s["admission"]["capacity"], 4);
    let args = |epoch: u32| {
        let log = std::fs::read_to_string(logs.path().join(format!("epoch-{epoch}/rank0.log"))).unwrap();
        log.lines().find(|l| l.contains("non-default args")).unwrap().to_owned()
    };
    assert!(args(1).contains("speculative_config") && args(1).contains("\"max_num_seqs\":\"2\""));
    assert!(
        !args(epoch).contains("speculative_config") && args(epoch).contains("\"max_num_seqs\":\"4\""),
        "{}",
        args(epoch)
    );

    let again = request(gw.addr, "POST", "/admin/spec", &json_body, b"{\"mode\": \"none\"}");
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["switching"], false);
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["spec"])
        .env("PORT", gw.addr.port().to_string())
        .env("ADMIN_TOKEN", "t0ken")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mode      none (policy fixed)"), "{text}");
    assert!(text.contains("dspark  max_num_seqs 2"), "{text}");

    // Release the pin: auto again, no restart by itself.
    let released = request(gw.addr, "POST", "/admin/spec", &json_body, b"{\"policy\": \"auto\"}");
    assert_eq!(released.status, 200, "{}", released.text());
    assert_eq!(released.json()["policy"], "auto");
    let spec = request(gw.addr, "GET", "/admin/spec", &[], b"").json();
    assert_eq!(spec["policy"], "auto");
    assert_eq!(spec["settings"]["min_dwell_s"], 600.0);
    // Pinning again through a mode turns auto off.
    let pinned = request(gw.addr, "POST", "/admin/spec", &json_body, b"{\"mode\": \"none\"}");
    assert_eq!(pinned.status, 200);
    assert_eq!(
        request(gw.addr, "GET", "/admin/spec", &[], b"").json()["policy"],
        "fixed"
    );
}

#[test]
fn auto_switches_to_none_under_wide_load_and_back_with_nothing_lost() {
    let mut env = vec![("SIM_SPEED", "1")];
    env.extend(sparkgate_tests::load::FAST_AUTO_POLICY);
    let gw = TestGateway::builder(SIM).envs(&env).start();
    sparkgate_tests::load::assert_auto_round_trip(
        &gw,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "ignore_eos": true}),
    );
}
