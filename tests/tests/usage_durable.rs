//! Usage is durable before an answer ends (docs/keys.md): a gateway SIGKILLed twice during 1 000
//! mixed requests from three keys (chat, completions, Responses and Anthropic Messages, streamed
//! and whole) loses no usage of an answer a client received whole. Each route's request is the
//! same every time, so every row's tokens are its requests times that route's one-request usage:
//! after the restarts `/admin/usage` holds, per key and route, at least every answer its clients
//! received whole and at most those plus the ones cut by a kill — exact to the token. On SQLite
//! and on a real PostgreSQL.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use sparkgate_tests::harness::{Gateway, Sim};
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::test_gateway::TestGateway;

mod common;
use common::{DS, SIM};

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const KEYS: [(&str, &str); 3] = [
    ("alice", "sk-alice-0001"),
    ("bob", "sk-bob-0002"),
    ("carol", "sk-carol-0003"),
];
const PROBE: (&str, &str) = ("probe", "sk-probe-0004");
const REQUESTS: usize = 1000;
/// The gateway is SIGKILLed the moment a client has received this many answers whole (by that
/// client's thread, so the last answer's row had no time to be written later).
const KILLS: [usize; 5] = [150, 300, 450, 600, 750];
const ROUTES: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];

/// Route `r`'s request, the same every time (its usage is too).
fn body(r: usize, stream: bool) -> Value {
    let text = "Say something short about durable usage records.";
    match r {
        0 => {
            json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "stream": stream})
        }
        1 => json!({"model": MODEL, "prompt": text, "max_tokens": 8, "stream": stream}),
        2 => json!({"model": MODEL, "input": text, "max_output_tokens": 16, "stream": stream}),
        _ => {
            json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}], "stream": stream})
        }
    }
}

/// The route's label in `/admin/usage`.
fn label(r: usize) -> &'static str {
    ["chat", "completions", "responses", "messages"][r]
}

/// Whether an answer arrived whole: a whole body with its status, or a stream up to its end.
fn sent(addr: SocketAddr, key: &str, r: usize, stream: bool) -> bool {
    let (key, b) = (format!("Bearer {key}"), body(r, stream).to_string());
    let attempt = std::thread::spawn(move || {
        let headers = [("Content-Type", "application/json"), ("Authorization", key.as_str())];
        if !stream {
            return request(addr, "POST", ROUTES[r], &headers, b.as_bytes()).status == 200;
        }
        let mut s = Streaming::open(addr, "POST", ROUTES[r], &headers, b.as_bytes());
        let text = String::from_utf8_lossy(&s.read_all()).into_owned();
        s.status == 200
            && [
                "data: [DONE]",
                "event: message_stop",
                "event: response.completed",
                "event: response.incomplete",
            ]
            .iter()
            .any(|end| text.contains(end))
    });
    // A kill mid-answer ends the client's thread with a read error: not received whole.
    attempt.join().unwrap_or(false)
}

fn start(store: &str, sim: SocketAddr) -> Gateway {
    let keys: Vec<String> = KEYS.iter().chain([&PROBE]).map(|(n, k)| format!("{n}={k}")).collect();
    TestGateway::builder(SIM)
        .upstream(sim)
        .env("API_KEYS", &keys.join(","))
        .env("STORE_URL", store)
        .start()
}

fn usage(addr: SocketAddr) -> Value {
    let r = request(addr, "GET", "/admin/usage?window=all", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The row of `key` on route `r`: requests, prompt and completion tokens.
fn row(u: &Value, key: &str, r: usize) -> [u64; 3] {
    u["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["key"] == key && x["route"] == label(r))
        .fold([0; 3], |acc, x| {
            [
                acc[0] + x["requests"].as_u64().unwrap(),
                acc[1] + x["prompt"].as_u64().unwrap(),
                acc[2] + x["completion"].as_u64().unwrap(),
            ]
        })
}

/// Counts by (key, route): received whole, and cut by a kill.
type Tally = HashMap<(usize, usize), (u64, u64)>;

fn run_with_kills(store: &str) {
    let sim = Sim::start(SIM, DS, &[("SIM_SPEED", "100")]);
    let gw = start(store, sim.addr());
    // One request of each route and kind under the probe key: the one-request usage.
    for (r, route) in ROUTES.iter().enumerate() {
        for stream in [false, true] {
            assert!(sent(gw.addr, PROBE.1, r, stream), "probe {} stream={stream}", route);
        }
    }
    let probe = usage(gw.addr);
    let unit: Vec<[u64; 3]> = (0..ROUTES.len()).map(|r| row(&probe, PROBE.0, r)).collect();
    for (r, u) in unit.iter().enumerate() {
        assert_eq!(u[0], 2, "{}: {probe:#}", ROUTES[r]);
        assert!(
            u[1] % 2 == 0 && u[2] % 2 == 0,
            "a route's usage is the same streamed or whole: {probe:#}"
        );
    }
    let addr = Arc::new(Mutex::new(gw.addr));
    let gw = Mutex::new(gw);
    let (next, whole) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let tally: Mutex<Tally> = Mutex::default();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= REQUESTS {
                    return;
                }
                let (k, r, stream) = (i % 3, (i / 3) % 4, i % 2 == 1);
                // Nobody listening (between a kill and the next gateway): sent again, not cut.
                let at = loop {
                    let at = *addr.lock().unwrap();
                    if std::net::TcpStream::connect(at).is_ok() {
                        break at;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                };
                let ok = sent(at, KEYS[k].1, r, stream);
                {
                    let mut t = tally.lock().unwrap();
                    let e = t.entry((k, r)).or_default();
                    if ok {
                        e.0 += 1;
                    } else {
                        e.1 += 1;
                    }
                }
                if ok && KILLS.contains(&(whole.fetch_add(1, Ordering::SeqCst) + 1)) {
                    let mut gw = gw.lock().unwrap();
                    gw.proc.kill();
                    *gw = start(store, sim.addr());
                    *addr.lock().unwrap() = gw.addr;
                }
            });
        }
    });
    let gw = gw.into_inner().unwrap();
    assert!(
        whole.load(Ordering::SeqCst) > KILLS[KILLS.len() - 1],
        "every kill happened"
    );
    let u = usage(gw.addr);
    let tally = tally.into_inner().unwrap();
    for (k, (name, _)) in KEYS.iter().enumerate() {
        for (r, one) in unit.iter().enumerate() {
            let (received, cut) = tally.get(&(k, r)).copied().unwrap_or_default();
            let [requests, prompt, completion] = row(&u, name, r);
            let what = format!(
                "{name} {}: {received} received whole, {cut} cut, {requests} in the store",
                ROUTES[r]
            );
            assert!(requests >= received, "usage lost: {what}");
            assert!(requests <= received + cut, "usage counted twice: {what}");
            assert_eq!(
                (prompt, completion),
                (requests * one[1] / 2, requests * one[2] / 2),
                "tokens: {what}"
            );
        }
    }
}

#[test]
fn a_gateway_killed_twice_loses_no_usage_of_a_whole_answer_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    run_with_kills(&dir.path().join("state.sqlite").display().to_string());
}

#[test]
fn a_gateway_killed_twice_loses_no_usage_of_a_whole_answer_on_postgres() {
    let pg = sparkgate_tests::postgres::Postgres::start();
    run_with_kills(&pg.database("usage"));
}
