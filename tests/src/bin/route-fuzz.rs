//! `cargo run --release -p sparkgate-tests --bin route-fuzz [N]`: N (default 20000) bounded
//! random requests through the gateway in front of vllm-sim — every route of the table and the
//! gateway's own, many spellings of each path (escapes, dot segments, doubled and trailing
//! slashes, unknown paths), every method, valid bodies with one field mutated to a wrong type
//! or range, broken JSON, wrong content types. Every answer must be a valid response or an
//! error envelope, never a 5xx, an empty body (but `/health`'s) or a stream without its end.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sparkgate_tests::harness::{binary_next_to, Sim};
use sparkgate_tests::http::try_request;
use sparkgate_tests::load::deepseek_sim_args;
use sparkgate_tests::sse;
use sparkgate_tests::test_gateway::TestGateway;

const MODEL: &str = "DeepSeek-v4.1-Flash-EXL3";

/// A small deterministic generator (xorshift64*), so a failing run can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/chat/completions/batch",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/invocations",
    "/tokenize",
    "/detokenize",
    "/v1/models",
    "/v1/responses/resp_x",
    "/v1/responses/resp_x/cancel",
    "/load",
    "/version",
    "/ping",
    "/health",
    "/ready",
    "/metrics",
    "/v1/decisions",
    "/v1/nope",
    "/",
    "/v2/chat/completions",
    "/admin/status",
];

/// Another spelling of `path`.
fn spell(rng: &mut Rng, path: &str) -> String {
    match rng.next() % 8 {
        0 => path.replacen('/', "//", 2),
        1 => format!("{path}/"),
        2 => path.replace("/c", "/%63"),
        3 => path.replace("chat/", "chat%2F"),
        4 => format!("/v1/../{}", path.trim_start_matches('/')),
        5 => format!("{path}/./"),
        6 => format!("{path}%ff"),
        _ => path.to_owned(),
    }
}

/// A body for `path`: valid, or with one field broken.
fn body(rng: &mut Rng, path: &str) -> Vec<u8> {
    let msgs = json!([{"role": "user", "content": "What is 17*19? Reply with the integer only."}]);
    let mut b = match path {
        p if p.contains("messages") => json!({"model": MODEL, "max_tokens": 8, "messages": msgs}),
        p if p.contains("batch") => json!({"model": MODEL, "max_tokens": 4, "messages": [msgs]}),
        p if p.contains("completions") && !p.contains("chat") => {
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 4})
        }
        p if p.contains("responses") => json!({"model": MODEL, "input": "hi", "max_output_tokens": 8}),
        "/detokenize" => json!({"model": MODEL, "tokens": [1, 2, 3]}),
        "/tokenize" => json!({"model": MODEL, "prompt": "hi"}),
        _ => json!({"model": MODEL, "messages": msgs, "max_tokens": 4}),
    };
    let fields = [
        "model",
        "max_tokens",
        "messages",
        "stream",
        "n",
        "temperature",
        "reasoning_effort",
        "chat_template_kwargs",
        "extra_body",
        "tools",
        "tool_choice",
        "stream_options",
        "output_config",
        "thinking",
        "prompt",
        "input",
    ];
    let values = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e308),
        json!("x"),
        json!([]),
        json!({}),
        json!(true),
        json!([1, "a", null]),
        json!({"chat_template": "{{x}}"}),
        json!("medium"),
        json!(50),
        json!("claude-x"),
    ];
    match rng.next() % 10 {
        0..=3 => {}
        4..=7 => {
            b[*rng.pick(&fields)] = rng.pick(&values).clone();
        }
        8 => b["stream"] = json!(true),
        _ => {
            return rng
                .pick(&[&b"{"[..], b"[]", b"null", b"{\"a\":", b"\xff\xfe", b""])
                .to_vec()
        }
    }
    b.to_string().into_bytes()
}

/// Why an answer is not acceptable, if it is not.
fn verdict(path: &str, status: u16, ct: &str, body: &[u8]) -> Option<String> {
    if status >= 500 {
        return Some(format!("status {status}"));
    }
    if body.is_empty() {
        // `/health` and `/ping` answer with an empty body, as vLLM's do.
        return (!(path.starts_with("/health") || path.starts_with("/ping")))
            .then(|| format!("empty body with {status}"));
    }
    let text = String::from_utf8_lossy(body);
    if ct.starts_with("text/event-stream") {
        let ends = ["message_stop", "response.completed", "response.incomplete", "error"];
        let ended = sse::events(body)
            .iter()
            .any(|e| sse::is_done(e) || ends.contains(&e.event.as_str()));
        return (!ended).then(|| "a stream without its end".to_owned());
    }
    if ct.starts_with("text/plain") {
        return None;
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if status >= 400 && v.get("error").is_none() => {
            Some(format!("{status} without an error envelope: {text}"))
        }
        Ok(_) => None,
        Err(_) => Some(format!("{status} body is not JSON: {text}")),
    }
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let exe = std::env::current_exe().expect("exe").to_string_lossy().into_owned();
    let sim_bin = binary_next_to(&exe, "vllm-sim");
    let sim = Sim::start(&sim_bin, &deepseek_sim_args("8"), &[]);
    let gw = TestGateway::builder(&sim_bin)
        .upstream(sim.addr())
        .env("MAX_NUM_SEQS", "8")
        .start();
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let started = std::time::Instant::now();
    for i in 0..n {
        let base = *rng.pick(PATHS);
        let path = spell(&mut rng, base);
        let method = *rng.pick(&["POST", "POST", "POST", "GET", "GET", "PUT", "DELETE", "OPTIONS"]);
        let body = if method == "GET" {
            Vec::new()
        } else {
            body(&mut rng, base)
        };
        let ct = *rng.pick(&["application/json", "application/json", "application/json", "text/plain"]);
        let Some(r) = try_request(gw.addr, method, &path, &[("Content-Type", ct)], &body) else {
            failures.push(format!("#{i} {method} {path}: connection failed"));
            continue;
        };
        *by_status.entry(r.status).or_default() += 1;
        if let Some(why) = verdict(base, r.status, r.header("content-type").unwrap_or(""), &r.body) {
            failures.push(format!(
                "#{i} {method} {path} ({}): {why}",
                String::from_utf8_lossy(&body).chars().take(120).collect::<String>()
            ));
        }
    }
    println!(
        "{n} requests in {:.1} s; by status: {by_status:?}",
        started.elapsed().as_secs_f64()
    );
    let five = by_status.range(500..).map(|(_, c)| c).sum::<usize>();
    println!("5xx: {five}; unacceptable answers: {}", failures.len());
    for f in failures.iter().take(20) {
        println!("  {f}");
    }
    // `exit` skips destructors: stop the gateway and the simulator first.
    drop(gw);
    drop(sim);
    std::process::exit(i32::from(!failures.is_empty()));
}
