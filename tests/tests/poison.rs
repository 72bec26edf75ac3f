//! Poison requests against supervised vllm-sim ranks (SIM_FAULT_CRASH_ON makes the engine die
//! when it schedules a marked request): the gateway quarantines a request that crashes the
//! engine instead of requeueing it into every new epoch, answers it `request_crashed_engine`,
//! refuses the same body once it has crashed the engine twice, and the group comes back and
//! serves — never `failed`. A bystander in flight at the crashes is sent again and answered.
//! The issue's reproducer (a batch with n = 10⁹) is refused as vLLM refuses it.

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, HttpResponse};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const KEY: &str = "sk-poison-test-key";
const MARK: &str = "POISON-7f3a";

fn gateway(extra: &[(&str, &str)]) -> Gateway {
    TestGateway::builder(SIM)
        .envs(&[("SIM_FAULT_CRASH_ON", MARK), ("API_KEYS", KEY)])
        .envs(extra)
        .start()
}

fn post(gw: &Gateway, path: &str, body: &Value) -> HttpResponse {
    let auth = format!("Bearer {KEY}");
    request(
        gw.addr,
        "POST",
        path,
        &[("Authorization", &auth), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "ignore_eos": true,
           "chat_template_kwargs": {"enable_thinking": false}})
}

fn restarts(gw: &Gateway) -> u64 {
    gw.status()["supervisor"]["restarts"].as_u64().unwrap()
}

fn assert_crashed_engine(r: &HttpResponse) {
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "BadRequestError", "{}", r.text());
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.starts_with("request_crashed_engine"), "{message}");
}

fn wait_serving(gw: &Gateway, epoch: u64) {
    gw.wait_status(&format!("ready in epoch {epoch}"), |s| {
        s["supervisor"]["state"] == "ready" && s["supervisor"]["epoch"] == epoch && s["ready"] == true
    });
}

fn metric(gw: &Gateway, line: &str) -> bool {
    let auth = format!("Bearer {KEY}");
    let text = request(gw.addr, "GET", "/metrics", &[("Authorization", &auth)], b"").text();
    text.lines().any(|l| l == line)
}

#[test]
fn a_request_that_crashes_the_engine_alone_is_quarantined_within_one_restart() {
    let gw = gateway(&[]);
    // The issue's reproducer is refused as vLLM refuses it (a batch takes no `n` but 1): no crash.
    let batch = json!({"messages": [[{"role": "user", "content": "hi"}]], "max_tokens": 4, "n": 1_000_000_000});
    let r = post(&gw, "/v1/chat/completions/batch", &batch);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "n");
    assert_eq!(restarts(&gw), 0);

    let poison = chat(&format!("{MARK} summarise this"), 8);
    let r = post(&gw, "/v1/chat/completions", &poison);
    assert_crashed_engine(&r);
    let epoch = gw.status()["supervisor"]["epoch"].as_u64().unwrap();
    assert!(epoch <= 2, "the answer came within one restart (epoch {epoch})");
    let id = r.header("x-request-id").unwrap().to_owned();
    wait_serving(&gw, 2);
    assert_eq!(post(&gw, "/v1/chat/completions", &chat("hello", 4)).status, 200);
    let s = gw.status();
    assert_eq!(
        s["supervisor"]["restarts"], 1,
        "one restart, the crash itself: nothing replays it"
    );
    assert_eq!(s["admission"]["queued"], 0, "{s}");
    // Its client sending it again gets one more chance (a lone request lost soon may have met a
    // rank's own death); its second loss refuses the body from then on.
    assert_crashed_engine(&post(&gw, "/v1/chat/completions", &poison));
    wait_serving(&gw, 3);
    let refused = post(&gw, "/v1/chat/completions", &poison);
    assert_crashed_engine(&refused);
    assert!(
        refused.text().contains("it is refused until QUARANTINE_TTL passes"),
        "{}",
        refused.text()
    );
    assert_eq!(restarts(&gw), 2, "refused at arrival: no third crash");
    assert!(metric(
        &gw,
        r#"sparkgate_quarantined_requests_total{stage="dispatch"} 2"#
    ));
    assert!(metric(
        &gw,
        r#"sparkgate_quarantined_requests_total{stage="arrival"} 1"#
    ));
    let log = gw.proc.log().join("\n");
    let line = log
        .lines()
        .find(|l| l.contains("request_crashed_engine: quarantined") && l.contains(&id))
        .unwrap_or_else(|| panic!("a log line names the request {id}:\n{log}"));
    assert!(
        line.contains(" ERROR ") && line.contains(" from key:") && line.contains("event=\"quarantined\""),
        "{line}"
    );
    assert!(!log.contains(KEY), "the key itself is never logged");
}

