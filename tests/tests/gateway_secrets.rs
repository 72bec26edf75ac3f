//! Secrets stay secret: the values clients put in `Authorization` and `x-api-key` — a valid API
//! key, a wrong one, the admin token, right or wrong — appear in no line the gateway logs (at
//! SPARKGATE_LOG=trace, where the most is written) and in no error body, on any
//! kind of route: a generation, a stream, Anthropic's Messages, the tokenizer, an unknown path,
//! `/metrics`, `/admin`.

use serde_json::json;
use sparkgate_tests::http::request;

mod common;
use common::ds_pair;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const JSON: (&str, &str) = ("Content-Type", "application/json");
const KEY: &str = "sk-valid-5d1f0a";
const WRONG: &str = "sk-wrong-9c2e77";
const ADMIN: &str = "adm-token-3b8d44";
const WRONG_ADMIN: &str = "adm-wrong-71aa02";

#[test]
fn key_and_token_values_appear_in_no_log_line_and_no_error_body() {
    let (_sim, gw) = ds_pair(
        &[],
        &[("API_KEYS", KEY), ("ADMIN_TOKEN", ADMIN), ("SPARKGATE_LOG", "trace")],
    );
    let chat = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let stream =
        json!({"model": MODEL, "max_tokens": 4, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    let tokenize = json!({"model": MODEL, "prompt": "hello"}).to_string();
    let (bearer_ok, bearer_wrong) = (format!("Bearer {KEY}"), format!("Bearer {WRONG}"));
    let presented: [(&str, &str); 4] = [
        ("Authorization", &bearer_ok),
        ("Authorization", &bearer_wrong),
        ("x-api-key", KEY),
        ("x-api-key", WRONG),
    ];
    let posts: [(&str, &str); 6] = [
        ("/v1/chat/completions", &chat),
        ("/v1/chat/completions", &stream),
        ("/v1/messages", &chat),
        ("/tokenize", &tokenize),
        ("/v1/chat/completions", "{not json"),
        ("/v1/no-such-route", &chat),
    ];
    let mut answers = Vec::new();
    for header in presented {
        for (path, body) in posts {
            answers.push(request(gw.addr, "POST", path, &[JSON, header], body.as_bytes()));
        }
        answers.push(request(gw.addr, "GET", "/metrics", &[header], b""));
    }
    for token in [ADMIN, WRONG_ADMIN] {
        let bearer = format!("Bearer {token}");
        answers.push(request(
            gw.addr,
            "GET",
            "/admin/status",
            &[("Authorization", &bearer)],
            b"",
        ));
        answers.push(request(gw.addr, "GET", "/admin/status", &[("x-api-key", token)], b""));
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    for expected in [200, 400, 401, 404] {
        assert!(statuses.contains(&expected), "a {expected} among {statuses:?}");
    }
    let log = gw.proc.log().join("\n");
    // SPARKGATE_LOG=trace lets every event through; the polls' DEBUG lines show it took.
    assert!(log.contains("DEBUG request"), "the log is at its most verbose:\n{log}");
    for secret in [KEY, WRONG, ADMIN, WRONG_ADMIN] {
        assert!(!log.contains(secret), "{secret} is in the gateway's log");
        for a in &answers {
            assert!(!a.text().contains(secret), "{secret} is in an answer: {}", a.text());
        }
    }
}
