//! Warm replay (WARM_REPLAY_BYTES, docs/resume.md) in front of supervised vllm-sim ranks: after
//! a restart, a conversation's next turn finds its prefix cached when the gateway replayed the
//! conversation's last request into the new group, and finds nothing cached when it did not.

use sparkgate_tests::test_gateway::TestGateway;
use sparkgate_tests::warm::next_turn_after_restart;

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

#[test]
fn a_restarted_groups_cache_is_warmed_with_the_conversations_last_request() {
    let gw = TestGateway::builder(SIM).env("WARM_REPLAY_BYTES", "1048576").start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let next = next_turn_after_restart(&gw, 3000, true);
    assert!(
        next.cached_tokens + 64 >= next.prompt_tokens && next.cached_tokens > 0,
        "the next turn's prompt is cached but for its new turn: {next:?}"
    );
}

#[test]
fn without_warm_replay_a_restarted_group_has_nothing_cached() {
    let gw = TestGateway::builder(SIM).start();
    gw.wait_status("serving", |s| s["supervisor"]["state"] == "ready");
    let next = next_turn_after_restart(&gw, 3000, false);
    assert!(next.prompt_tokens > 1000, "{next:?}");
    assert_eq!(next.cached_tokens, 0, "a new engine's cache is empty: {next:?}");
    let metrics = sparkgate_tests::http::request(gw.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics
            .lines()
            .any(|l| l == "sparkgate_warm_replays_total{outcome=\"warmed\"} 0"),
        "{metrics}"
    );
}
