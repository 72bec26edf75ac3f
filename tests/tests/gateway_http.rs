//! The gateway in front of vllm-sim processes, over raw HTTP: extra_body repair, effort
//! translation per profile, admission (MAX_NUM_SEQS, FIFO, 429, 503, disconnects), stream
//! faults and timeouts, byte-faithful relaying, errors, auth, rate limits and observability.

use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_tests::harness::{binary_next_to, post_json, request, sse_data, try_request, Gateway, Sim, Streaming};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn sparkgate() -> String {
    binary_next_to(SIM, "sparkgate")
}

const DS: &[&str] = &[
    "/model",
    "--served-model-name",
    "DeepSeek-v4.1-Flash-EXL3",
    "--reasoning-parser",
    "deepseek_v41",
    "--max-num-seqs",
    "2",
];
const GLM: &[&str] = &[
    "/glm",
    "--served-model-name",
    "GLM-5.3-Flash-EXL3",
    "--reasoning-parser",
    "glm45",
    "--max-num-seqs",
    "4",
];

fn ds_pair(sim_env: &[(&str, &str)], gw_env: &[(&str, &str)]) -> (Sim, Gateway) {
    let sim = Sim::start(SIM, DS, sim_env);
    let gw = Gateway::start(&sparkgate(), "deepseek-v4.1-flash", sim.addr(), gw_env);
    (sim, gw)
}

fn chat(gw: &Gateway, body: Value) -> sparkgate_tests::harness::HttpResponse {
    post_json(gw.addr, "/v1/chat/completions", &body)
}

fn reasoning_first_line(resp: &Value) -> Option<String> {
    resp["choices"][0]["message"]["reasoning"]
        .as_str()
        .map(|r| r.lines().next().unwrap_or("").to_owned())
}

#[test]
fn nested_extra_body_turns_thinking_off_through_the_gateway() {
    let (sim, gw) = ds_pair(&[], &[]);
    let body = json!({"messages": [{"role": "user", "content": "What is 17*19? Reply with the integer only."}], "max_tokens": 32,
                      "extra_body": {"chat_template_kwargs": {"enable_thinking": false}}});
    let direct = post_json(sim.addr(), "/v1/chat/completions", &body).json();
    assert!(
        reasoning_first_line(&direct).is_some(),
        "plain vLLM ignores the nested extra_body and thinks"
    );
    let via = chat(&gw, body).json();
    assert_eq!(
        reasoning_first_line(&via),
        None,
        "the gateway applied enable_thinking=false"
    );
    assert_eq!(via["choices"][0]["message"]["content"], "323");
    let metrics = request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(metrics.contains("sparkgate_extra_body_repairs_total 1"), "{metrics}");
    let bad = chat(&gw, json!({"messages": [], "extra_body": "x"}));
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "extra_body");
}

#[test]
fn deepseek_efforts_reach_the_template_as_documented() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (extra, expected) in [
        (json!({}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "low"}), Some("Reasoning Effort: 50")),
        (json!({"reasoning_effort": "high"}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "max"}), Some("Reasoning Effort: 100")),
        (json!({"reasoning_effort": 33}), Some("Reasoning Effort: 33")),
        (json!({"reasoning_effort": "40"}), Some("Reasoning Effort: 40")),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": 90}}),
            Some("Reasoning Effort: 90"),
        ),
        (json!({"reasoning_effort": "medium"}), Some("Reasoning Effort: 75")),
        (json!({"reasoning_effort": "minimal"}), Some("Reasoning Effort: 50")),
        (json!({"reasoning_effort": "xhigh"}), Some("Reasoning Effort: 100")),
        (json!({"reasoning_effort": "none"}), None),
        (
            json!({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": 90}}),
            Some("Reasoning Effort: 50"),
        ),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 300});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = chat(&gw, body.clone());
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        assert_eq!(reasoning_first_line(&r.json()).as_deref(), expected, "{body}");
    }
    for (extra, param) in [
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (json!({"reasoning_effort": 0}), "reasoning_effort"),
        (json!({"reasoning_effort": 101}), "reasoning_effort"),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": "ultra"}}),
            "chat_template_kwargs.reasoning_effort",
        ),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
            "chat_template_kwargs",
        ),
        (
            json!({"chat_template_kwargs": {"chat_template": "x"}}),
            "chat_template_kwargs",
        ),
        (json!({"chat_template_kwargs": []}), "chat_template_kwargs"),
    ] {
        let mut body = json!({"messages": msgs});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = chat(&gw, body.clone());
        assert_eq!(r.status, 400, "{body}");
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{body}");
        assert_eq!(e["error"]["type"], "BadRequestError");
    }
    let e = chat(&gw, json!({"messages": msgs, "reasoning_effort": "extreme"})).json();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("use low, high, max, none or an integer 1-100"),
        "{e}"
    );
}

