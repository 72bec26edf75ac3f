//! Named keys and exact usage (docs/keys.md): a mixed run of 1 000 requests from three named keys
//! over chat, completions, Responses and Anthropic Messages, streamed and whole, some streams cut
//! by their client, is counted in `/admin/usage` token for token as the clients received it —
//! the same after a gateway restart — and no key appears in the logs, metrics, status, usage or
//! the CLI's table.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::test_gateway::TestGateway;

mod common;
use common::{DS, SIM};

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
/// The model alias the cut streams are sent under, so their usage has rows of its own.
const CUT_MODEL: &str = "cut-model";
const KEYS: [(&str, &str); 3] = [
    ("alice", "sk-alice-0001"),
    ("bob", "sk-bob-0002"),
    ("carol", "sk-carol-0003"),
];
const REQUESTS: usize = 1000;
/// Every this many requests, one is a chat stream its client leaves after three events.
const CUT_EVERY: usize = 25;
const CUT_PROMPT: &str = "Count slowly from one to a thousand.";

/// What the clients of one key received.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sums {
    requests: u64,
    prompt: u64,
    completion: u64,
}

/// Prompt and completion tokens of a usage object under either API's names.
fn counts(u: &Value) -> (Option<u64>, Option<u64>) {
    let n = |a: &str, b: &str| u[a].as_u64().or_else(|| u[b].as_u64());
    (
        n("prompt_tokens", "input_tokens"),
        n("completion_tokens", "output_tokens"),
    )
}

/// The usage a client received in a stream: the last count of each kind its events gave.
fn streamed_usage(body: &[u8]) -> (u64, u64) {
    let (mut p, mut c) = (None, None);
    for e in sparkgate_tests::sse::events(body) {
        let Ok(v) = serde_json::from_str::<Value>(&e.data) else {
            continue;
        };
        for u in [&v["usage"], &v["response"]["usage"], &v["message"]["usage"]] {
            let (up, uc) = counts(u);
            p = up.or(p);
            c = uc.or(c);
        }
    }
    (p.expect("a prompt count"), c.expect("a completion count"))
}

/// One request of the run: its route, body and whether it streams.
fn body(i: usize) -> (&'static str, Value, bool) {
    let stream = i % 2 == 1;
    let text = format!("Request {i}: say something short about the number {}.", i % 17);
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 6 + i % 5, "stream": stream});
    match (i / 2) % 4 {
        0 => {
            let mut b = chat;
            if stream {
                b["stream_options"] = json!({"include_usage": true});
            }
            ("/v1/chat/completions", b, stream)
        }
        1 => {
            let mut b = json!({"model": MODEL, "prompt": text, "max_tokens": 6 + i % 5, "stream": stream});
            if stream {
                b["stream_options"] = json!({"include_usage": true});
            }
            ("/v1/completions", b, stream)
        }
        2 => (
            "/v1/responses",
            json!({"model": MODEL, "input": text, "max_output_tokens": 16 + i % 5, "stream": stream}),
            stream,
        ),
        _ => (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 6 + i % 5, "messages": [{"role": "user", "content": text}], "stream": stream}),
            stream,
        ),
    }
}

fn auth(key: &str) -> String {
    format!("Bearer {key}")
}

/// Sends request `i` with `key`; what its client received.
fn send(gw: &Gateway, i: usize, key: &str) -> (u64, u64) {
    let (path, b, stream) = body(i);
    let bearer = auth(key);
    let headers = [("Content-Type", "application/json"), ("Authorization", bearer.as_str())];
    if stream {
        let mut s = Streaming::open(gw.addr, "POST", path, &headers, b.to_string().as_bytes());
        assert_eq!(s.status, 200, "{path} {b}");
        return streamed_usage(&s.read_all());
    }
    let r = request(gw.addr, "POST", path, &headers, b.to_string().as_bytes());
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    let (p, c) = counts(&r.json()["usage"]);
    (p.expect("prompt"), c.expect("completion"))
}