#[test]
fn a_poison_request_beside_a_bystander_is_quarantined_and_the_bystander_answered() {
    // Slow enough that the bystander is still running when the poison request arrives.
    let gw = gateway(&[("SIM_SPEED", "2")]);
    let addr = gw.addr;
    let bystander = std::thread::spawn(move || {
        let auth = format!("Bearer {KEY}");
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            &[("Authorization", &auth), ("Content-Type", "application/json")],
            chat("explain tensor parallelism", 60).to_string().as_bytes(),
        )
    });
    gw.wait_status("the bystander running", |s| s["admission"]["in_flight"] == 1);
    let r = post(&gw, "/v1/chat/completions", &chat(&format!("{MARK} now"), 8));
    assert_crashed_engine(&r);
    let b = bystander.join().unwrap();
    assert_eq!(
        b.status,
        200,
        "the bystander was sent again and answered: {}\n{}",
        b.text(),
        gw.proc.log().join("\n")
    );
    let s = gw.wait_status("serving after the crashes", |s| {
        s["supervisor"]["state"] == "ready" && s["ready"] == true
    });
    // Three when the bystander's resent copy is still in flight at the second crash (then the
    // two go on probation apart, and the poison crashes alone); two when, on a loaded machine,
    // the poison's copy reached the engine alone and the second crash already named it.
    let restarts = s["supervisor"]["restarts"].as_u64().unwrap_or(0);
    assert!(
        (2..=3).contains(&restarts),
        "at most two crashes with both in flight, then one with the poison alone: {s}\n{}",
        gw.proc.log().join("\n")
    );
    assert_eq!(post(&gw, "/v1/chat/completions", &chat("hello", 4)).status, 200);
    assert!(metric(
        &gw,
        r#"sparkgate_quarantined_requests_total{stage="dispatch"} 1"#
    ));
}

#[test]
fn a_poison_stream_is_ended_and_its_body_refused_afterwards() {
    let gw = gateway(&[]);
    let mut poison = chat(&format!("{MARK} stream"), 8);
    poison["stream"] = json!(true);
    let first = post(&gw, "/v1/chat/completions", &poison);
    // The engine dies before or after the stream's head went out: a 400, or an error event.
    if first.status == 200 {
        let events = sse::events(&first.body);
        assert!(
            events.iter().any(|e| e.data.contains("\"error\"")) && events.last().is_some_and(sse::is_done),
            "{}",
            first.text()
        );
    } else {
        assert_crashed_engine(&first);
    }
    wait_serving(&gw, 2);
    // The cut stream's body was struck when the supervisor confirmed the loss: sent again it
    // runs on probation, and its second loss refuses it from then on.
    let second = post(&gw, "/v1/chat/completions", &poison);
    if second.status == 200 {
        assert!(second.text().contains("\"error\""), "{}", second.text());
    } else {
        assert_crashed_engine(&second);
    }
    wait_serving(&gw, 3);
    assert_crashed_engine(&post(&gw, "/v1/chat/completions", &poison));
    assert_eq!(restarts(&gw), 2, "refused at arrival: no third crash");
    assert_eq!(post(&gw, "/v1/chat/completions", &chat("hello", 4)).status, 200);
}

