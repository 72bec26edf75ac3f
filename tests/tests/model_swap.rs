//! Two models on one pair (MODELS, issue #50), their ranks vllm-sim processes on loopback: a
//! request for the model not loaded waits while the loaded one drains and the other is swapped
//! in; clients of both models alternating are all answered within the cap; a burst for the other
//! model is served after one swap in arrival order; the manual policy and a key limited to one
//! model refuse in the route's envelope and never swap; ranks that fail to start bring the old
//! model back and answer the waiters 503; a swap asked during a backoff goes through; a gateway
//! SIGKILLed mid-swap leaves no rank behind and the next one loads the default.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_tests::harness::Gateway;
use sparkgate_tests::http::{post_json, request, Streaming};
use sparkgate_tests::swapload::{self, Mix, DEEPSEEK, GLM};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn quick() -> Mix {
    Mix {
        duration: Duration::from_secs(60),
        dwell_s: 10,
        drain_s: 1,
        clients: 2,
        load_s: 0.5,
        long_streams: true,
    }
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
           "chat_template_kwargs": {"enable_thinking": false}})
}

fn loaded(gw: &Gateway) -> String {
    let s = gw.status();
    s["models"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["loaded"] == true)
        .and_then(|m| m["name"].as_str())
        .unwrap_or("none")
        .to_owned()
}

fn ask_model(gw: &Gateway, name: &str) -> sparkgate_tests::http::HttpResponse {
    post_json(gw.addr, "/admin/model", &json!({"model": name}))
}

/// A gateway of both models with `sections` as its MODELS_FILE (kept in the directory returned).
fn with_models_file(sections: &str) -> (tempfile::TempDir, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models.env");
    std::fs::write(&models, sections).unwrap();
    let (gw, _) = swapload::start(
        SIM,
        &quick(),
        &[("MODELS_FILE", &models.display().to_string()), ("SIM_SPEED", "instant")],
    );
    (dir, gw)
}

fn serving(gw: &Gateway, model: &str) {
    gw.wait_status(&format!("{model} serving"), |s| {
        s["swap"]["phase"] == "serving" && s["model"] == model && s["ready"] == true
    });
}

#[test]
fn alternating_clients_of_both_models_are_all_answered_within_the_cap() {
    let mix = quick();
    let (gw, control) = swapload::start(SIM, &mix, &[]);
    let out = swapload::run(&gw, control, &mix);
    let answered: u64 = out.answered.iter().map(|(w, s)| w + s).sum();
    assert!(
        out.failures.is_empty(),
        "{} failed of {}: {:?}",
        out.failures.len(),
        answered + out.failures.len() as u64,
        out.failures
    );
    for (m, (whole, streams)) in out.answered.iter().enumerate() {
        assert!(
            *whole > 0 && *streams > 0,
            "model {m} answered {whole} whole and {streams} streams"
        );
    }
    assert!(
        out.peak <= swapload::MAX_NUM_SEQS && out.peak > 0,
        "rank 0 held {} at once",
        out.peak
    );
    // Streams longer than the drain were cut by the swaps and continued after them, whole.
    assert!(
        out.resumed > 0 && out.long_answered > 0,
        "resumed {}, long answered {}",
        out.resumed,
        out.long_answered
    );
    let bound = mix.duration.as_secs().div_ceil(mix.dwell_s) + 1;
    assert!(
        (2..=bound).contains(&out.swaps),
        "{} swaps in {:?} (dwell {} s)",
        out.swaps,
        mix.duration,
        mix.dwell_s
    );
}