#[test]
fn glm_efforts_render_exactly_what_was_asked() {
    let sim = Sim::start(SIM, GLM, &[]);
    let gw = Gateway::start(&sparkgate(), "glm-5.3-flash", sim.addr(), &[]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (effort, expected) in [
        (json!("low"), Some("Reasoning Effort: Low")),
        (json!("high"), Some("Reasoning Effort: High")),
        (json!("max"), Some("Reasoning Effort: Max")),
        (json!("medium"), Some("Reasoning Effort: High")),
        (json!("none"), None),
    ] {
        let r = chat(
            &gw,
            json!({"messages": msgs, "reasoning_effort": effort, "max_tokens": 2000}),
        )
        .json();
        assert_eq!(reasoning_first_line(&r).as_deref(), expected, "{effort}");
    }
    for bad in [json!(50), json!("50"), json!("ultra")] {
        let r = chat(&gw, json!({"messages": msgs, "reasoning_effort": bad}));
        assert_eq!(r.status, 400);
        assert_eq!(r.json()["error"]["param"], "reasoning_effort");
    }
    // Responses API: reasoning.effort under the same rules.
    let r = post_json(
        gw.addr,
        "/v1/responses",
        &json!({"input": "hi", "reasoning": {"effort": "max"}, "max_output_tokens": 2000}),
    )
    .json();
    let text = r["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(text.starts_with("Reasoning Effort: Max"), "{r}");
    let r = post_json(
        gw.addr,
        "/v1/responses",
        &json!({"input": "hi", "reasoning": {"effort": 7}}),
    );
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("reasoning.effort"))
    );
}

