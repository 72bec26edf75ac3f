//! The admission queue's order: a weighted fair queue over clients (start-time fair queueing).
//! Each request gets a start tag — its client's last finish tag, or the queue's virtual time if
//! that is later — and charges its client `n ÷ weight`; the queue admits the smallest start tag
//! first (ties: who came first). So a client's own requests keep their order, a client's burst
//! queues behind itself, and a client that arrives while the burst waits starts at the virtual
//! time, beside the burst's head rather than behind its tail. A request that was admitted once
//! and went back (its group went down) goes before every tagged one, the last one back first.
//! With one shared client for everyone (QUEUE_POLICY=fifo) the tags rise with arrival: FIFO.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Virtual time one sequence of a weight-1 client takes; a multiple of every weight up to
/// 1000 would be exact, this is close enough (a weight-1000 client is charged 1048 per
/// sequence, not 1048.576).
const UNIT: u64 = 1 << 20;

/// A finish tag map this long is swept of clients whose tags the virtual time passed (they
/// would start at the virtual time anyway), and cleared if that was not enough: memory stays
/// bounded when many distinct clients arrive during one long backlog, at the price of their
/// history.
const SWEEP_AT: usize = 4096;

/// Who a request is for the queue, and its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    id: Arc<str>,
    weight: u32,
}

impl Client {
    /// A client of `weight` (at least 1).
    pub fn new(id: impl Into<Arc<str>>, weight: u32) -> Client {
        Client {
            id: id.into(),
            weight: weight.max(1),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Where a waiter stands; smaller goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Place {
    /// Admitted once and back: before every tagged waiter, the last one back first.
    Back(Reverse<u64>),
    /// A start tag, then the arrival number.
    Tagged { start: u64, seq: u64 },
}

#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    /// Waiting ids by place.
    order: BTreeMap<Place, u64>,
    /// The start tag of the last request admitted.
    vtime: u64,
    /// Each client's finish tag: where its next request starts at the earliest.
    finish: HashMap<Arc<str>, u64>,
    seq: u64,
}

impl FairQueue {
    /// Charges `client` for `n` sequences and returns the place its request takes.
    pub(crate) fn tag(&mut self, client: &Client, n: u32) -> Place {
        if self.order.is_empty() {
            // Nobody waits: there is no order to keep, and history would only be a debt.
            self.finish.clear();
        } else if self.finish.len() >= SWEEP_AT {
            let now = self.vtime;
            self.finish.retain(|_, f| *f > now);
            if self.finish.len() >= SWEEP_AT {
                self.finish.clear();
            }
        }
        let last = self.finish.get(&client.id).copied().unwrap_or(0);
        let start = last.max(self.vtime);
        let cost = u64::from(n.max(1)) * UNIT / u64::from(client.weight);
        self.finish.insert(client.id.clone(), start + cost);
        self.seq += 1;
        Place::Tagged { start, seq: self.seq }
    }

    /// The place of a request that was admitted and came back.
    pub(crate) fn back(&mut self) -> Place {
        self.seq += 1;
        Place::Back(Reverse(self.seq))
    }

    pub(crate) fn push(&mut self, place: Place, id: u64) {
        self.order.insert(place, id);
    }

    /// The waiter that goes next.
    pub(crate) fn first(&self) -> Option<u64> {
        self.order.first_key_value().map(|(_, id)| *id)
    }

    /// Takes the first waiter out: it is admitted, and the virtual time moves to its tag.
    pub(crate) fn pop_first(&mut self) {
        if let Some((place, _)) = self.order.pop_first() {
            self.admitted(place);
        }
    }

    /// The request at `place` was admitted.
    fn admitted(&mut self, place: Place) {
        if let Place::Tagged { start, .. } = place {
            self.vtime = self.vtime.max(start);
        }
    }

    /// A waiter left without being admitted (its deadline, or its client went away); what it
    /// was charged stays charged.
    pub(crate) fn remove(&mut self, place: Place) {
        self.order.remove(&place);
    }

    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues `(client, n)` requests in turn; ids are their indexes.
    fn queue(requests: &[(&Client, u32)]) -> FairQueue {
        let mut q = FairQueue::default();
        for (id, (client, n)) in requests.iter().enumerate() {
            let place = q.tag(client, *n);
            q.push(place, id as u64);
        }
        q
    }

    fn drain(q: &mut FairQueue) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(id) = q.first() {
            q.pop_first();
            out.push(id);
        }
        out
    }

    #[test]
    fn a_lone_request_waits_beside_a_burst_not_behind_it() {
        let (burst, lone) = (Client::new("burst", 1), Client::new("lone", 1));
        let mut requests: Vec<(&Client, u32)> = vec![(&burst, 1); 16];
        requests.push((&lone, 1));
        let mut q = queue(&requests);
        let order = drain(&mut q);
        assert_eq!(order[..2], [0, 16], "the lone request goes second, not seventeenth");
        assert_eq!(order[2..], (1..16).collect::<Vec<u64>>(), "the burst in its own order");
    }

    #[test]
    fn weights_share_the_queue_in_proportion_and_a_single_client_is_fifo() {
        let (heavy, light) = (Client::new("heavy", 3), Client::new("light", 1));
        let mut requests = Vec::new();
        for _ in 0..8 {
            requests.push((&heavy, 1));
            requests.push((&light, 1));
        }
        let mut q = queue(&requests);
        let first_eight: Vec<u64> = drain(&mut q).into_iter().take(8).collect();
        let heavy_served = first_eight.iter().filter(|id| *id % 2 == 0).count();
        assert_eq!(heavy_served, 6, "3:1 while both wait: {first_eight:?}");
        let everyone = Client::new("", 1);
        let mut q = queue(&[(&everyone, 2), (&everyone, 1), (&everyone, 4)]);
        assert_eq!(drain(&mut q), [0, 1, 2]);
    }

    #[test]
    fn a_client_back_from_idle_starts_at_the_virtual_time_and_requeued_ones_go_first() {
        let (a, b) = (Client::new("a", 1), Client::new("b", 1));
        let mut q = queue(&[(&a, 1), (&a, 1), (&a, 1)]);
        drain(&mut q);
        // `b` never ran; `a`'s history is no debt to `b`, nor credit to `a` later.
        let pa = q.tag(&a, 1);
        let pb = q.tag(&b, 1);
        q.push(pa, 10);
        q.push(pb, 11);
        let back1 = q.back();
        q.push(back1, 20);
        let back2 = q.back();
        q.push(back2, 21);
        assert_eq!(drain(&mut q), [21, 20, 10, 11]);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_departed_waiter_leaves_its_place_and_client_history_stays_bounded() {
        let c = Client::new("c", 1);
        let mut q = FairQueue::default();
        let p = q.tag(&c, 1);
        q.push(p, 1);
        q.remove(p);
        assert_eq!(q.first(), None);
        for i in 0..10 {
            let place = q.tag(&Client::new(format!("idle{i}"), 1), 1);
            q.admitted(place);
        }
        assert_eq!(q.finish.len(), 1, "with nobody waiting, history is forgotten");
        let waiting = q.tag(&c, 1);
        q.push(waiting, 2);
        for i in 0..(SWEEP_AT + 10) {
            let place = q.tag(&Client::new(format!("c{i}"), 1), 1);
            q.admitted(place);
        }
        assert!(q.finish.len() <= SWEEP_AT, "{}", q.finish.len());
        assert_eq!(q.first(), Some(2), "the waiter keeps its place");
    }
}
