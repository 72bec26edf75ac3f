//! Gateway admission against vllm-sim: MAX_NUM_SEQS upstream at most, FIFO order within a client
//! and a fair queue across clients (a lone client before another's burst drains), 429 on a full
//! queue, 503 at the deadline, disconnects while queued or mid-stream freeing their slots, and
//! priorities under SCHEDULING_POLICY=priority.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use sparkgate_tests::http::{hold_streams, post_json, request, sse_data, HttpResponse, Streaming};

mod common;
use common::{chat, ds_pair};

#[test]
fn admission_caps_upstream_concurrency_at_max_num_seqs_in_fifo_order() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "4")], &[]);
    let addr = gw.addr;
    let mut workers = Vec::new();
    for i in 0..10 {
        let body = json!({"messages": [{"role": "user", "content": format!("stream {i}")}], "max_tokens": 30, "ignore_eos": true,
                          "stream": true, "chat_template_kwargs": {"enable_thinking": false}});
        workers.push(std::thread::spawn(move || {
            let mut s = Streaming::post_json(addr, "/v1/chat/completions", &body);
            let _ = s.next_chunk();
            let first_byte = std::time::Instant::now();
            let rest = s.read_all();
            (i, first_byte, rest)
        }));
        // Arrival order is the submission order.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ready = request(addr, "GET", "/admin/status", &[], b"").json();
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

/// Waits until the gateway's queue holds `n` requests.
fn wait_queued(addr: SocketAddr, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(addr, "GET", "/admin/status", &[], b"").json()["admission"]["queued"] != n {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A one-token chat from a thread of its own, once it waits in the gateway's queue.
fn queue_one(addr: SocketAddr) -> std::thread::JoinHandle<HttpResponse> {
    let queued = std::thread::spawn(move || {
        post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
    });
    wait_queued(addr, 1);
    queued
}

#[test]
fn full_queue_is_429_and_the_deadline_is_503_with_retry_after() {
    let (sim, gw) = ds_pair(&[("SIM_SPEED", "1")], &[("QUEUE_DEPTH", "1"), ("QUEUE_TIMEOUT", "1")]);
    let addr = gw.addr;
    let long = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut holders = hold_streams(addr, 2, &long);
    sim.wait_state("2 running", |s| s["running"] == 2);
    let queued = queue_one(addr);
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
    let _holders = hold_streams(addr, 2, &long);
    sim.wait_state("2 running", |s| s["running"] == 2);
    {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        use std::io::Write;
        let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
        write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        wait_queued(addr, 1);
    } // the queued client disconnects here
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(addr, "GET", "/admin/status", &[], b"").json()["admission"]["queued"] != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the departed client still holds its place"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // Its leaving is on record: a log line and a count.
    gw.proc.wait_for("the client left before its answer began");
    assert!(
        gw.proc
            .log()
            .iter()
            .any(|l| l.contains("the client left before its answer began") && l.contains("stage=\"queue\"")),
        "{}",
        gw.proc.log().join("\n")
    );
    let metrics = request(addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains(r#"sparkgate_client_gone_total{stage="queue"} 1"#),
        "{metrics}"
    );
    // Its place is free: another request can queue (depth 1) instead of getting 429.
    let waiting = queue_one(addr);
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

/// Eight streams of client `burst`, then one of client `lone` with `lone_header` (each admitted
/// or queued before the next is sent), MAX_NUM_SEQS 2, the gateway with `env`: the clients in
/// the order their streams began.
fn burst_then_lone(env: &[(&str, &str)], lone_header: (&'static str, &'static str)) -> Vec<&'static str> {
    let (_sim, gw) = ds_pair(&[("SIM_SPEED", "4")], env);
    let addr = gw.addr;
    let mut workers = Vec::new();
    let clients = std::iter::repeat_n("burst", 8).chain(["lone"]);
    for (i, who) in clients.enumerate() {
        let body = json!({"messages": [{"role": "user", "content": format!("stream {i}")}], "max_tokens": 30,
                          "ignore_eos": true, "stream": true, "chat_template_kwargs": {"enable_thinking": false}});
        workers.push(std::thread::spawn(move || {
            let mut headers = vec![("Content-Type", "application/json"), ("x-sparkgate-client", who)];
            if who == "lone" {
                headers.push(lone_header);
            }
            let mut s = Streaming::open(
                addr,
                "POST",
                "/v1/chat/completions",
                &headers,
                body.to_string().as_bytes(),
            );
            let _ = s.next_chunk();
            let first_byte = std::time::Instant::now();
            assert_eq!(sse_data(&s.read_all()).last().map(String::as_str), Some("[DONE]"));
            (who, first_byte)
        }));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ready = request(addr, "GET", "/admin/status", &[], b"").json();
            let seen =
                ready["admission"]["in_flight"].as_u64().unwrap() + ready["admission"]["queued"].as_u64().unwrap();
            if seen as usize > i {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "request {i} reached admission");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut began: Vec<(&str, std::time::Instant)> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    began.sort_by_key(|b| b.1);
    began.into_iter().map(|b| b.0).collect()
}

#[test]
fn a_lone_client_is_served_before_another_clients_burst_drains() {
    let plain = ("x-lone", "1");
    let order = burst_then_lone(&[("QUEUE_POLICY", "fair")], plain);
    let lone = order.iter().position(|w| *w == "lone").unwrap();
    // Two burst streams run, six wait; the lone client takes the second slot that frees.
    assert!(lone <= 3, "the lone stream began {}th of 9: {order:?}", lone + 1);
    let order = burst_then_lone(&[("QUEUE_POLICY", "fifo")], plain);
    assert_eq!(order.last(), Some(&"lone"), "FIFO: behind the whole burst: {order:?}");
}

#[test]
fn under_priority_scheduling_a_lower_priority_goes_before_the_queue() {
    let urgent = ("X-Vllm-Priority", "-1");
    let fifo_priority = [("QUEUE_POLICY", "fifo"), ("SCHEDULING_POLICY", "priority")];
    let order = burst_then_lone(&fifo_priority, urgent);
    let lone = order.iter().position(|w| *w == "lone").unwrap();
    // Two burst streams run, six wait; the urgent one takes the first slot that frees.
    assert!(lone <= 3, "the urgent stream began {}th of 9: {order:?}", lone + 1);
    let order = burst_then_lone(&[("QUEUE_POLICY", "fifo")], urgent);
    assert_eq!(
        order.last(),
        Some(&"lone"),
        "fcfs ignores priorities, as vLLM does: {order:?}"
    );
}
