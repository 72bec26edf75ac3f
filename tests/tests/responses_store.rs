//! The gateway's Responses store (docs/store.md) in front of supervised vllm-sim ranks: a chain
//! of turns by `previous_response_id` across a group restart and a gateway restart, each turn
//! sent to vLLM with the whole conversation; the stored responses read back, paged and deleted;
//! another API key answered 404 everywhere; `store: false` keeping nothing; and a response
//! stored before its last byte, so a gateway SIGKILLed right after it still has it.

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, Streaming};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn call(gw: &Gateway, method: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> (u16, Value) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let text = body.map(Value::to_string).unwrap_or_default();
    let r = request(gw.addr, method, path, &headers, text.as_bytes());
    (r.status, r.json())
}

fn turn(gw: &Gateway, key: Option<&str>, text: &str, previous: Option<&str>) -> Value {
    let mut body = json!({"input": text, "max_output_tokens": 400, "temperature": 0});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    let (status, answer) = call(gw, "POST", "/v1/responses", key, Some(&body));
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The text of an answer's message item.
fn said(answer: &Value) -> &str {
    answer["output"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["type"] == "message")
        .and_then(|m| m["content"][0]["text"].as_str())
        .unwrap_or_else(|| panic!("a message item: {answer}"))
}

fn user_texts(items: &Value) -> Vec<String> {
    items["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["role"] == "user")
        .map(|i| {
            i["content"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| i["content"].to_string())
        })
        .collect()
}

#[test]
fn a_chain_of_five_turns_survives_a_group_restart_and_a_gateway_restart() {
    let logs = tempfile::tempdir().unwrap();
    let start = || TestGateway::builder(SIM).logs(logs.path()).start();
    let mut gw = start();
    let mut previous: Option<String> = None;
    let mut input_tokens = 0;
    for n in 1..=5 {
        if n == 3 {
            let epoch = gw.status()["supervisor"]["epoch"].clone();
            assert!(request(gw.addr, "POST", "/admin/restart", &[], b"").status < 300);
            gw.wait_status("a new epoch", |s| {
                s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] != epoch && s["ready"] == true
            });
        }
        if n == 4 {
            drop(gw);
            gw = start();
        }
        let answer = turn(
            &gw,
            None,
            &format!("Turn {n}: remember the number {}.", n * 11),
            previous.as_deref(),
        );
        assert_eq!(answer["previous_response_id"], json!(previous), "{answer}");
        let used = answer["usage"]["input_tokens"].as_u64().unwrap();
        assert!(
            used > input_tokens,
            "turn {n} was sent the whole conversation: {used} after {input_tokens}"
        );
        input_tokens = used;
        previous = answer["id"].as_str().map(str::to_owned);
    }
    // The last question is answered from the whole conversation vLLM was sent.
    let recall = turn(&gw, None, "Which numbers did I say?", previous.as_deref());
    assert_eq!(said(&recall), "You said: 11, 22, 33, 44, 55.", "{recall}");
    let last = previous.unwrap();
    let (status, stored) = call(&gw, "GET", &format!("/v1/responses/{last}"), None, None);
    assert_eq!((status, stored["id"].as_str()), (200, Some(last.as_str())));
    let (status, items) = call(
        &gw,
        "GET",
        &format!("/v1/responses/{last}/input_items?order=asc&limit=100"),
        None,
        None,
    );
    assert_eq!(status, 200, "{items}");
    let texts = user_texts(&items);
    assert_eq!(texts.len(), 5, "every user turn is in the last input: {items}");
    assert!(
        texts[0].contains("number 11") && texts[4].contains("number 55"),
        "{texts:?}"
    );
    let (status, page) = call(
        &gw,
        "GET",
        &format!("/v1/responses/{last}/input_items?limit=2"),
        None,
        None,
    );
    assert_eq!((status, page["has_more"].as_bool()), (200, Some(true)), "{page}");
    let (status, gone) = call(&gw, "DELETE", &format!("/v1/responses/{last}"), None, None);
    assert_eq!(
        (status, gone),
        (200, json!({"id": last, "object": "response", "deleted": true}))
    );
    let (status, _) = call(&gw, "GET", &format!("/v1/responses/{last}"), None, None);
    assert_eq!(status, 404);
}

#[test]
fn another_api_key_gets_404_everywhere_and_store_false_keeps_nothing() {
    let gw = TestGateway::builder(SIM).env("API_KEYS", "k1,k2").start();
    let mine = turn(&gw, Some("k1"), "hello", None);
    let id = mine["id"].as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("GET", format!("/v1/responses/{id}/input_items")),
        ("DELETE", format!("/v1/responses/{id}")),
    ] {
        let (status, body) = call(&gw, method, &path, Some("k2"), None);
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(body["error"]["message"], format!("Response with id '{id}' not found."));
    }
    let follow = json!({"input": "and then?", "previous_response_id": id, "max_output_tokens": 8});
    let (status, body) = call(&gw, "POST", "/v1/responses", Some("k2"), Some(&follow));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["param"], "response_id");
    let (status, _) = call(&gw, "GET", &format!("/v1/responses/{id}"), Some("k1"), None);
    assert_eq!(status, 200, "the owner still reads it");
    let metrics = request(gw.addr, "GET", "/metrics", &[("Authorization", "Bearer k1")], b"").text();
    for family in [
        "sparkgate_store_records ",
        "sparkgate_store_bytes ",
        "sparkgate_store_evictions_total 0",
    ] {
        assert!(metrics.lines().any(|l| l.starts_with(family)), "{family}:\n{metrics}");
    }
    let status = gw.status();
    assert_eq!(status["store"]["open"], true, "{status}");
    let body = json!({"input": "hello", "max_output_tokens": 8, "store": false});
    let (status, unstored) = call(&gw, "POST", "/v1/responses", Some("k1"), Some(&body));
    assert_eq!(status, 200);
    let (status, _) = call(
        &gw,
        "GET",
        &format!("/v1/responses/{}", unstored["id"].as_str().unwrap()),
        Some("k1"),
        None,
    );
    assert_eq!(status, 404, "store: false keeps nothing");
    let (status, bad) = call(
        &gw,
        "GET",
        &format!("/v1/responses/{id}/input_items?limit=500"),
        Some("k1"),
        None,
    );
    assert_eq!((status, bad["error"]["param"].as_str()), (400, Some("limit")));
}

