//! The web console (`/console`, issue #52): in a real browser — Debian's headless Chromium,
//! driven by selenium through Debian's chromedriver (`tests/python/console_browser.py`) —
//! against the demo: an operator signs in, sees the group ready with both ranks, restarts it
//! while a client's stream runs, switches the speculation mode, reads a key's usage chart after
//! 100 of its requests, follows an unplanned restart's event to its diagnostics bundle and signs
//! out; a team member sees only its own key and no action. Then
//! over plain HTTP, what must be refused: wrong tokens (throttled), expired and forged cookies,
//! cross-site changes, credentials in a URL, a member's cookie on `/admin`, anything but the
//! page and its files without a sign-in. Screenshots of each view are written under
//! `target/tmp/console-screenshots`.

use serde_json::Value;
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, HttpResponse};
use sparkgate_tests::test_gateway::{sparkgate_bin, TestGateway};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";
const ADMIN: &str = "console-admin-token";
const KEYS: &str = "alice sk-console-alice tokens_per_minute=1000000\nbob sk-console-bob\n";

fn keys_file(dir: &std::path::Path) -> String {
    let file = dir.join("keys");
    std::fs::write(&file, KEYS).unwrap();
    file.display().to_string()
}

#[test]
fn an_operator_and_a_team_member_use_the_console_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path());
    let store = dir.path().join("state.sqlite").display().to_string();
    let proc = sparkgate_tests::harness::Proc::spawn(
        &sparkgate_bin(SIM),
        &["demo", "--port", "0"].map(String::from),
        &[
            ("SIM_LOAD_SECONDS", "0"),
            ("ADMIN_TOKEN", ADMIN),
            ("API_KEYS_FILE", &keys),
            ("STORE_URL", &store),
        ],
    );
    let gw = Gateway::listening(proc);
    gw.wait_ready();
    let shots = concat!(env!("CARGO_TARGET_TMPDIR"), "/console-screenshots");
    std::fs::create_dir_all(shots).unwrap();
    let base = format!("http://{}", gw.addr);
    let env = [
        ("SPARKGATE_BASE_URL", base.as_str()),
        ("SPARKGATE_MODEL", MODEL),
        ("SPARKGATE_ADMIN_TOKEN", ADMIN),
        ("SPARKGATE_MEMBER_KEY", "sk-console-bob"),
        ("SPARKGATE_USAGE_KEY", "sk-console-alice"),
        ("SPARKGATE_SHOTS", shots),
    ];
    // bash .ci/run installs selenium, chromium and chromedriver.
    let got: Value = sparkgate_tests::python::script("console_browser.py", &[], &env)
        .unwrap_or_else(|e| panic!("{e}"))
        .last_json();
    operator_saw(&got);
    // The chart's totals are the store's, to the token.
    let usage = request(
        gw.addr,
        "GET",
        "/admin/usage?window=hour&key=alice",
        &[("authorization", &format!("Bearer {ADMIN}"))],
        b"",
    )
    .json();
    let t = &usage["total"];
    assert_eq!(t["requests"], 100, "{usage}");
    assert_eq!(
        (
            &got["chart"]["prompt"],
            &got["chart"]["completion"],
            &got["chart"]["requests"]
        ),
        (&t["prompt"], &t["completion"], &t["requests"]),
        "{got}"
    );
    member_saw(&got);
    for view in [
        "signin",
        "overview",
        "actions",
        "usage",
        "events",
        "requests",
        "settings",
        "member-usage",
    ] {
        let png = std::fs::read(format!("{shots}/{view}.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{view}.png is a PNG");
    }
}

