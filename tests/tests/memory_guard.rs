//! The memory guard (issue #35): vllm-sim's node memory falls while long prompts are prefilled
//! (SIM_MEMINFO, read by the supervisor as MEMINFO_PATH with memguard on). Three long prompts at
//! once would together take the node under MEM_GUARD_GIB: with the gateway's guard
//! (PREFILL_BYTES_PER_TOKEN) the ones that would cross the line wait in the queue, short prompts
//! sent meanwhile are answered, every prompt is answered and memguard never fires; without it
//! the prefills run together and memguard restarts the group.

use std::time::Duration;

use sparkgate_tests::memreplay::{self, Mix, LINE_GIB};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn replay(guard: bool) -> memreplay::Replay {
    let dir = tempfile::tempdir().unwrap();
    let mix = Mix {
        longs: 3,
        speed: 2.0,
        guard,
        until_memguard: !guard,
    };
    let (gw, meminfo) = memreplay::start(SIM, dir.path(), mix);
    let r = memreplay::run(&gw, &meminfo, mix, Duration::from_secs(90));
    eprintln!("guard {guard}: {r:?}");
    r
}

#[test]
fn long_prompts_wait_for_memory_while_short_ones_are_served_and_memguard_never_fires() {
    let r = replay(true);
    assert_eq!(r.memguard_restarts, 0, "{r:?}");
    assert!(r.lowest_gib >= LINE_GIB, "the node stayed above the line: {r:?}");
    assert_eq!(r.longs.len(), 3, "every long prompt answered: {r:?}");
    assert!(r.longs.iter().all(|a| a.status == 200), "{r:?}");
    assert!(r.holds >= 2, "the second and third long prompts were held: {r:?}");
    assert!(r.shorts.iter().all(|a| a.status == 200), "{r:?}");
    // Short prompts went ahead of the held ones: some were answered before the last long one.
    let last_long = r.longs.iter().map(|a| a.ended).max().unwrap();
    let ahead = r.shorts.iter().filter(|a| a.ended < last_long).count();
    assert!(ahead >= 5, "short prompts answered while long ones waited: {r:?}");
}

#[test]
fn without_the_guard_the_prefills_run_together_and_memguard_restarts_the_group() {
    let r = replay(false);
    assert!(r.lowest_gib < LINE_GIB, "{r:?}");
    assert!(r.memguard_restarts >= 1, "{r:?}");
    assert_eq!(r.holds, 0, "{r:?}");
}