#[test]
fn admission_caps_upstream_concurrency_at_max_num_seqs_in_fifo_order() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "4")], &[]);
    let addr = gw.addr;
    let mut workers = Vec::new();
    for i in 0..10 {
        let body = json!({"messages": [{"role": "user", "content": format!("stream {i}")}], "max_tokens": 30, "ignore_eos": true,
                          "stream": true, "chat_template_kwargs": {"enable_thinking": false}});
        workers.push(std::thread::spawn(move || {
            let mut s = Streaming::open(
                addr,
                "POST",
                "/v1/chat/completions",
                &[("Content-Type", "application/json")],
                body.to_string().as_bytes(),
            );
            let _ = s.next_chunk();
            let first_byte = std::time::Instant::now();
            let rest = s.read_all();
            (i, first_byte, rest)
        }));
        // Arrival order is the submission order.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ready = request(addr, "GET", "/ready", &[], b"").json();
            let admitted =
                ready["admission"]["in_flight"].as_u64().unwrap() + ready["admission"]["queued"].as_u64().unwrap();
            if admitted as usize > i || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut max_running = 0;
    let mut max_upstream = 0;
    let mut done = 0;
    while done < 10 {
        let s = sim.state();
        max_running = max_running.max(s["running"].as_u64().unwrap());
        // Running plus waiting is every request vLLM holds at that instant.
        max_upstream = max_upstream.max(s["running"].as_u64().unwrap() + s["waiting"].as_u64().unwrap());
        done = workers.iter().filter(|w| w.is_finished()).count();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut results: Vec<(usize, std::time::Instant, Vec<u8>)> =
        workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(max_running, 2, "the two slots were used");
    assert_eq!(
        max_upstream, 2,
        "never more than MAX_NUM_SEQS upstream at once; the gateway holds the queue"
    );
    for (_, _, body) in &results {
        assert_eq!(sse_data(body).last().map(String::as_str), Some("[DONE]"));
    }
    // FIFO: the order in which streams got their first byte follows the submission order.
    results.sort_by_key(|r| r.1);
    let order: Vec<usize> = results.iter().map(|r| r.0).collect();
    let inversions = order.windows(2).filter(|w| w[0] > w[1] + 1).count();
    assert_eq!(inversions, 0, "first-byte order {order:?}");
}

#[test]
fn full_queue_is_429_and_the_deadline_is_503_with_retry_after() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "1")], &[("QUEUE_DEPTH", "1"), ("QUEUE_TIMEOUT", "1")]);
    let addr = gw.addr;
    let long = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut holders: Vec<Streaming> = (0..2)
        .map(|_| {
            let mut s = Streaming::open(
                addr,
                "POST",
                "/v1/chat/completions",
                &[("Content-Type", "application/json")],
                long.to_string().as_bytes(),
            );
            s.next_chunk().unwrap();
            s
        })
        .collect();
    sim.wait_state("2 running", |s| s["running"] == 2);
    let queued = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(addr, "GET", "/ready", &[], b"").json()["admission"]["queued"] != 1 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
    let full = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(full.status, 429);
    assert_eq!(full.header("retry-after"), Some("2"));
    assert_eq!(full.json()["error"]["type"], "Too Many Requests");
    let timed_out = queued.join().unwrap();
    assert_eq!(timed_out.status, 503);
    assert_eq!(timed_out.header("retry-after"), Some("5"));
    assert!(timed_out.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no generation slot"));
    // Permits come back when streaming clients disconnect mid-stream.
    holders.clear();
    sim.wait_state("aborted", |s| s["aborted"] == 2);
    let ok = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert_eq!(ok.status, 200);
    let metrics = request(addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains(r#"sparkgate_admission_rejections_total{reason="queue_full"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"sparkgate_admission_rejections_total{reason="queue_timeout"} 1"#));
}

#[test]
fn a_client_that_leaves_the_queue_frees_its_place_at_once() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "1")], &[("QUEUE_DEPTH", "1")]);
    let addr = gw.addr;
    let long = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let _holders: Vec<Streaming> = (0..2)
        .map(|_| {
            let mut s = Streaming::open(
                addr,
                "POST",
                "/v1/chat/completions",
                &[("Content-Type", "application/json")],
                long.to_string().as_bytes(),
            );
            s.next_chunk().unwrap();
            s
        })
        .collect();
    sim.wait_state("2 running", |s| s["running"] == 2);
    {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        use std::io::Write;
        let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
        write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while request(addr, "GET", "/ready", &[], b"").json()["admission"]["queued"] != 1 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(2));
        }
    } // the queued client disconnects here
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(addr, "GET", "/ready", &[], b"").json()["admission"]["queued"] != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the departed client still holds its place"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // Its place is free: another request can queue (depth 1) instead of getting 429.
    let waiting = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(addr, "GET", "/ready", &[], b"").json()["admission"]["queued"] != 1 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(_holders);
    assert_eq!(waiting.join().unwrap().status, 200);
}

#[test]
fn n_above_capacity_is_refused() {
    let (_sim, gw) = ds_pair(&[], &[]);
    let r = chat(&gw, json!({"messages": [{"role": "user", "content": "hi"}], "n": 3}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "n");
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 3}),
    );
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 2);
}