/// A JSON array of strings, as strings.
fn strings(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

fn operator_saw(got: &Value) {
    assert!(
        got["wrong_token_message"]
            .as_str()
            .unwrap()
            .contains("neither the admin token nor an API key"),
        "{got}"
    );
    assert_eq!(got["overview"]["state"], "ready", "{got}");
    assert_eq!(got["overview"]["ranks"].as_array().unwrap().len(), 2, "{got}");
    assert_eq!(got["overview"]["who"], "operator");
    assert_eq!(got["cookie"]["httpOnly"], true);
    assert_eq!(got["cookie"]["sameSite"], "Strict");
    let restart = &got["restart"];
    assert!(
        restart["outcome"].as_str().unwrap().starts_with("ready in "),
        "{restart}"
    );
    let phases = strings(&restart["phases"]);
    // The phases on the way: the drain, the restart, the start, then ready in the next epoch.
    assert!(phases.len() >= 2, "the phases were shown: {phases:?}");
    assert!(!phases[0].starts_with("ready"), "{phases:?}");
    assert!(phases.last().unwrap().starts_with("ready"), "{phases:?}");
    assert_eq!(
        restart["stream"]["finish"], "length",
        "the client's stream ran to its end: {restart}"
    );
    let spec = &got["spec"];
    assert!(spec["outcome"].as_str().unwrap().starts_with("ready in "), "{spec}");
    assert_eq!(spec["now"], spec["to"], "{spec}");
    assert_ne!(spec["from"], spec["to"]);
    assert_eq!(got["csv_is_data"], true);
    let events = strings(&got["events"]);
    assert!(
        events.contains(&"operator_asked") && events.contains(&"state_changed"),
        "{events:?}"
    );
    let unplanned = &got["unplanned"];
    assert_eq!(unplanned["first"], "group_lost", "{unplanned}");
    assert!(
        !unplanned["levels"].as_array().unwrap().iter().any(|l| l == "INFO"),
        "filtered to warn: {unplanned}"
    );
    assert!(
        unplanned["bundle_files"].as_u64().unwrap() > 0,
        "the bundle downloads: {unplanned}"
    );
    assert!(got["settings_rows"].as_u64().unwrap() > 20, "{got}");
    assert_eq!(got["admin_token_in_page"], false, "the settings redact ADMIN_TOKEN");
    assert_eq!(got["after_sign_out"]["admin"], 401, "{got}");
    assert_eq!(got["after_sign_out"]["console"], 401, "{got}");
}

fn member_saw(got: &Value) {
    let m = &got["member"];
    assert_eq!(m["who"], "team member · key bob", "{m}");
    assert_eq!(m["tabs"], serde_json::json!(["overview", "usage"]), "{m}");
    assert_eq!(m["action_buttons"], 0, "{m}");
    assert_eq!(m["usage_keys"], serde_json::json!(["bob"]), "only its own key: {m}");
    assert_eq!(m["admin_status"], 403, "the admin routes refuse a member's cookie: {m}");
    assert_eq!(
        m["own_usage_only"], "bob",
        "a member's key= is its own whatever it asks: {m}"
    );
}

fn login(gw: &Gateway, token: &str, origin: Option<&str>) -> HttpResponse {
    let body = serde_json::json!({ "token": token }).to_string();
    let mut headers = vec![("content-type", "application/json")];
    if let Some(o) = origin {
        headers.push(("origin", o));
    }
    request(gw.addr, "POST", "/console/login", &headers, body.as_bytes())
}

fn session_of(resp: &HttpResponse) -> String {
    let set = resp.header("set-cookie").expect("a session cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Max-Age="),
        "{set}"
    );
    set.split(';').next().unwrap().to_owned()
}

