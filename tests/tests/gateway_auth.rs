//! Authentication where it matters: API_KEYS guard every route that reaches the model or its
//! tokenizer (Bearer or Anthropic's `x-api-key`), `/metrics` unless METRICS_PUBLIC, refusals in
//! the route's envelope; the rate limit counts per validated key or per client address, never
//! per unchecked header; admin refusals name the admin token.

use serde_json::json;
use sparkgate_tests::http::request;

mod common;
use common::ds_pair;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const JSON: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn api_keys_guard_the_tokenizer_messages_and_metrics_routes() {
    let (_sim, gw) = ds_pair(&[], &[("API_KEYS", "k1,k2")]);
    let tok = json!({"model": MODEL, "prompt": "hello"}).to_string();
    let bare = request(gw.addr, "POST", "/tokenize", &[JSON], tok.as_bytes());
    assert_eq!(bare.status, 401, "/tokenize needs a key");
    assert_eq!(bare.json()["error"]["code"], 401);
    let keyed = request(
        gw.addr,
        "POST",
        "/tokenize",
        &[JSON, ("Authorization", "Bearer k2")],
        tok.as_bytes(),
    );
    assert_eq!(keyed.status, 200, "{}", keyed.text());
    let msg = json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let refused = request(gw.addr, "POST", "/v1/messages", &[JSON], msg.as_bytes());
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.json()["error"]["type"],
        "authentication_error",
        "Anthropic's envelope"
    );
    let anthropic_sdk = request(
        gw.addr,
        "POST",
        "/v1/messages",
        &[JSON, ("x-api-key", "k1")],
        msg.as_bytes(),
    );
    assert_eq!(anthropic_sdk.status, 200, "{}", anthropic_sdk.text());
    assert_eq!(request(gw.addr, "GET", "/metrics", &[], b"").status, 401);
    assert_eq!(gw.with_token("GET", "/metrics", "k1").status, 200);
    for open in ["/ping", "/version", "/health"] {
        assert_eq!(request(gw.addr, "GET", open, &[], b"").status, 200, "{open} stays open");
    }
    let (_sim2, public) = ds_pair(&[], &[("API_KEYS", "k1"), ("METRICS_PUBLIC", "1")]);
    assert_eq!(request(public.addr, "GET", "/metrics", &[], b"").status, 200);
}

#[test]
fn the_rate_limit_is_not_escaped_by_a_fresh_bearer_per_request() {
    let (_sim, gw) = ds_pair(&[], &[("RATE_LIMIT_RPM", "2"), ("RATE_LIMIT_BURST", "2")]);
    let body = json!({"model": MODEL, "prompt": "hello"}).to_string();
    let statuses: Vec<u16> = (0..4)
        .map(|i| {
            let auth = format!("Bearer random-{i}");
            request(
                gw.addr,
                "POST",
                "/tokenize",
                &[JSON, ("Authorization", auth.as_str())],
                body.as_bytes(),
            )
            .status
        })
        .collect();
    assert_eq!(&statuses[..2], &[200, 200]);
    assert!(
        statuses[2..].iter().all(|s| *s == 429),
        "keyed on the client address: {statuses:?}"
    );
}

#[test]
fn a_rate_limited_messages_request_is_refused_in_anthropics_envelope_with_the_limit_headers() {
    let (_sim, gw) = ds_pair(&[], &[("RATE_LIMIT_RPM", "1"), ("RATE_LIMIT_BURST", "1")]);
    let body = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let first = request(gw.addr, "POST", "/v1/messages", &[JSON], body.as_bytes());
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-ratelimit-limit-requests"), Some("1"));
    assert_eq!(first.header("x-ratelimit-remaining-requests"), Some("0"));
    let second = request(gw.addr, "POST", "/v1/messages", &[JSON], body.as_bytes());
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(second.json()["type"], "error", "{}", second.text());
    assert_eq!(second.json()["error"]["type"], "rate_limit_error", "{}", second.text());
    assert_eq!(second.header("x-ratelimit-remaining-requests"), Some("0"));
    assert!(second
        .header("x-ratelimit-reset-requests")
        .is_some_and(|v| v.ends_with('s')));
    assert!(second.header("retry-after").is_some() && second.header("x-request-id").is_some());
}

#[test]
fn tokenize_takes_chats_kwargs_rules_and_admin_refusals_name_the_admin_token() {
    let (_sim, gw) = ds_pair(&[], &[("ADMIN_TOKEN", "secret")]);
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "chat_template_kwargs": {"chat_template": "{{ 7 }}"}});
    let r = request(gw.addr, "POST", "/tokenize", &[JSON], body.to_string().as_bytes());
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "chat_template_kwargs");
    let admin = gw.with_token("GET", "/admin/status", "wrong");
    assert_eq!(admin.status, 401);
    assert!(
        admin.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("admin token"),
        "{}",
        admin.text()
    );
}