/// A chat stream under CUT_MODEL its client leaves after three events; the events it saw.
fn cut(gw: &Gateway, key: &str) -> usize {
    let b = json!({"model": CUT_MODEL, "messages": [{"role": "user", "content": CUT_PROMPT}], "max_tokens": 3000, "stream": true});
    let bearer = auth(key);
    let headers = [("Content-Type", "application/json"), ("Authorization", bearer.as_str())];
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        b.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200);
    let mut got = Vec::new();
    loop {
        got.extend(s.next_chunk().expect("the stream goes on"));
        let seen = sparkgate_tests::sse::events(&got).len();
        if seen >= 3 {
            return seen;
        }
    }
}

fn usage(gw: &Gateway, window: &str) -> Value {
    let r = request(gw.addr, "GET", &format!("/admin/usage?window={window}"), &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The rows of `key` under `model`, summed over routes.
fn rows_of(u: &Value, key: &str, model: &str, field: &str) -> u64 {
    u["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["key"] == key && r["model"] == model)
        .map(|r| r[field].as_u64().unwrap())
        .sum()
}

fn start(store: &std::path::Path) -> Gateway {
    let keys: Vec<String> = KEYS.iter().map(|(n, k)| format!("{n}={k}")).collect();
    TestGateway::builder(SIM)
        .upstream(SIM_ADDR.lock().unwrap().expect("the sim runs"))
        .env("API_KEYS", &keys.join(","))
        .env("MODEL_ALIASES", CUT_MODEL)
        .env("STORE_URL", &store.display().to_string())
        .start()
}

static SIM_ADDR: Mutex<Option<std::net::SocketAddr>> = Mutex::new(None);

#[test]
fn a_mixed_run_is_counted_as_the_clients_received_it_and_the_counts_survive_a_restart() {
    // Paced (a hundred times the guides' speeds), so a cut stream is cut before it ends.
    let sim = sparkgate_tests::harness::Sim::start(SIM, DS, &[("SIM_SPEED", "100")]);
    *SIM_ADDR.lock().unwrap() = Some(sim.addr());
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("state.sqlite");
    let gw = start(&store);
    // The cut prompt's size, from a whole answer to the same conversation.
    let probe = json!({"model": MODEL, "messages": [{"role": "user", "content": CUT_PROMPT}], "max_tokens": 1});
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-alice-0001"),
    ];
    let probed = request(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        probe.to_string().as_bytes(),
    )
    .json();
    let cut_prompt = probed["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut sums = [Sums::default(); 3];
    sums[0] = Sums {
        requests: 1,
        prompt: cut_prompt,
        completion: probed["usage"]["completion_tokens"].as_u64().unwrap(),
    };
    let (sums, seen) = run(&gw, sums);
    let cuts = REQUESTS / CUT_EVERY;
    // The server sees the cuts when it next writes: wait until all are counted.
    let mut u = usage(&gw, "all");
    for _ in 0..200 {
        if u["total"]["disconnects"] == cuts as u64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        u = usage(&gw, "all");
    }
    assert_eq!(u["total"]["disconnects"], cuts as u64, "{u:#}");
    for (i, (name, _)) in KEYS.iter().enumerate() {
        let got = Sums {
            requests: rows_of(&u, name, MODEL, "requests"),
            prompt: rows_of(&u, name, MODEL, "prompt"),
            completion: rows_of(&u, name, MODEL, "completion"),
        };
        assert_eq!(got, sums[i], "{name}: the usage is what its clients received");
        assert_eq!(rows_of(&u, name, MODEL, "errors"), 0);
    }
    let cut_requests: u64 = KEYS.iter().map(|(n, _)| rows_of(&u, n, CUT_MODEL, "requests")).sum();
    let cut_prompts: u64 = KEYS.iter().map(|(n, _)| rows_of(&u, n, CUT_MODEL, "prompt")).sum();
    let cut_completions: u64 = KEYS.iter().map(|(n, _)| rows_of(&u, n, CUT_MODEL, "completion")).sum();
    assert_eq!(cut_requests, cuts as u64);
    assert_eq!(
        cut_prompts,
        cuts as u64 * cut_prompt,
        "a cut stream's prompt is counted whole"
    );
    // Each cut stream's first event is the role chunk, which carries no token.
    assert!(
        cut_completions >= (seen - cuts) as u64 && cut_completions < cuts as u64 * 3000,
        "a cut stream counts what was generated: {cut_completions} (the clients saw {seen} events)"
    );
    assert_eq!(u["total"]["requests"], (REQUESTS + 1) as u64);
    let hour = usage(&gw, "hour");
    assert_eq!(hour["total"], u["total"], "everything ran within the hour");
    let alice = request(gw.addr, "GET", "/admin/usage?window=all&key=alice", &[], b"").json();
    assert!(alice["rows"].as_array().unwrap().iter().all(|r| r["key"] == "alice"));
    let metrics = request(
        gw.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer sk-bob-0002")],
        b"",
    )
    .text();
    let alice_chats = metrics
        .lines()
        .find(|l| {
            l.starts_with("sparkgate_key_requests_total{")
                && l.contains("key=\"alice\"")
                && l.contains("route=\"chat\"")
                && l.contains("outcome=\"completed\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(!alice_chats.ends_with(" 0"), "{alice_chats}");
    no_key_shown(&gw);
    // A restart: the counts are the store's.
    gw.proc.terminate();
    drop(gw);
    let again = start(&store);
    let after = usage(&again, "all");
    assert_eq!(after["rows"], u["rows"], "the same rows after a restart");
    assert_eq!(after["total"], u["total"]);
    no_key_shown(&again);
}

/// The run: REQUESTS requests over eight client threads; what each key's clients received,
/// and the events the cut streams' clients saw.
fn run(gw: &Gateway, mut sums: [Sums; 3]) -> ([Sums; 3], usize) {
    let totals = Mutex::new((sums, 0usize));
    std::thread::scope(|s| {
        for t in 0..8 {
            let totals = &totals;
            s.spawn(move || {
                for i in (t..REQUESTS).step_by(8) {
                    let k = i % 3;
                    let key = KEYS[k].1;
                    if i % CUT_EVERY == 7 {
                        let seen = cut(gw, key);
                        totals.lock().unwrap().1 += seen;
                        continue;
                    }
                    let (p, c) = send(gw, i, key);
                    let mut t = totals.lock().unwrap();
                    t.0[k].requests += 1;
                    t.0[k].prompt += p;
                    t.0[k].completion += c;
                }
            });
        }
    });
    let (got, seen) = totals.into_inner().unwrap();
    for (s, g) in sums.iter_mut().zip(got) {
        *s = g;
    }
    (sums, seen)
}

/// No key in the gateway's log, metrics, status, usage or `sparkgate usage`; the names are there.
fn no_key_shown(gw: &Gateway) {
    let metrics = request(
        gw.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer sk-bob-0002")],
        b"",
    )
    .text();
    assert!(
        metrics.contains("key=\"alice\""),
        "the names label the key families: {metrics}"
    );
    let status = request(gw.addr, "GET", "/admin/status", &[], b"").text();
    let usage = request(gw.addr, "GET", "/admin/usage?window=all", &[], b"").text();
    let cli = std::process::Command::new(sparkgate_tests::test_gateway::sparkgate_bin(SIM))
        .args(["usage", "--window", "all", "--url", &format!("http://{}", gw.addr)])
        .env("HEAD_IP", "127.0.0.1")
        .env("WORKER_IP", "127.0.0.2")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&cli.stdout).into_owned();
    assert!(cli.status.success(), "{table}{}", String::from_utf8_lossy(&cli.stderr));
    assert!(table.contains("alice") && table.contains("total"), "{table}");
    let log = gw.proc.log().join("\n");
    for (name, key) in KEYS {
        for (what, text) in [
            ("metrics", &metrics),
            ("status", &status),
            ("usage", &usage),
            ("cli", &table),
            ("log", &log),
        ] {
            assert!(!text.contains(key), "{name}'s key in the {what}");
            assert!(!text.contains(&key[3..]), "part of {name}'s key in the {what}");
        }
    }
}
