//! The gateway in front of the real vLLM 0.33.0 frontend answers like the frontend alone: never
//! stricter, never changing what vLLM would send. Each case is one of issue #31's bugs, sent
//! to both; the answers' shapes (`conformance::shape`) must be equal, and the fact the bug broke
//! is checked as well.

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::conformance::shape::{diff, response_shape};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{request, HttpResponse};
use sparkgate_tests::realvllm::{plan_argv, RealVllm};
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");
const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

struct Pair {
    real: RealVllm,
    gw: Gateway,
}

impl Pair {
    fn start() -> Pair {
        let real = RealVllm::start_with(
            VllmRelease::V0_33,
            ProfileId::DeepSeekV41Flash,
            &plan_argv(ProfileId::DeepSeekV41Flash, None),
            &[],
        );
        let gw = TestGateway::builder(SIM).upstream(real.addr).start();
        Pair { real, gw }
    }

    /// The same request to the frontend alone and through the gateway; both answers, after
    /// checking that their shapes agree.
    fn both(&self, case: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (HttpResponse, HttpResponse) {
        let real = request(self.real.addr, "POST", path, headers, body);
        let via = request(self.gw.addr, "POST", path, headers, body);
        // The gateway gives every answer an id (docs/gateway.md, deliberate differences).
        let differences: Vec<String> = diff(&response_shape(&real), &response_shape(&via))
            .into_iter()
            .filter(|l| !l.starts_with(".x-request-id"))
            .collect();
        assert!(
            differences.is_empty(),
            "{case}: the gateway answers differently from vLLM:\n{}\nreal: {} {}\ngateway: {} {}",
            differences.join("\n"),
            real.status,
            real.text(),
            via.status,
            via.text()
        );
        (real, via)
    }

    fn both_json(&self, case: &str, path: &str, body: &Value) -> (HttpResponse, HttpResponse) {
        let bytes = serde_json::to_vec(body).unwrap();
        self.both(case, path, &[("Content-Type", "application/json")], &bytes)
    }
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": "Say hi", "max_tokens": 5});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// The `data:` events of a stream that carry a `usage` object.
fn usage_events(r: &HttpResponse) -> usize {
    sse::events(&r.body)
        .iter()
        .filter(|e| !sse::is_done(e))
        .filter(|e| sse::json(e).get("usage").is_some_and(|u| !u.is_null()))
        .count()
}

#[test]
fn the_gateway_is_never_stricter_than_vllm_nor_changes_its_answers() {
    let pair = Pair::start();
    // Every case runs, and every one that breaks is reported: one line per bug.
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|(name, case)| {
            std::panic::catch_unwind(|| case(&pair))
                .err()
                .map(|e| panic_text(name, &e))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n\n")
    );
}

fn panic_text(name: &str, e: &Box<dyn std::any::Any + Send>) -> String {
    let text = e
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    format!("[{name}] {text}")
}

type Case = fn(&Pair);

const CASES: &[(&str, Case)] = &[
    ("1 continuous usage without include_usage", continuous_usage),
    ("2 include_usage no boolean coerces from", include_usage_maybe),
    ("3 n as a float or a string", lax_n),
    ("4 stream as a string or an integer", lax_stream),
    ("5 the media type in another case", media_type_case),
    ("6 a UTF-8 byte-order mark", byte_order_mark),
    ("7 120 headers", many_headers),
];

/// vLLM counts continuous usage only with include_usage: no usage at all.
fn continuous_usage(pair: &Pair) {
    for (path, mut body) in [
        ("/v1/chat/completions", chat(json!({}))),
        ("/v1/completions", completion(json!({}))),
    ] {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"continuous_usage_stats": true});
        let (real, via) = pair.both_json("continuous usage", path, &body);
        assert_eq!(usage_events(&real), 0, "{path}: {}", real.text());
        assert_eq!(usage_events(&via), 0, "{path}: {}", via.text());
    }
}

/// vLLM refuses an include_usage that no boolean coerces from.
fn include_usage_maybe(pair: &Pair) {
    let body = chat(json!({"stream": true, "stream_options": {"include_usage": "maybe"}}));
    let (real, via) = pair.both_json("include_usage maybe", "/v1/chat/completions", &body);
    assert_eq!((real.status, via.status), (400, 400), "{}", via.text());
}

/// `n` as a float or a string is coerced: two choices.
fn lax_n(pair: &Pair) {
    for n in [json!(2.0), json!("2")] {
        let (real, via) = pair.both_json("lax n", "/v1/chat/completions", &chat(json!({"n": n})));
        assert_eq!(
            real.json()["choices"].as_array().map(Vec::len),
            Some(2),
            "{}",
            real.text()
        );
        assert_eq!(
            via.json()["choices"].as_array().map(Vec::len),
            Some(2),
            "{}",
            via.text()
        );
    }
}

/// `stream` as a string or an integer streams.
fn lax_stream(pair: &Pair) {
    for stream in [json!("true"), json!(1)] {
        let (_, via) = pair.both_json("lax stream", "/v1/chat/completions", &chat(json!({"stream": stream})));
        assert!(sse::events(&via.body).iter().any(sse::is_done), "{}", via.text());
    }
}

fn plain_body() -> Vec<u8> {
    serde_json::to_vec(&chat(json!({}))).unwrap()
}

/// vLLM compares the media type lowercased.
fn media_type_case(pair: &Pair) {
    let headers = [("Content-Type", "Application/JSON")];
    let (_, via) = pair.both("content type case", "/v1/chat/completions", &headers, &plain_body());
    assert_eq!(via.status, 200, "{}", via.text());
}

/// Python's json.loads reads past a byte-order mark.
fn byte_order_mark(pair: &Pair) {
    let with_bom = [b"\xef\xbb\xbf".as_slice(), &plain_body()].concat();
    let headers = [("Content-Type", "application/json")];
    let (_, via) = pair.both("byte-order mark", "/v1/chat/completions", &headers, &with_bom);
    assert_eq!(via.status, 200, "{}", via.text());
}

/// uvicorn counts no headers.
fn many_headers(pair: &Pair) {
    let names: Vec<String> = (0..118).map(|i| format!("x-extra-{i}")).collect();
    let mut headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    headers.push(("Content-Type", "application/json"));
    let (_, via) = pair.both("120 headers", "/v1/chat/completions", &headers, &plain_body());
    assert_eq!(via.status, 200, "{}", via.text());
}