/// `sparkgate quarantine …` against `gw`: its exit status and output.
fn quarantine_cli(gw: &Gateway, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(sparkgate_tests::test_gateway::sparkgate_bin(SIM))
        .args(["quarantine", "--url", &format!("http://{}", gw.addr)])
        .args(args)
        .env("HEAD_IP", "127.0.0.1")
        .env("WORKER_IP", "127.0.0.2")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_refused_body_stays_refused_after_a_restart_until_an_operator_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("state.sqlite").display().to_string();
    let gw = gateway(&[("STORE_URL", &store)]);
    let poison = chat(&format!("{MARK} remember me"), 8);
    assert_crashed_engine(&post(&gw, "/v1/chat/completions", &poison));
    wait_serving(&gw, 2);
    assert_crashed_engine(&post(&gw, "/v1/chat/completions", &poison));
    wait_serving(&gw, 3);
    let listed = request(gw.addr, "GET", "/admin/quarantine", &[], b"").json();
    let entry = &listed["quarantine"][0];
    let id = entry["id"].as_str().expect("an id").to_owned();
    assert_eq!(entry["quarantines"], 2, "{listed}");
    let key = entry["key"].as_str().unwrap_or_default();
    assert!(
        key.starts_with("key-") && !listed.to_string().contains(KEY),
        "the key's name, never the key: {listed}"
    );
    assert!(entry["reason"].as_str().unwrap().contains("crashed"), "{listed}");
    assert_eq!(gw.status()["quarantine"][0]["id"], id.as_str(), "in /admin/status too");
    gw.proc.terminate();
    drop(gw);
    // A new gateway on the same store, its ranks healthy: the body is refused from the store.
    let again = TestGateway::builder(SIM)
        .envs(&[("API_KEYS", KEY), ("STORE_URL", &store)])
        .start();
    let refused = post(&again, "/v1/chat/completions", &poison);
    assert_crashed_engine(&refused);
    assert!(
        refused.text().contains(&format!("sparkgate quarantine release {id}")),
        "{}",
        refused.text()
    );
    assert_eq!(restarts(&again), 0, "refused at arrival: nothing reached a rank");
    let (ok, table) = quarantine_cli(&again, &["list"]);
    assert!(ok && table.contains(&id) && table.contains("refused"), "{table}");
    let status = std::process::Command::new(sparkgate_tests::test_gateway::sparkgate_bin(SIM))
        .args(["status", "--url", &format!("http://{}", again.addr)])
        .env("HEAD_IP", "127.0.0.1")
        .env("WORKER_IP", "127.0.0.2")
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains("quarantine 1 body (1 refused at arrival)"), "{status}");
    let (ok, said) = quarantine_cli(&again, &["release", &id]);
    assert!(ok, "{said}");
    assert_eq!(
        post(&again, "/v1/chat/completions", &poison).status,
        200,
        "released: it runs"
    );
    let (ok, said) = quarantine_cli(&again, &["release", &id]);
    assert!(!ok && said.contains("no body quarantined under this id"), "{said}");
    let (ok, said) = quarantine_cli(&again, &["release", "not-an-id"]);
    assert!(!ok && said.contains("16 hex digits"), "{said}");
}

#[test]
fn gateways_sharing_a_postgres_store_refuse_the_same_body_and_share_a_release() {
    let pg = sparkgate_tests::postgres::Postgres::start();
    let url = pg.database("quarantine");
    let a = gateway(&[("STORE_URL", &url)]);
    let b = TestGateway::builder(SIM)
        .envs(&[("API_KEYS", KEY), ("STORE_URL", &url)])
        .start();
    let poison = chat(&format!("{MARK} shared"), 8);
    assert_crashed_engine(&post(&a, "/v1/chat/completions", &poison));
    wait_serving(&a, 2);
    assert_crashed_engine(&post(&a, "/v1/chat/completions", &poison));
    // B reads the record again on each listing (and every 2 s on its own).
    let listed = request(b.addr, "GET", "/admin/quarantine", &[], b"").json();
    let id = listed["quarantine"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    assert_crashed_engine(&post(&b, "/v1/chat/completions", &poison));
    assert_eq!(restarts(&b), 0, "B refused it at arrival");
    let r = request(b.addr, "POST", &format!("/admin/quarantine/{id}/release"), &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let listed = request(a.addr, "GET", "/admin/quarantine", &[], b"").json();
    assert_eq!(listed["quarantine"], serde_json::json!([]), "A sees B's release");
}