#[test]
fn a_burst_for_the_other_model_is_served_after_one_swap_in_arrival_order() {
    let mix = Mix {
        dwell_s: 600,
        ..quick()
    };
    let (gw, _) = swapload::start(SIM, &mix, &[("SIM_SPEED", "1")]);
    // The loaded model has work: the burst waits behind it.
    let mut long = Streaming::post_json(
        gw.addr,
        "/v1/chat/completions",
        &json!({"model": DEEPSEEK,
        "messages": [{"role": "user", "content": "a long one"}], "max_tokens": 60, "stream": true}),
    );
    let t0 = Instant::now();
    let burst: Vec<_> = (0..20)
        .map(|i| {
            let addr = gw.addr;
            let h = std::thread::spawn(move || {
                let body = json!({"model": GLM, "messages": [{"role": "user", "content": format!("burst {i}")}],
                                  "max_tokens": 4, "stream": true, "temperature": 0});
                let mut s = Streaming::post_json(addr, "/v1/chat/completions", &body);
                let first = s.next_chunk().map(|_| t0.elapsed());
                let rest = s.read_all();
                (s.status, first, String::from_utf8_lossy(&rest).contains("[DONE]"))
            });
            // Each arrives after the one before it is queued.
            gw.wait_status(&format!("{} queued", i + 1), |s| s["admission"]["queued"] == i + 1);
            h
        })
        .collect();
    assert_eq!(
        loaded(&gw),
        DEEPSEEK,
        "no swap while the loaded model works within its dwell"
    );
    long.read_all();
    let seen: Vec<(u16, Option<Duration>, bool)> = burst.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, (status, _, done)) in seen.iter().enumerate() {
        assert_eq!((*status, *done), (200, true), "burst {i}");
    }
    // Two slots: each request's first byte comes no later than the one two places behind it.
    let firsts: Vec<Duration> = seen.iter().map(|s| s.1.expect("a first byte")).collect();
    for i in 0..firsts.len() - 2 {
        assert!(
            firsts[i] <= firsts[i + 2],
            "request {i} started after request {}: {firsts:?}",
            i + 2
        );
    }
    assert_eq!(swapload::sum(&gw, "sparkgate_model_swaps_total"), 1);
    assert_eq!(loaded(&gw), GLM);
}

#[test]
fn the_manual_policy_answers_the_other_model_503_until_an_operator_swaps() {
    let (gw, _) = swapload::start(SIM, &quick(), &[("SWAP_POLICY", "manual"), ("SIM_SPEED", "instant")]);
    let r = post_json(gw.addr, "/v1/chat/completions", &chat(GLM));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("30"));
    assert!(
        r.text()
            .contains("an operator loads it with `sparkgate model glm-5.3-flash`"),
        "{}",
        r.text()
    );
    // Anthropic's route answers in its own envelope.
    let m = post_json(
        gw.addr,
        "/v1/messages",
        &json!({"model": GLM, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        (m.status, m.json()["type"].as_str()),
        (503, Some("error")),
        "{}",
        m.text()
    );
    assert_eq!(post_json(gw.addr, "/v1/chat/completions", &chat(DEEPSEEK)).status, 200);
    let a = ask_model(&gw, "glm-5.3-flash");
    assert_eq!(a.status, 202, "{}", a.text());
    serving(&gw, GLM);
    assert_eq!(
        post_json(gw.addr, "/v1/chat/completions", &chat(GLM)).json()["model"],
        GLM
    );
    assert_eq!(post_json(gw.addr, "/v1/chat/completions", &chat(DEEPSEEK)).status, 503);
    assert_eq!(ask_model(&gw, GLM).status, 200, "already loaded");
    assert_eq!(ask_model(&gw, "qwen").status, 400);
    assert_eq!(swapload::sum(&gw, "sparkgate_model_swaps_total"), 1);
}

#[test]
fn a_key_limited_to_one_model_is_refused_the_other_and_never_swaps() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "alice sk-alice models=glm-5.3-flash\nbob sk-bob\n").unwrap();
    let (gw, _) = swapload::start(
        SIM,
        &quick(),
        &[("API_KEYS_FILE", &file.display().to_string()), ("SIM_SPEED", "instant")],
    );
    let as_alice = |path: &str, body: &Value| {
        request(
            gw.addr,
            "POST",
            path,
            &[
                ("Authorization", "Bearer sk-alice"),
                ("Content-Type", "application/json"),
            ],
            body.to_string().as_bytes(),
        )
    };
    let r = as_alice("/v1/chat/completions", &chat(DEEPSEEK));
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("may not use the model `DeepSeek-v4.1-Flash-EXL3`"),
        "{}",
        r.text()
    );
    let m = as_alice(
        "/v1/messages",
        &json!({"model": DEEPSEEK, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        (m.status, m.json()["error"]["type"].as_str()),
        (403, Some("permission_error")),
        "{}",
        m.text()
    );
    let listed = request(
        gw.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sk-alice")],
        b"",
    )
    .json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [GLM]);
    let all = request(gw.addr, "GET", "/v1/models", &[("Authorization", "Bearer sk-bob")], b"").json();
    assert_eq!(all["data"].as_array().unwrap().len(), 2);
    assert_eq!(all["object"], "list");
    assert_eq!(all["data"][1]["permission"][0]["object"], "model_permission");
    // No swap came of alice's refused requests.
    assert_eq!(loaded(&gw), DEEPSEEK);
    assert_eq!(swapload::sum(&gw, "sparkgate_model_swaps_total"), 0);
    // Her own model is swapped in for her.
    assert_eq!(as_alice("/v1/chat/completions", &chat(GLM)).json()["model"], GLM);
}

