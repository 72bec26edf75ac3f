//! The groups' tests: a held slot goes to its request, and a full group is worth waiting for
//! only while no other sits idle.

use super::group::{held, leases};
use super::*;
use crate::control::admission::{Admission, QueueLimits};
use crate::control::fairq::Client;
use sparkgate_config::SpecMethod;

/// Groups `a` and `b` of one slot each, without supervisors (open), routed by affinity.
fn two_groups_of_one_slot() -> Arc<Groups> {
    let group = |name| {
        Group::new(
            name,
            Upstream::new("http://127.0.0.1:9", None),
            None,
            SpecMethod::None,
            1,
        )
    };
    Arc::new(Groups::new(
        vec![group("a"), group("b")],
        GroupRouting::Affinity,
        Duration::from_secs(2),
    ))
}

#[test]
fn a_slot_held_at_the_grant_goes_to_its_request_not_to_a_lease_that_comes_first() {
    let groups = two_groups_of_one_slot();
    let limits = QueueLimits {
        depth: 10,
        bytes: 1000,
        timeout: Duration::from_secs(60),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (admission, client) = (Admission::new(2, limits), Client::new("c", 1));
    let prefer = Preference {
        home: Arc::new(Affine {
            groups: groups.clone(),
            index: 0,
        }),
        wait: Duration::from_secs(2),
    };
    // W prefers a and is admitted; X is admitted next and leases before W does.
    let mut w = rt
        .block_on(admission.acquire_for((1, 10, ModelId(0)), &client, Some(prefer)))
        .unwrap();
    let mut x = rt.block_on(admission.acquire(1, 10, &client)).unwrap();
    let x_lease = groups.lease(None, x.take_reservation(), 1, ModelId(0)).unwrap();
    assert_eq!(x_lease.group().name, "b", "a's slot is held for W");
    let w_lease = groups.lease(None, w.take_reservation(), 1, ModelId(0)).unwrap();
    assert_eq!(w_lease.group().name, "a");
    let slots = groups.all()[0].slots.load(Ordering::Acquire);
    assert_eq!((leases(slots), held(slots)), (1, 0), "the held slot became W's lease");
    drop(w_lease);
    drop(w);
    assert_eq!(
        groups.all()[0].slots.load(Ordering::Acquire),
        0,
        "nothing left once W ends"
    );
}

#[test]
fn a_full_group_is_worth_waiting_for_only_while_no_other_sits_idle() {
    let groups = two_groups_of_one_slot();
    let a = Affine {
        groups: groups.clone(),
        index: 0,
    };
    let _on_a = groups.all()[0].try_lease(1).unwrap();
    assert!(!a.full(), "b sits idle: no request waits for a");
    let _on_b = groups.all()[1].try_lease(1).unwrap();
    assert!(a.full());
}
