//! Operator speculation-mode switches through `/admin/spec` and `sparkgate spec`: drain, restart
//! into the mode with its own MAX_NUM_SEQS, admission capacity following; bad input refused in
//! the error envelope.

use serde_json::json;
use sparkgate_tests::harness::{binary_next_to, post_json, request, Gateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const AUTH: (&str, &str) = ("Authorization", "Bearer t0ken");

fn sparkgate() -> String {
    binary_next_to(SIM, "sparkgate")
}

#[test]
fn an_operator_switch_restarts_into_the_mode_with_its_capacity() {
    let logs = tempfile::tempdir().unwrap();
    let gw = Gateway::supervise(
        &sparkgate(),
        SIM,
        "deepseek-v4.1-flash",
        logs.path(),
        &[("SIM_SPEED", "1")],
    );
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
    let out = std::process::Command::new(sparkgate())
        .args(["spec", "none"])
        .env("PORT", gw.addr.port().to_string())
        .env("ADMIN_TOKEN", "t0ken")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("\"switching\":true"), "{text}");
    let done = running.join().unwrap();
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.json()["usage"]["completion_tokens"], 40);

    let s = gw.wait_status("ready in mode none", |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == 2
    });
    assert_eq!(s["supervisor"]["mode"], "none");
    assert_eq!(s["supervisor"]["max_num_seqs"], 4);
    assert_eq!(s["mode"], "none");
    assert_eq!(s["admission"]["capacity"], 4);
    let args = |epoch: u32| {
        let log = std::fs::read_to_string(logs.path().join(format!("epoch-{epoch}/rank0.log"))).unwrap();
        log.lines().find(|l| l.contains("non-default args")).unwrap().to_owned()
    };
    assert!(args(1).contains("speculative_config") && args(1).contains("\"max_num_seqs\":\"2\""));
    assert!(
        !args(2).contains("speculative_config") && args(2).contains("\"max_num_seqs\":\"4\""),
        "{}",
        args(2)
    );

    let again = request(gw.addr, "POST", "/admin/spec", &json_body, b"{\"mode\": \"none\"}");
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["switching"], false);
    let out = std::process::Command::new(sparkgate())
        .args(["spec"])
        .env("PORT", gw.addr.port().to_string())
        .env("ADMIN_TOKEN", "t0ken")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mode      none (policy fixed)"), "{text}");
    assert!(text.contains("dspark  max_num_seqs 2"), "{text}");
}

/// vLLM's running-request gauge on rank 0, read from the upstream the gateway proxies to.
fn running_on_rank0(gw: &Gateway) -> f64 {
    let url = gw.status()["upstream_url"].as_str().unwrap().to_owned();
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let text = request(addr, "GET", "/metrics", &[], b"").text();
    text.lines()
        .filter(|l| l.starts_with("vllm:num_requests_running"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn auto_switches_to_none_under_wide_load_and_back_with_nothing_lost() {
    let logs = tempfile::tempdir().unwrap();
    // Settings scaled down from minutes to seconds; the rule is the same.
    let gw = Gateway::supervise(
        &sparkgate(),
        SIM,
        "deepseek-v4.1-flash",
        logs.path(),
        &[
            ("SIM_SPEED", "1"),
            ("SPEC_POLICY", "auto"),
            ("SPEC_RESTART_S", "0.5"),
            ("SPEC_MIN_DWELL_S", "3"),
            ("SPEC_HOLD_S", "1"),
            ("SPEC_MARGIN", "1"),
            ("SPEC_RATE_TAU_S", "2"),
        ],
    );
    let stop_wide = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_all = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (addr, stop_wide, stop_all) = (gw.addr, stop_wide.clone(), stop_all.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                let stopped = || {
                    stop_all.load(std::sync::atomic::Ordering::SeqCst)
                        || (i > 0 && stop_wide.load(std::sync::atomic::Ordering::SeqCst))
                };
                while !stopped() {
                    let r = post_json(
                        addr,
                        "/v1/chat/completions",
                        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "ignore_eos": true}),
                    );
                    statuses.push((r.status, r.text()));
                }
                statuses
            })
        })
        .collect();
    let wide = gw.wait_status("switched to none", |s| {
        s["supervisor"]["mode"] == "none" && s["supervisor"]["state"] == "ready" && s["admission"]["capacity"] == 4
    });
    assert_eq!(wide["supervisor"]["max_num_seqs"], 4);
    let mut saw_four = false;
    for _ in 0..200 {
        if running_on_rank0(&gw) >= 4.0 {
            saw_four = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(saw_four, "the simulator ran 4 requests at once in mode none");
    let spec = request(gw.addr, "GET", "/admin/spec", &[], b"").json();
    assert_eq!(spec["policy"], "auto");
    let taken: Vec<_> = spec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["taken"] == true)
        .collect();
    assert_eq!(taken.len(), 1, "{spec}");
    assert_eq!(taken[0]["to"], "none");
    assert!(taken[0]["gain_tokens"].as_f64().unwrap() >= taken[0]["cost_tokens"].as_f64().unwrap());

    stop_wide.store(true, std::sync::atomic::Ordering::SeqCst);
    gw.wait_status("switched back to dspark", |s| {
        s["supervisor"]["mode"] == "dspark" && s["supervisor"]["state"] == "ready" && s["admission"]["capacity"] == 2
    });
    stop_all.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for c in clients {
        for (status, text) in c.join().unwrap() {
            total += 1;
            assert_eq!(status, 200, "a request failed across the switches: {text}");
        }
    }
    assert!(total > 10, "{total}");
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("sparkgate_spec_decisions_total{to=\"none\",taken=\"true\"} 1"),
        "{metrics}"
    );
    let s = gw.status();
    assert_eq!(s["supervisor"]["epoch"], 3, "two switches, nothing else restarted");
}