#[test]
fn bad_credentials_cookies_origins_and_urls_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path());
    let gw = TestGateway::builder(SIM)
        .env("ADMIN_TOKEN", ADMIN)
        .env("API_KEYS_FILE", &keys)
        .env("CONSOLE_SESSION_S", "1")
        .start();
    // The test client sends `Host: test`: the console's own page there has this origin.
    let origin = "http://test".to_owned();
    let get = |path: &str, cookie: &str| request(gw.addr, "GET", path, &[("cookie", cookie)], b"");
    // Without a sign-in: the page and its files only.
    let page = request(gw.addr, "GET", "/console", &[], b"");
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"));
    assert!(!page.text().contains("<script>"), "no inline script");
    assert_eq!(
        request(gw.addr, "GET", "/console/assets/console.js", &[], b"").status,
        200
    );
    for path in [
        "/console/api/status",
        "/console/api/usage",
        "/console/api/session",
        "/admin/status",
    ] {
        let r = request(gw.addr, "GET", path, &[], b"");
        assert_eq!(r.status, 401, "{path}: {}", r.text());
        assert!(!r.json()["error"]["message"].as_str().unwrap().is_empty());
    }
    // A forged cookie names nobody.
    let forged = format!("sparkgate_console={}", "ab".repeat(32));
    assert_eq!(get("/console/api/status", &forged).status, 401);
    assert_eq!(get("/admin/status", &forged).status, 401);
    // A token in a URL is refused, whether right or not.
    let r = request(gw.addr, "GET", &format!("/admin/status?token={ADMIN}"), &[], b"");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("never taken from a URL"));
    assert_eq!(request(gw.addr, "GET", "/console?api_key=x", &[], b"").status, 400);
    // Another site's page may not sign in or change anything.
    assert_eq!(login(&gw, ADMIN, Some("http://evil.example")).status, 403);
    let operator = session_of(&login(&gw, ADMIN, Some(&origin)));
    // Over HTTPS (a proxy in front says so) the cookie is Secure; over plain HTTP it cannot be.
    let body = serde_json::json!({ "token": ADMIN }).to_string();
    let https = request(
        gw.addr,
        "POST",
        "/console/login",
        &[("x-forwarded-proto", "https")],
        body.as_bytes(),
    );
    assert!(
        https.header("set-cookie").unwrap().ends_with("; Secure"),
        "{:?}",
        https.headers
    );
    assert!(!login(&gw, ADMIN, Some(&origin))
        .header("set-cookie")
        .unwrap()
        .contains("Secure"));
    let cross = [("cookie", operator.as_str()), ("sec-fetch-site", "cross-site")];
    let r = request(gw.addr, "POST", "/admin/stop", &cross, b"");
    assert_eq!(r.status, 403, "{}", r.text());
    // A cookie's change must say where it came from; a GET needs no such proof.
    assert_eq!(
        request(gw.addr, "POST", "/admin/spec", &[("cookie", operator.as_str())], b"{}").status,
        403
    );
    assert_eq!(get("/admin/status", &operator).status, 200);
    // A member's cookie: the console's own routes, never /admin.
    let member = session_of(&login(&gw, "sk-console-bob", Some(&origin)));
    assert_eq!(get("/console/api/session", &member).json()["key"], "bob");
    let status = get("/console/api/status", &member).json();
    assert_eq!(status["supervisor"]["ranks"].as_array().unwrap().len(), 2, "{status}");
    for private in ["upstream_url", "store", "quarantine"] {
        assert!(
            status.get(private).is_none(),
            "a member does not see {private}: {status}"
        );
    }
    assert!(status["supervisor"]["ranks"][0].get("log").is_none(), "{status}");
    let operator_view = get("/console/api/status", &operator).json();
    assert!(operator_view["upstream_url"].is_string() && operator_view["supervisor"]["ranks"][0]["log"].is_string());
    let r = get("/admin/usage", &member);
    assert_eq!(r.status, 403, "{}", r.text());
    // Expired: CONSOLE_SESSION_S=1, and the session is checked on every request.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    assert_eq!(get("/console/api/session", &member).status, 401);
    assert_eq!(get("/admin/status", &operator).status, 401);
    // Wrong tokens: a clear message, then the address is held back with Retry-After.
    for _ in 0..5 {
        let r = login(&gw, "wrong", None);
        assert_eq!(r.status, 401);
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("neither the admin token"));
    }
    let r = login(&gw, ADMIN, None);
    assert_eq!(r.status, 429, "{}", r.text());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
}
