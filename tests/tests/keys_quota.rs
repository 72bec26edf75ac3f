//! Per-key quotas and the keys file (docs/keys.md): a key over its tokens per minute is answered
//! 429 with Retry-After in the route's own envelope (chat: OpenAI's, Messages: Anthropic's)
//! before it takes a slot, and served again once the window passed; shadow mode serves it and
//! counts the same refusals; a key over its sequences is refused while one runs. API_KEYS_FILE
//! holds named keys (one as its SHA-256), read again on SIGHUP and when it changes, a broken
//! file leaving the keys in place.

use std::time::Duration;

use serde_json::{json, Value};
use sha2::Digest as _;
use sparkgate_tests::harness::{early_in_a_minute, Gateway, Sim};
use sparkgate_tests::http::{request, HttpResponse, Streaming};
use sparkgate_tests::test_gateway::TestGateway;

mod common;
use common::{DS, SIM};

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

fn chat(gw: &Gateway, key: &str) -> HttpResponse {
    let b = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 5});
    let bearer = format!("Bearer {key}");
    let headers = [("Content-Type", "application/json"), ("Authorization", bearer.as_str())];
    request(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        b.to_string().as_bytes(),
    )
}

fn messages(gw: &Gateway, key: &str) -> HttpResponse {
    let b = json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "Say hello."}]});
    let headers = [("Content-Type", "application/json"), ("x-api-key", key)];
    request(gw.addr, "POST", "/v1/messages", &headers, b.to_string().as_bytes())
}

fn usage_of(gw: &Gateway, key: &str) -> Value {
    request(
        gw.addr,
        "GET",
        &format!("/admin/usage?window=today&key={key}"),
        &[],
        b"",
    )
    .json()["total"]
        .clone()
}

fn quota_gateway(sim: &Sim, dir: &std::path::Path, mode: &str) -> Gateway {
    let file = dir.join("keys");
    std::fs::write(&file, "alice sk-quota-alice tokens_per_minute=30\nbob sk-quota-bob\n").unwrap();
    TestGateway::builder(SIM)
        .upstream(sim.addr())
        .env("API_KEYS_FILE", &file.display().to_string())
        .env("QUOTA_MODE", mode)
        .env("STORE_URL", &dir.join("state.sqlite").display().to_string())
        .start()
}

#[test]
fn a_key_over_its_tokens_per_minute_is_refused_in_each_familys_envelope_until_the_window_passes() {
    let sim = Sim::start(SIM, DS, &[]);
    let dir = tempfile::tempdir().unwrap();
    let gw = quota_gateway(&sim, dir.path(), "enforce");
    early_in_a_minute();
    assert_eq!(
        chat(&gw, "sk-quota-alice").status,
        200,
        "an empty window takes a request"
    );
    let refused = chat(&gw, "sk-quota-alice");
    assert_eq!(refused.status, 429, "{}", refused.text());
    let body = refused.json();
    assert_eq!(body["error"]["code"], 429, "vLLM's OpenAI envelope: {body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("tokens_per_minute"),
        "{body}"
    );
    let retry: u64 = refused.header("retry-after").expect("Retry-After").parse().unwrap();
    // The request's second leaves the sliding minute 61 s after it began.
    assert!((1..=61).contains(&retry), "{retry}");
    let anthropic = messages(&gw, "sk-quota-alice");
    assert_eq!(anthropic.status, 429);
    assert_eq!(anthropic.json()["type"], "error", "{}", anthropic.text());
    assert_eq!(anthropic.json()["error"]["type"], "rate_limit_error");
    assert!(anthropic.header("retry-after").is_some());
    assert_eq!(chat(&gw, "sk-quota-bob").status, 200, "another key is not held back");
    let alice = usage_of(&gw, "alice");
    assert_eq!(
        (alice["requests"].as_u64(), alice["refusals"].as_u64()),
        (Some(3), Some(2)),
        "{alice}"
    );
    std::thread::sleep(Duration::from_secs(retry));
    assert_eq!(
        chat(&gw, "sk-quota-alice").status,
        200,
        "served again once the window slid past its first request"
    );
    gw.proc.wait_for("quota: refused");
}

/// Waits until the wall clock is 48 to 51 s into a minute.
fn late_in_a_minute() {
    loop {
        let s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60;
        if (48..52).contains(&s) {
            return;
        }
        std::thread::sleep(Duration::from_secs((108 - s) % 60));
    }
}

