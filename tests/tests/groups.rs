//! Several rank groups behind one gateway (GROUPS_FILE): each group supervised on its own, one
//! shared queue in front of them, a lost rank restarting its group only while the other keeps
//! serving, `restart --group`, prefix affinity against least-loaded routing, and a session the
//! client names (SESSION_HEADER, Anthropic `metadata.user_id`) kept on its group.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::hosts::kill_pid;
use sparkgate_tests::http::post_json;
use sparkgate_tests::test_gateway::{groups_file, sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// The gateway over groups `a` and `b` with `env` besides GROUPS_FILE, once both serve (its
/// directory lives as long as it), and the status that saw them ready.
fn two_groups(env: &[(&str, &str)]) -> (tempfile::TempDir, Arc<Gateway>, Value) {
    let dir = tempfile::tempdir().unwrap();
    let file = groups_file(dir.path(), &["a", "b"]);
    let mut full = vec![("GROUPS_FILE", file.as_str())];
    full.extend_from_slice(env);
    let gw = TestGateway::builder(SIM).logs(dir.path()).envs(&full).start_unready();
    let ready = gw.wait_status("both groups ready", both_ready);
    (dir, Arc::new(gw), ready)
}

fn group<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no group {name}: {status}"))
}

fn both_ready(s: &Value) -> bool {
    ["a", "b"].iter().all(|g| group(s, g)["upstream"]["state"] == "ready")
}

/// One answered request: its status and the group that answered.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    group: String,
    body: String,
}

fn ask(gw: &Gateway, messages: Value, max_tokens: u32) -> Answer {
    let r = post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": max_tokens, "ignore_eos": true}),
    );
    Answer {
        status: r.status,
        group: r.header("x-sparkgate-group").unwrap_or_default().to_owned(),
        body: r.text(),
    }
}

#[test]
fn a_killed_rank_restarts_its_group_only_and_no_request_fails() {
    let (_dir, gw, ready) = two_groups(&[("SIM_SPEED", "4")]);
    assert_eq!(
        ready["admission"]["capacity"], 4,
        "two groups of MAX_NUM_SEQS 2: {ready}"
    );
    // Four clients in a loop keep both groups busy through the restart.
    let (stop, answers) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (gw, stop, answers) = (gw.clone(), stop.clone(), answers.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let a = ask(&gw, json!([{"role": "user", "content": format!("client {i}")}]), 40);
                    answers.lock().unwrap().push(a);
                }
            })
        })
        .collect();
    gw.wait_status("both groups busy", |s| {
        ["a", "b"].iter().all(|g| group(s, g)["in_flight"].as_u64() > Some(0))
    });
    let before = gw.status();
    let pid = group(&before, "a")["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rank"] == 1)
        .unwrap()["pid"]
        .as_u64()
        .unwrap();
    kill_pid(pid);
    gw.wait_status("group a restarted", |s| {
        group(s, "a")["supervisor"]["epoch"] == 2 && group(s, "a")["upstream"]["state"] == "ready"
    });
    let served_before = answers.lock().unwrap().len();
    gw.wait_status("more answers after the restart", |_| {
        answers.lock().unwrap().len() > served_before + 8
    });
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let after = gw.status();
    assert_eq!(
        group(&after, "b")["supervisor"]["epoch"],
        1,
        "group b never restarted: {after}"
    );
    let answers = answers.lock().unwrap();
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        answers.len()
    );
    for g in ["a", "b"] {
        assert!(
            answers.iter().any(|a| a.group == g),
            "group {g} answered some: {answers:?}"
        );
    }
}