#[test]
fn a_gateway_sigkilled_right_after_an_answer_still_has_it() {
    let logs = tempfile::tempdir().unwrap();
    let start = || TestGateway::builder(SIM).logs(logs.path()).start();
    let mut gw = start();
    let whole = turn(&gw, None, "kept", None);
    // A stream: read until its final event, then the gateway is killed at once.
    let body = json!({"input": "streamed", "max_output_tokens": 16, "stream": true});
    let mut s = Streaming::post_json(gw.addr, "/v1/responses", &body);
    let mut raw = Vec::new();
    let completed = loop {
        raw.extend(s.next_chunk().expect("the stream's final event"));
        let done = sse::events(&raw)
            .into_iter()
            .find(|e| matches!(e.event.as_str(), "response.completed" | "response.incomplete"));
        if let Some(e) = done {
            break sse::json(&e);
        }
    };
    gw.proc.kill();
    drop(gw);
    let gw = start();
    for answer in [&whole, &completed["response"]] {
        let id = answer["id"].as_str().unwrap();
        let (status, stored) = call(&gw, "GET", &format!("/v1/responses/{id}"), None, None);
        assert_eq!(status, 200, "{id}: {stored}");
        assert_eq!(stored["status"], answer["status"]);
        assert_eq!(stored["output"], answer["output"], "stored as the client got it");
    }
}

#[test]
fn twenty_follow_ups_spread_over_two_groups_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let file = sparkgate_tests::test_gateway::groups_file(dir.path(), &["a", "b"]);
    // Round-robin: each follow-up goes to the other group than the turn before it.
    let gw = TestGateway::builder(SIM)
        .logs(dir.path())
        .envs(&[("GROUPS_FILE", file.as_str()), ("GROUP_ROUTING", "round-robin")])
        .start_unready();
    gw.wait_status("both groups ready", |s| {
        s["groups"]
            .as_array()
            .is_some_and(|g| g.len() == 2 && g.iter().all(|g| g["upstream"]["state"] == "ready"))
    });
    let mut previous: Option<String> = None;
    let mut groups = std::collections::BTreeSet::new();
    for n in 0..=20 {
        let mut body = json!({"input": format!("Turn {n}."), "max_output_tokens": 400, "temperature": 0});
        if let Some(p) = &previous {
            body["previous_response_id"] = json!(p);
        }
        let r = request(
            gw.addr,
            "POST",
            "/v1/responses",
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "turn {n}: {}", r.text());
        groups.extend(r.header("x-sparkgate-group").map(str::to_owned));
        previous = r.json()["id"].as_str().map(str::to_owned);
    }
    assert_eq!(groups.len(), 2, "both groups served follow-ups: {groups:?}");
    let last = previous.unwrap();
    let (status, items) = call(
        &gw,
        "GET",
        &format!("/v1/responses/{last}/input_items?limit=100"),
        None,
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(user_texts(&items).len(), 21, "every turn is in the last input");
}

#[test]
fn two_gateways_on_one_postgres_store_continue_each_others_conversations() {
    let pg = sparkgate_tests::postgres::Postgres::start();
    let url = pg.database("shared");
    let a = TestGateway::builder(SIM).env("STORE_URL", &url).start();
    let b = TestGateway::builder(SIM).env("STORE_URL", &url).start();
    let mut previous: Option<String> = None;
    for (n, gw) in [&a, &b, &a, &b].into_iter().enumerate() {
        let answer = turn(
            gw,
            None,
            &format!("Turn {n}: remember the number {}.", n + 1),
            previous.as_deref(),
        );
        previous = answer["id"].as_str().map(str::to_owned);
    }
    let recall = turn(&a, None, "Which numbers did I say?", previous.as_deref());
    assert_eq!(said(&recall), "You said: 1, 2, 3, 4.", "{recall}");
    let id = recall["id"].as_str().unwrap();
    let (status, _) = call(&b, "GET", &format!("/v1/responses/{id}"), None, None);
    assert_eq!(status, 200, "the other gateway reads it");
}