#[test]
fn ranks_that_fail_to_start_bring_the_old_model_back_and_answer_the_waiters_503() {
    let (_dir, gw) = with_models_file("[glm-5.3-flash]\nVLLM_BIN=/bin/false\n");
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let addr = gw.addr;
            std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &chat(GLM)))
        })
        .collect();
    for w in waiters {
        let r = w.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(
            r.text().contains("could not be loaded: its ranks failed to start"),
            "{}",
            r.text()
        );
    }
    serving(&gw, DEEPSEEK);
    assert_eq!(
        post_json(gw.addr, "/v1/chat/completions", &chat(DEEPSEEK)).json()["model"],
        DEEPSEEK
    );
    assert!(gw.proc.has_line("swap_failed"), "the failure is an event");
}

#[test]
fn a_swap_asked_during_a_restart_backoff_goes_through() {
    let (gw, _) = swapload::start(
        SIM,
        &quick(),
        &[("RESTART_BACKOFF_INITIAL", "30"), ("SIM_SPEED", "instant")],
    );
    gw.signal_rank(0, "-KILL");
    gw.wait_status("backing off", |s| s["supervisor"]["state"] == "backoff");
    let a = ask_model(&gw, "glm-5.3-flash");
    assert_eq!(a.status, 202, "{}", a.text());
    serving(&gw, GLM);
    assert_eq!(
        post_json(gw.addr, "/v1/chat/completions", &chat(GLM)).json()["model"],
        GLM
    );
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
}

#[test]
fn a_gateway_killed_mid_swap_leaves_no_rank_and_the_next_loads_the_default() {
    let logs = tempfile::tempdir().unwrap();
    let log_dir = logs.path().display().to_string();
    let mix = Mix { load_s: 3.0, ..quick() };
    let (mut gw, _) = swapload::start(SIM, &mix, &[("LOG_DIR", &log_dir), ("SIM_SPEED", "instant")]);
    assert_eq!(ask_model(&gw, "glm-5.3-flash").status, 202);
    let s = gw.wait_status("GLM's ranks loading", |s| {
        s["swap"]["phase"] == "loading"
            && s["groups"][1]["supervisor"]["ranks"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
    });
    let pids: Vec<u32> = s["groups"][1]["supervisor"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["pid"].as_u64().map(|p| p as u32))
        .collect();
    assert!(!pids.is_empty());
    gw.proc.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pids.iter().all(|p| !alive(*p)), "ranks left running: {pids:?}");
    let (next, _) = swapload::start(SIM, &quick(), &[("LOG_DIR", &log_dir), ("SIM_SPEED", "instant")]);
    serving(&next, DEEPSEEK);
    assert_eq!(
        post_json(next.addr, "/v1/chat/completions", &chat(DEEPSEEK)).json()["model"],
        DEEPSEEK
    );
}

#[test]
fn an_idle_model_is_unloaded_and_the_next_request_loads_its_own() {
    let (gw, _) = swapload::start(SIM, &quick(), &[("IDLE_UNLOAD_S", "1"), ("SIM_SPEED", "instant")]);
    let s = gw.wait_status("nothing loaded", |s| s["swap"]["phase"] == "idle");
    assert_eq!(loaded(&gw), "none", "{s}");
    assert_eq!(s["groups"][0]["supervisor"]["state"], "stopped");
    assert!(gw.proc.has_line("model_unloaded"));
    // The next request loads its model, whichever it is; it sees only delay.
    let r = post_json(gw.addr, "/v1/chat/completions", &chat(GLM));
    assert_eq!((r.status, r.json()["model"].as_str()), (200, Some(GLM)), "{}", r.text());
}

#[test]
fn a_model_that_would_not_fit_is_refused_and_the_loaded_one_keeps_serving() {
    let (_dir, gw) = with_models_file("[glm-5.3-flash]\nWEIGHTS_GIB_PER_RANK=4000\nBOOT_MARGIN_GIB=12\n");
    let r = post_json(gw.addr, "/v1/chat/completions", &chat(GLM));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("needs 4012.0 GiB on each node"), "{}", r.text());
    let a = ask_model(&gw, "glm-5.3-flash");
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(loaded(&gw), DEEPSEEK);
    assert_eq!(
        post_json(gw.addr, "/v1/chat/completions", &chat(DEEPSEEK)).json()["model"],
        DEEPSEEK
    );
    assert_eq!(swapload::sum(&gw, "sparkgate_model_swaps_total"), 0);
}