#[test]
fn restart_group_restarts_that_group_while_the_other_serves() {
    let (_dir, gw, _) = two_groups(&[]);
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
    let metrics = sparkgate_tests::http::request(gw.addr, "GET", "/metrics", &[], b"").text();
    for expected in [
        "sparkgate_group_requests_total{group=\"a\"} 1",
        "sparkgate_group_open{group=\"b\"} 1",
        "sparkgate_upstream_up{group=\"a\"} 1",
        "vllm:num_requests_running{group=\"b\",",
    ] {
        assert!(metrics.contains(expected), "{expected}\n{metrics}");
    }
    assert_eq!(
        metrics.matches("# TYPE vllm:num_requests_running gauge").count(),
        1,
        "one family, both groups"
    );
    let out = std::process::Command::new(sparkgate_bin(SIM))
        .args(["restart", "--group", "b", "--url", &format!("http://{}", gw.addr)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let s = gw.status();
    assert_eq!(group(&s, "b")["supervisor"]["epoch"], 2, "{s}");
    assert_eq!(group(&s, "a")["supervisor"]["epoch"], 1, "{s}");
    let unknown = std::process::Command::new(sparkgate_bin(SIM))
        .args(["restart", "--group", "c", "--url", &format!("http://{}", gw.addr)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        !unknown.status.success() && text.contains("group \"c\" is not one of: a, b"),
        "{text}"
    );
    let status = std::process::Command::new(sparkgate_bin(SIM))
        .args(["status", "--url", &format!("http://{}", gw.addr)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("group a    ready") && text.contains("group b    ready"),
        "{text}"
    );
}

/// Conversation X's second turn after another conversation took a slot of X's group: affinity
/// keeps X on its group (whose prefix cache holds X), least-loaded moves it to the idle one.
fn second_turn(routing: &str) -> (Answer, Answer) {
    let (_dir, gw, _) = two_groups(&[("GROUP_ROUTING", routing), ("SIM_SPEED", "1")]);
    let system = "You are a careful assistant. ".repeat(40);
    let first = json!([{"role": "system", "content": system}, {"role": "user", "content": "Name a prime."}]);
    let one = ask(&gw, first.clone(), 4);
    // A long answer on X's group (both idle: the first in order) holds one of its two slots.
    let busy = {
        let gw = gw.clone();
        std::thread::spawn(move || ask(&gw, json!([{"role": "user", "content": "Count slowly."}]), 200))
    };
    gw.wait_status("the other conversation runs", |s| {
        group(s, &one.group)["in_flight"] == 1
    });
    let mut history = first.as_array().unwrap().clone();
    history.push(json!({"role": "assistant", "content": "7"}));
    history.push(json!({"role": "user", "content": "Another one."}));
    let two = ask(&gw, Value::Array(history), 4);
    busy.join().unwrap();
    (one, two)
}

#[test]
fn affinity_keeps_a_conversation_on_its_group_and_its_prefix_cache() {
    let (one, two) = second_turn("affinity");
    assert_eq!((one.status, two.status), (200, 200), "{one:?} {two:?}");
    assert_eq!(two.group, one.group, "affinity: the same group");
    let usage: Value = serde_json::from_str(&two.body).unwrap();
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "the second turn reused the first's prefix: {usage}"
    );
    let (one, two) = second_turn("least-loaded");
    assert_ne!(two.group, one.group, "least-loaded: the idle group");
    let usage: Value = serde_json::from_str(&two.body).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{usage}");
}

#[test]
fn the_demo_runs_two_groups() {
    let proc = sparkgate_tests::harness::Proc::spawn(
        &sparkgate_bin(SIM),
        &["demo", "--groups", "2", "--port", "0"].map(String::from),
        &[("SIM_LOAD_SECONDS", "0"), ("SIM_SPEED", "instant")],
    );
    let gw = Gateway::listening(proc);
    let s = gw.wait_status("both demo groups ready", |s| {
        ["g1", "g2"].iter().all(|g| group(s, g)["upstream"]["state"] == "ready")
    });
    assert_eq!(s["groups"].as_array().unwrap().len(), 2);
    assert_eq!(gw.smoke()["choices"][0]["message"]["content"], "323");
}

/// Conversation X's second turn while X's group (two slots each) is full with long answers and
/// the other group runs one, and a bystander that comes after it: the answers, the order they
/// ended in, and the gateway's metrics.
fn second_turn_into_a_full_group(wait_ms: &str) -> (Answer, Answer, Answer, Vec<&'static str>, String) {
    let env = [("MAX_NUM_SEQS", "2"), ("AFFINITY_WAIT_MS", wait_ms), ("SIM_SPEED", "2")];
    let (_dir, gw, _) = two_groups(&env);
    let system = "You are a careful assistant. ".repeat(40);
    let first = json!([{"role": "system", "content": system}, {"role": "user", "content": "Name a prime."}]);
    let one = ask(&gw, first.clone(), 4);
    let other = if one.group == "a" { "b" } else { "a" };
    let ended = Arc::new(Mutex::new(Vec::new()));
    let spawn = |name: &'static str, messages: Value, max_tokens: u32| {
        let (gw, ended) = (gw.clone(), ended.clone());
        std::thread::spawn(move || {
            let a = ask(&gw, messages, max_tokens);
            ended.lock().unwrap().push(name);
            a
        })
    };
    // Long answers, each to the group with the most room (ties: the first in order, X's): two
    // on X's group, one on the other, which is then busy but not full (and stays busy longest:
    // a group that sits idle is not left idle for a waiting turn).
    let mut busy = Vec::new();
    for (i, (on_x, on_other, tokens)) in [(1, 0, 100), (1, 1, 400), (2, 1, 100)].into_iter().enumerate() {
        let prompt = json!([{"role": "user", "content": format!("Count slowly, {i}.")}]);
        busy.push(spawn("busy", prompt, tokens));
        gw.wait_status("the long answer runs", |s| {
            group(s, &one.group)["in_flight"] == on_x && group(s, other)["in_flight"] == on_other
        });
    }
    let mut history = first.as_array().unwrap().clone();
    history.push(json!({"role": "assistant", "content": "7"}));
    history.push(json!({"role": "user", "content": "Another one."}));
    let two = spawn("second turn", Value::Array(history), 4);
    if wait_ms != "0" {
        gw.wait_status("the second turn waits for X's group", |s| s["admission"]["queued"] == 1);
    }
    let bystander = spawn("bystander", json!([{"role": "user", "content": "Hello."}]), 4);
    let (bystander, two) = (bystander.join().unwrap(), two.join().unwrap());
    for b in busy {
        b.join().unwrap();
    }
    let order = ended.lock().unwrap().clone();
    let metrics = sparkgate_tests::http::request(gw.addr, "GET", "/metrics", &[], b"").text();
    (one, two, bystander, order, metrics)
}

#[test]
fn a_turn_waits_for_its_full_group_while_a_bystander_takes_a_free_slot_elsewhere() {
    let (one, two, bystander, order, metrics) = second_turn_into_a_full_group("600000");
    assert_eq!((one.status, two.status, bystander.status), (200, 200, 200));
    assert_eq!(two.group, one.group, "the second turn waited for its group");
    let usage: Value = serde_json::from_str(&two.body).unwrap();
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "and was served from its prefix cache: {usage}"
    );
    assert_ne!(
        bystander.group, one.group,
        "the idle group's slot went to the bystander"
    );
    let at = |name: &str| order.iter().position(|n| *n == name).unwrap();
    assert!(
        at("bystander") < at("busy") && at("busy") < at("second turn"),
        "the bystander did not wait behind the waiting turn; the turn ran once a long answer \
         left its group: {order:?}"
    );
    for counted in [
        "sparkgate_affinity_waits_total{outcome=\"home\"} 1",
        "sparkgate_affinity_waits_total{outcome=\"elsewhere\"} 0",
    ] {
        assert!(metrics.contains(counted), "{counted}\n{metrics}");
    }
    // AFFINITY_WAIT_MS=0: the turn takes the idle group at once, without its prefix.
    let (one, two, _, _, _) = second_turn_into_a_full_group("0");
    assert_ne!(two.group, one.group, "{one:?} {two:?}");
    let usage: Value = serde_json::from_str(&two.body).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{usage}");
}

fn ask_with(gw: &Gateway, path: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    let r = sparkgate_tests::http::request(gw.addr, "POST", path, &all, body.to_string().as_bytes());
    Answer {
        status: r.status,
        group: r.header("x-sparkgate-group").unwrap_or_default().to_owned(),
        body: r.text(),
    }
}

#[test]
fn a_named_session_stays_on_its_group_whatever_its_prefix() {
    let (_dir, gw, _) = two_groups(&[("SIM_SPEED", "1")]);
    let chat = |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 4});
    let first = ask_with(
        &gw,
        "/v1/chat/completions",
        &chat("Name a prime."),
        &[("x-session-id", "s-1")],
    );
    let claude = json!({"model": "DeepSeek-v4.1-Flash-EXL3", "max_tokens": 4, "metadata": {"user_id": "dev-7"},
        "messages": [{"role": "user", "content": "Name a colour."}]});
    let anthropic = ask_with(&gw, "/v1/messages", &claude, &[]);
    assert_eq!((first.status, anthropic.status), (200, 200), "{first:?} {anthropic:?}");
    assert_eq!(anthropic.group, first.group, "both idle: the first group in order");
    // A long answer holds one of the session's group's slots: the other group has the most room.
    let busy = {
        let gw = gw.clone();
        let group = first.group.clone();
        std::thread::spawn(move || {
            let long = json!({"messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 200, "ignore_eos": true});
            let a = ask_with(&gw, "/v1/chat/completions", &long, &[("x-session-id", "s-1")]);
            assert_eq!(a.group, group);
        })
    };
    gw.wait_status("the session's long answer runs", |s| {
        group(s, &first.group)["in_flight"] == 1
    });
    let next = ask_with(
        &gw,
        "/v1/chat/completions",
        &chat("Something else entirely."),
        &[("x-session-id", "s-1")],
    );
    assert_eq!(next.group, first.group, "the session's group, though the other is idle");
    let stranger = ask_with(&gw, "/v1/chat/completions", &chat("Something else entirely."), &[]);
    assert_ne!(
        stranger.group, first.group,
        "without a session: the group with the most room"
    );
    let again = json!({"model": "DeepSeek-v4.1-Flash-EXL3", "max_tokens": 4, "metadata": {"user_id": "dev-7"},
        "messages": [{"role": "user", "content": "A new topic."}]});
    assert_eq!(
        ask_with(&gw, "/v1/messages", &again, &[]).group,
        anthropic.group,
        "metadata.user_id names a session"
    );
    busy.join().unwrap();
}