#[test]
fn a_key_sending_across_a_minute_boundary_never_spends_more_than_its_quota_in_sixty_seconds() {
    let sim = Sim::start(SIM, DS, &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "carol sk-quota-carol tokens_per_minute=1000\n").unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .env("API_KEYS_FILE", &file.display().to_string())
        .env("STORE_URL", &dir.path().join("state.sqlite").display().to_string())
        .start();
    let b = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 100});
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-quota-carol"),
    ];
    late_in_a_minute();
    // Twenty seconds across the minute's end, a request every 100 ms: all of it within one
    // sliding minute, so all of it within the quota (a wall-clock minute would allow it twice).
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let (mut served, mut refused, mut tokens) = (0, 0, 0);
    while std::time::Instant::now() < until {
        let r = request(
            gw.addr,
            "POST",
            "/v1/chat/completions",
            &headers,
            b.to_string().as_bytes(),
        );
        match r.status {
            200 => {
                let u = &r.json()["usage"];
                served += 1;
                tokens += u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap();
            }
            429 => {
                refused += 1;
                let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
                assert!((1..=61).contains(&retry), "{retry}");
            }
            other => panic!("{other}: {}", r.text()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served > 0 && refused > 0, "{served} served, {refused} refused");
    // The usage rows (the store's, by minute: both minutes of the run) say the same.
    let rows = request(gw.addr, "GET", "/admin/usage?window=hour&key=carol", &[], b"").json();
    let t = &rows["total"];
    let stored = t["prompt"].as_u64().unwrap() + t["completion"].as_u64().unwrap();
    assert_eq!(stored, tokens, "{rows}");
    assert!(
        tokens <= 1_000,
        "{tokens} tokens within 60 s ({served} served, {refused} refused)"
    );
}

#[test]
fn shadow_mode_serves_what_it_would_refuse_and_counts_the_same_refusals() {
    let sim = Sim::start(SIM, DS, &[]);
    let dir = tempfile::tempdir().unwrap();
    let gw = quota_gateway(&sim, dir.path(), "shadow");
    early_in_a_minute();
    assert_eq!(chat(&gw, "sk-quota-alice").status, 200);
    assert_eq!(chat(&gw, "sk-quota-alice").status, 200, "shadow mode refuses nothing");
    assert_eq!(messages(&gw, "sk-quota-alice").status, 200);
    let alice = usage_of(&gw, "alice");
    assert_eq!(
        (alice["requests"].as_u64(), alice["refusals"].as_u64()),
        (Some(3), Some(2)),
        "{alice}"
    );
    let metrics = request(
        gw.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer sk-quota-bob")],
        b"",
    )
    .text();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("sparkgate_key_quota_refusals_total{")
                && l.contains("key=\"alice\"")
                && l.contains("tokens_per_minute")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.contains("mode=\"shadow\"") && line.ends_with(" 2"), "{line}");
    gw.proc.wait_for("quota (shadow): would have refused");
}

#[test]
fn a_key_at_its_sequences_is_refused_while_one_runs() {
    let sim = Sim::start(SIM, DS, &[("SIM_SPEED", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "solo sk-solo max_sequences=1\n").unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .env("API_KEYS_FILE", &file.display().to_string())
        .env("STORE_URL", &dir.path().join("state.sqlite").display().to_string())
        .start();
    let long = json!({"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 2000, "stream": true});
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-solo"),
    ];
    let mut running = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        long.to_string().as_bytes(),
    );
    assert_eq!(running.status, 200);
    running.next_chunk().expect("the stream runs");
    let second = chat(&gw, "sk-solo");
    assert_eq!(second.status, 429, "{}", second.text());
    assert!(second.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_sequences"));
    assert_eq!(second.header("retry-after"), Some("1"));
    drop(running);
    // Its sequence is free once the gateway saw the stream end.
    let mut status = 429;
    for _ in 0..100 {
        status = chat(&gw, "sk-solo").status;
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 200);
}

#[test]
fn the_keys_file_is_read_again_on_sighup_and_on_change_and_a_broken_one_keeps_the_keys() {
    let sim = Sim::start(SIM, DS, &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    let hashed: String = sha2::Sha256::digest(b"sk-hashed-ci")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(&file, format!("ci sha256:{hashed}\n")).unwrap();
    let gw = TestGateway::builder(SIM)
        .upstream(sim.addr())
        .env("API_KEYS", "ops=sk-env-ops")
        .env("API_KEYS_FILE", &file.display().to_string())
        .env("STORE_URL", &dir.path().join("state.sqlite").display().to_string())
        .start();
    assert_eq!(chat(&gw, "sk-hashed-ci").status, 200, "a key known by its SHA-256");
    assert_eq!(chat(&gw, "sk-env-ops").status, 200);
    assert_eq!(chat(&gw, "sk-new-dev").status, 401);
    // A connection opened before the reload keeps serving after it.
    let held = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Bearer sk-env-ops"),
        ],
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true})
            .to_string()
            .as_bytes(),
    );
    std::fs::write(&file, format!("ci sha256:{hashed}\ndev sk-new-dev weight=2\n")).unwrap();
    let reloaded = gw.proc.wait_for("API keys reloaded");
    assert!(
        reloaded.contains("dev") && !reloaded.contains("sk-new-dev"),
        "{reloaded}"
    );
    assert_eq!(chat(&gw, "sk-new-dev").status, 200, "a changed file is read again");
    assert_eq!(held.status, 200);
    std::fs::write(&file, "dev\n").unwrap();
    gw.proc.wait_for("API keys not reloaded");
    assert_eq!(
        chat(&gw, "sk-new-dev").status,
        200,
        "a broken file keeps the keys in place"
    );
    std::fs::write(&file, format!("ci sha256:{hashed}\n")).unwrap();
    let pid = gw.proc.pid().to_string();
    // The change is seen by the watcher or the signal, whichever comes first: both reload.
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let mut status = 200;
    for _ in 0..100 {
        status = chat(&gw, "sk-new-dev").status;
        if status == 401 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 401, "a key taken out of the file is refused");
    assert_eq!(chat(&gw, "sk-env-ops").status, 200, "API_KEYS stay");
    let log = gw.proc.log().join("\n");
    for key in ["sk-hashed-ci", "sk-env-ops", "sk-new-dev", hashed.as_str()] {
        assert!(!log.contains(key), "{key} in the log");
    }
}