/// Masks the `"created":<seconds>` field, the one value that differs between two identical runs.
fn mask_created(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("\"created\":") {
        out.push_str(&rest[..i + 10]);
        rest = &rest[i + 10..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        out.push('T');
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

#[test]
fn streams_are_byte_faithful_to_what_vllm_would_send() {
    let sim = Sim::start(
        SIM,
        &[
            "/model",
            "--served-model-name",
            "M",
            "--reasoning-parser",
            "deepseek_v41",
            "--max-num-seqs",
            "8",
        ],
        &[],
    );
    let gw = Gateway::start(
        &sparkgate(),
        "deepseek-v4.1-flash",
        sim.addr(),
        &[("SERVED_MODEL_NAME", "M"), ("MAX_NUM_SEQS", "8")],
    );
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut injected = 0;
    for i in 0..1000 {
        let mut body = json!({"model": "M", "messages": [{"role": "user", "content": format!("question {} about {}", next(1000), i)}],
                              "max_tokens": 1 + next(60), "stream": true});
        match next(4) {
            0 => body["stream_options"] = json!({"include_usage": true}),
            1 => body["chat_template_kwargs"] = json!({"enable_thinking": false}),
            2 => body["reasoning_effort"] = json!("low"),
            _ => {}
        }
        if next(10) == 0 {
            body["n"] = json!(2);
        }
        let id = format!("faithful-{i}");
        let headers = [("Content-Type", "application/json"), ("X-Request-Id", id.as_str())];
        let direct = request(
            sim.addr(),
            "POST",
            "/v1/chat/completions",
            &headers,
            body.to_string().as_bytes(),
        );
        let via = request(
            gw.addr,
            "POST",
            "/v1/chat/completions",
            &headers,
            body.to_string().as_bytes(),
        );
        assert_eq!(via.status, 200);
        assert_eq!(via.header("content-type"), direct.header("content-type"));
        assert_eq!(
            mask_created(&via.text()),
            mask_created(&direct.text()),
            "request {i}: {body}"
        );
        if body.get("stream_options").is_none() {
            injected += 1;
        }
    }
    assert!(
        injected > 600,
        "most requests exercised the injected usage chunk ({injected})"
    );
}

#[test]
fn a_rank_killed_mid_stream_ends_the_stream_with_an_error_event() {
    let (mut sim, gw) = ds_pair(&[("SIM_SPEED", "1")], &[]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let mut got = s.next_chunk().unwrap();
    got.extend(s.next_chunk().unwrap());
    sim.proc.kill();
    got.extend(s.read_all());
    let events = sse_data(&got);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], 502, "{err}");
    // The gateway now answers 502 (upstream gone, nobody restarting it) and /ready says why.
    let r = chat(&gw, json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 502);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ready = request(gw.addr, "GET", "/ready", &[], b"");
        if ready.status == 503 {
            assert_eq!(ready.json()["upstream"]["state"], "unreachable");
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hung_upstream_ends_the_stream_after_the_idle_timeout() {
    let (sim, gw) = ds_pair(
        &[("SIM_SPEED", "1")],
        &[("STREAM_IDLE_TIMEOUT", "1"), ("FIRST_TOKEN_TIMEOUT", "1")],
    );
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let mut got = s.next_chunk().unwrap();
    sim.fault("/fault/hang");
    got.extend(s.read_all());
    let events = sse_data(&got);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], 504);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("STREAM_IDLE_TIMEOUT"),
        "{err}"
    );
    // The gateway dropped the upstream request: vLLM sees the abort once it steps again.
    sim.fault("/fault/clear");
    sim.wait_state("aborted", |s| s["aborted"] == 1);
    // A hang before the first token hits FIRST_TOKEN_TIMEOUT.
    sim.fault("/fault/hang");
    let r = post_json(gw.addr, "/v1/chat/completions", &body);
    let events = sse_data(&r.body);
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("FIRST_TOKEN_TIMEOUT"),
        "{err}"
    );
    sim.fault("/fault/clear");
}

#[test]
fn upstream_error_events_pass_through_unchanged() {
    let (sim, gw) = ds_pair(&[], &[]);
    sim.fault("/fault/stream-error?after_tokens=2");
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 20}),
    );
    let events = sse_data(&r.body);
    assert_eq!(
        events[events.len() - 2],
        r#"{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}"#
    );
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}),
    );
    assert_eq!(r.status, 500, "upstream errors pass through with their status");
    assert_eq!(r.json()["error"]["type"], "InternalServerError");
}

#[test]
fn gateway_errors_use_the_envelope() {
    let (_sim, gw) = ds_pair(&[], &[("MAX_BODY_BYTES", "2048")]);
    let a = gw.addr;
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        b"{not json",
    );
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (400, json!("Bad Request"))
    );
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "text/plain")],
        b"{}",
    );
    assert_eq!(
        r.json()["error"]["message"],
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    );
    let big = format!(
        "{{\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
        "x".repeat(4096)
    );
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        big.as_bytes(),
    );
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (413, json!(413)));
    let r = request(a, "GET", "/nowhere", &[], b"");
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (404, json!(404)));
    let r = request(a, "GET", "/v1/chat/completions", &[], b"");
    assert_eq!(r.status, 405);
    let r = chat(&gw, json!({"model": "gpt-4", "messages": [], "stream": true}));
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.text(),
        r#"{"error":{"message":"The model `gpt-4` does not exist. Valid aliases: DeepSeek-v4.1-Flash-EXL3.","type":"NotFoundError","param":"model","code":404}}"#
    );
    // Upstream validation errors pass through unchanged.
    let r = chat(&gw, json!({"messages": "nope"}));
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (400, json!("Bad Request"))
    );
}

#[test]
fn request_ids_models_aliases_and_passthrough_routes() {
    let (_sim, gw) = ds_pair(&[], &[("MODEL_ALIASES", "ds,deepseek")]);
    let a = gw.addr;
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json"), ("X-Request-Id", "my-id-1")],
        json!({"model": "ds", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.header("x-request-id"), Some("my-id-1"));
    let b = r.json();
    assert_eq!(b["id"], "chatcmpl-my-id-1", "the id reached vLLM");
    assert_eq!(b["model"], "DeepSeek-v4.1-Flash-EXL3", "the alias was rewritten");
    let r = chat(
        &gw,
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert!(
        r.header("x-request-id").unwrap().starts_with("sg-"),
        "generated when absent"
    );
    let models = request(a, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["id"], "DeepSeek-v4.1-Flash-EXL3");
    let t = post_json(a, "/tokenize", &json!({"model": "deepseek", "prompt": "hello"})).json();
    assert!(t["count"].as_u64().unwrap() > 0);
    assert_eq!(
        post_json(a, "/tokenize", &json!({"model": "gpt", "prompt": "x"})).status,
        404
    );
    let c = post_json(a, "/v1/completions", &json!({"model": "ds", "prompt": "Once"})).json();
    assert_eq!(c["usage"]["completion_tokens"], 16);
    assert_eq!(request(a, "GET", "/health", &[], b"").status, 200);
}

#[test]
fn api_keys_admin_token_and_rate_limit() {
    let (_sim, gw) = ds_pair(
        &[],
        &[
            ("API_KEYS", "k1,k2"),
            ("ADMIN_TOKEN", "adm"),
            ("RATE_LIMIT_RPM", "60"),
            ("RATE_LIMIT_BURST", "2"),
        ],
    );
    let a = gw.addr;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).to_string();
    let r = request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (401, json!(401)));
    let auth = [("Content-Type", "application/json"), ("Authorization", "Bearer k2")];
    let r1 = request(a, "POST", "/v1/chat/completions", &auth, body.as_bytes());
    assert_eq!(r1.status, 200);
    assert_eq!(r1.header("x-ratelimit-limit-requests"), Some("60"));
    assert_eq!(r1.header("x-ratelimit-remaining-requests"), Some("1"));
    assert_eq!(
        request(a, "POST", "/v1/chat/completions", &auth, body.as_bytes()).status,
        200
    );
    let limited = request(a, "POST", "/v1/chat/completions", &auth, body.as_bytes());
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("1"));
    assert_eq!(limited.header("x-ratelimit-remaining-requests"), Some("0"));
    let other_key = [("Content-Type", "application/json"), ("Authorization", "Bearer k1")];
    assert_eq!(
        request(a, "POST", "/v1/chat/completions", &other_key, body.as_bytes()).status,
        200,
        "limits are per key"
    );
    assert_eq!(request(a, "GET", "/admin/status", &[], b"").status, 401);
    assert_eq!(
        request(a, "GET", "/admin/status", &[("Authorization", "Bearer k1")], b"").status,
        401
    );
    let s = request(a, "GET", "/admin/status", &[("Authorization", "Bearer adm")], b"");
    assert_eq!(s.status, 200);
    assert_eq!(s.json()["admission"]["capacity"], 2);
    assert_eq!(request(a, "GET", "/health", &[], b"").status, 200, "health is open");
    let log = gw.proc.log().join("\n");
    assert!(
        !log.contains("Bearer k2") && !log.contains("adm\""),
        "no secrets in logs"
    );
}

#[test]
fn ready_reports_an_absent_upstream_and_requests_get_502() {
    let gw = Gateway::start_unready(&sparkgate(), "deepseek-v4.1-flash", "http://127.0.0.1:9", &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ready = loop {
        let r = request(gw.addr, "GET", "/ready", &[], b"");
        if r.json()["upstream"]["state"] == "unreachable" {
            break r;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ready.status, 503);
    let r = post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 502);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("http://127.0.0.1:9"));
}

#[test]
fn sigterm_drains_and_exits() {
    let (_sim, mut gw) = ds_pair(&[("SIM_SPEED", "4")], &[("DRAIN_TIMEOUT", "30")]);
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "ignore_eos": true, "stream": true});
    let mut s = Streaming::open(
        gw.addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    s.next_chunk().unwrap();
    let pid = gw.proc.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    gw.proc.wait_for("draining");
    // The stream in flight completes; new connections are refused.
    let events = sse_data(&s.read_all());
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(try_request(gw.addr, "GET", "/health", &[], b"").is_none());
    assert!(gw.proc.wait_exit(Duration::from_secs(30)).success());
}
