//! The admission queue's order: a weighted fair queue over clients (start-time fair queueing).
//! Each request gets a start tag — its client's last finish tag, or the queue's virtual time if
//! that is later — and charges its client its cost ÷ weight: `n` sequences, or (FAIR_CHARGE=
//! tokens, virtual token counting) its prompt's tokens, then the output as it streams and the
//! real usage at the end (`charge`), so a 300k-token prompt costs its client what 3 000 short
//! chats would; the queue admits the smallest start tag
//! first (ties: who came first). So a client's own requests keep their order, a client's burst
//! queues behind itself, and a client that arrives while the burst waits starts at the virtual
//! time, beside the burst's head rather than behind its tail. A request that was admitted once
//! and went back (its group went down) goes before every tagged one, the last one back first.
//! With one shared client for everyone (QUEUE_POLICY=fifo) the tags rise with arrival: FIFO.
//! Under SCHEDULING_POLICY=priority a request's priority comes before its tag (lower sooner, as
//! vLLM orders them): each priority is its own fair queue, served strictly in order.

use std::cmp::Reverse;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::LazyLock;

/// Virtual time one sequence of a weight-1 client takes; a multiple of every weight up to
/// 1000 would be exact, this is close enough (a weight-1000 client is charged 1048 per
/// sequence, not 1048.576).
const UNIT: u64 = 1 << 20;

/// Clients remembered past which those without a waiting request are forgotten (their debt
/// with them): memory stays bounded when many distinct clients pass during one long backlog,
/// and no client's own waiting requests are ever reordered.
const SWEEP_AT: usize = 4096;

/// Client names are kept as keyed hashes: a name can be long (a body's `user`) or secret (an
/// API key), and a per-process key keeps anyone from choosing a name that collides with
/// another client's.
static NAMES: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// The keyed hash a client name is known by (`CLIENT_WEIGHTS` is looked up by it too).
pub(crate) fn name_hash(name: &str) -> u64 {
    NAMES.hash_one(name)
}

/// Virtual time one token of a weight-1 client takes (FAIR_CHARGE=tokens): exact for weights
/// that divide 1000.
const TOKEN_UNIT: u64 = 1000;

/// Who a request is for the queue, and its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    id: u64,
    weight: u32,
    /// The request's priority (0 unless SCHEDULING_POLICY=priority): lower goes first.
    priority: i64,
    /// FAIR_CHARGE=tokens: the tokens the request is charged at admission (its prompt's
    /// estimate); 0: charged by its sequences.
    tokens: u64,
    /// A long request for the interactive reserve (`reserve`).
    pub(crate) long: bool,
}

impl Client {
    /// The client `name` with `weight` (at least 1).
    pub fn new(name: &str, weight: u32) -> Client {
        Client::hashed(name_hash(name), weight)
    }

    pub(crate) fn hashed(id: u64, weight: u32) -> Client {
        Client {
            id,
            weight: weight.max(1),
            priority: 0,
            tokens: 0,
            long: false,
        }
    }

    /// The same client, charged `tokens` for this request instead of its sequences.
    pub(crate) fn costing(self, tokens: u64) -> Client {
        Client {
            tokens: tokens.max(1),
            ..self
        }
    }

    /// The same client, for a request of `priority`.
    pub(crate) fn at(self, priority: i64) -> Client {
        Client { priority, ..self }
    }

    /// The same client, its request long (or not) for the interactive reserve.
    pub(crate) fn long(self, long: bool) -> Client {
        Client { long, ..self }
    }

    /// Who it is (its name's hash).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// Where a waiter stands; smaller goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Place {
    /// Admitted once and back: before every tagged waiter, the last one back first.
    Back(Reverse<u64>),
    /// The request's priority, its start tag, then the arrival number (unique; the client
    /// only says whose it is).
    Tagged {
        priority: i64,
        start: u64,
        seq: u64,
        client: u64,
    },
}

/// What the queue remembers of a client.
#[derive(Debug, Default)]
struct Tally {
    /// Where its next request starts at the earliest.
    finish: u64,
    /// Its requests waiting now.
    waiting: u32,
}

#[derive(Debug)]
pub(crate) struct FairQueue {
    /// Waiting ids by place.
    order: BTreeMap<Place, u64>,
    /// By priority, the start tag of the last request of that priority admitted: each priority
    /// keeps its own virtual time, so a request admitted ahead at another priority does not move
    /// newcomers behind the ones waiting at theirs.
    vtimes: BTreeMap<i64, u64>,
    clients: HashMap<u64, Tally>,
    /// The size at which `clients` is swept next.
    sweep_at: usize,
    seq: u64,
}

impl Default for FairQueue {
    fn default() -> Self {
        FairQueue {
            order: BTreeMap::new(),
            vtimes: BTreeMap::new(),
            clients: HashMap::new(),
            sweep_at: SWEEP_AT,
            seq: 0,
        }
    }
}

impl FairQueue {
    /// Charges `client` for `n` sequences and returns the place its request takes in the
    /// queue (`push` it there).
    pub(crate) fn tag(&mut self, client: &Client, n: u32) -> Place {
        if self.order.is_empty() {
            // Nobody waits: there is no order to keep, and history would only be a debt.
            self.clients.clear();
            self.vtimes.clear();
        } else if self.clients.len() >= self.sweep_at || self.vtimes.len() >= SWEEP_AT {
            self.sweep();
        }
        let cost = match client.tokens {
            0 => u64::from(n.max(1)) * UNIT,
            tokens => tokens.saturating_mul(TOKEN_UNIT),
        } / u64::from(client.weight);
        let tally = self.clients.entry(client.id).or_default();
        let start = tally
            .finish
            .max(self.vtimes.get(&client.priority).copied().unwrap_or(0));
        tally.finish = start + cost;
        tally.waiting += 1;
        self.seq += 1;
        Place::Tagged {
            priority: client.priority,
            start,
            seq: self.seq,
            client: client.id,
        }
    }

    /// Forgets clients the virtual time passed, then, if that was not enough, every client
    /// with nothing waiting; the next sweep comes at twice what is left. Forgets the virtual
    /// time of every priority nobody waits at.
    fn sweep(&mut self) {
        let waiting: std::collections::BTreeSet<i64> = self
            .order
            .keys()
            .filter_map(|p| match p {
                Place::Tagged { priority, .. } => Some(*priority),
                Place::Back(_) => None,
            })
            .collect();
        self.vtimes.retain(|p, _| waiting.contains(p));
        let now = self.vtimes.values().copied().max().unwrap_or(0);
        self.clients.retain(|_, t| t.waiting > 0 || t.finish > now);
        if self.clients.len() >= SWEEP_AT / 2 {
            self.clients.retain(|_, t| t.waiting > 0);
        }
        self.sweep_at = SWEEP_AT.max(self.clients.len() * 2);
    }

    /// Charges (or, settling an estimate, refunds) `client` `tokens` more for a request it was
    /// admitted for: its later requests start that much later. A client the queue forgot (nobody
    /// waited since) has no debt to add to.
    pub(crate) fn charge(&mut self, client: &Client, tokens: i64) {
        let Some(tally) = self.clients.get_mut(&client.id) else {
            return;
        };
        let units = tokens.unsigned_abs().saturating_mul(TOKEN_UNIT) / u64::from(client.weight);
        tally.finish = if tokens >= 0 {
            tally.finish.saturating_add(units)
        } else {
            tally.finish.saturating_sub(units)
        };
    }

    /// The place of a request that was admitted and came back.
    pub(crate) fn back(&mut self) -> Place {
        self.seq += 1;
        Place::Back(Reverse(self.seq))
    }

    pub(crate) fn push(&mut self, place: Place, id: u64) {
        self.order.insert(place, id);
    }

    /// The waiter after `place` in the queue's order (the first for `None`): admission passes
    /// over a waiter that holds out for its preferred group.
    pub(crate) fn after(&self, place: Option<Place>) -> Option<(Place, u64)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let lower = place.map_or(Unbounded, Excluded);
        self.order.range((lower, Unbounded)).next().map(|(p, id)| (*p, *id))
    }

    /// Takes the waiter at `place` out: it is admitted, and the virtual time moves to its tag.
    pub(crate) fn admit(&mut self, place: Place) {
        if self.order.remove(&place).is_some() {
            if let Place::Tagged { priority, start, .. } = place {
                let vtime = self.vtimes.entry(priority).or_default();
                *vtime = (*vtime).max(start);
            }
            self.left(place);
        }
    }

    /// A waiter left without being admitted (its deadline, or its client went away); what it
    /// was charged stays charged.
    pub(crate) fn remove(&mut self, place: Place) {
        if self.order.remove(&place).is_some() {
            self.left(place);
        }
    }

    fn left(&mut self, place: Place) {
        if let Place::Tagged { client, .. } = place {
            if let Some(t) = self.clients.get_mut(&client) {
                t.waiting = t.waiting.saturating_sub(1);
            }
        }
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
        while let Some((place, id)) = q.after(None) {
            q.admit(place);
            out.push(id);
        }
        out
    }

    #[test]
    fn charged_by_tokens_a_long_prompt_costs_its_client_what_many_short_ones_do() {
        let heavy = Client::new("heavy", 1).costing(100_000);
        let chat = |n: &str| Client::new(n, 1).costing(100);
        let (a, b) = (chat("a"), chat("b"));
        // The heavy client's two long prompts arrive first, then each chatter's ten turns.
        let mut requests: Vec<(&Client, u32)> = vec![(&heavy, 1), (&heavy, 1)];
        for _ in 0..10 {
            requests.push((&a, 1));
            requests.push((&b, 1));
        }
        let order = drain(&mut queue(&requests));
        assert_eq!(order[0], 0, "the first long prompt starts with everyone");
        assert_eq!(
            order[order.len() - 1],
            1,
            "its second waits until the chats had their share"
        );
        // Charged by sequences, the second long prompt would go third.
        let by_seq = Client::new("heavy", 1);
        let (sa, sb) = (Client::new("a", 1), Client::new("b", 1));
        let mut requests: Vec<(&Client, u32)> = vec![(&by_seq, 1), (&by_seq, 1)];
        for _ in 0..10 {
            requests.push((&sa, 1));
            requests.push((&sb, 1));
        }
        assert_eq!(drain(&mut queue(&requests))[3], 1);
    }

    /// x and y each have a request admitted and one more waiting behind a bystander; `charge`
    /// runs after the first admissions, before the second requests are tagged.
    fn second_turns(charge: impl Fn(&mut FairQueue, &Client, &Client)) -> Vec<u64> {
        let (x, y, z) = (
            Client::new("x", 1).costing(10),
            Client::new("y", 1).costing(10),
            Client::new("z", 1),
        );
        let mut q = FairQueue::default();
        for (id, c) in [(0, &z), (1, &x), (2, &y)] {
            let place = q.tag(c, 1);
            q.push(place, id);
        }
        let (first, _) = q.after(None).unwrap();
        q.admit(first);
        charge(&mut q, &x, &y);
        for (id, c) in [(3, &x), (4, &y)] {
            let place = q.tag(c, 1);
            q.push(place, id);
        }
        drain(&mut q)
    }

    #[test]
    fn a_charge_after_admission_moves_the_clients_next_request() {
        assert_eq!(second_turns(|_, _, _| {}), [1, 2, 3, 4], "even: x, y, x, y");
        assert_eq!(
            second_turns(|q, x, _| q.charge(x, 1_000)),
            [1, 2, 4, 3],
            "x streamed more than its estimate: its next turn goes after y's"
        );
        assert_eq!(
            second_turns(|q, _, y| q.charge(y, -5)),
            [1, 2, 4, 3],
            "y used less than its estimate: refunded, its next turn goes first"
        );
        second_turns(|q, _, _| q.charge(&Client::new("gone", 1), 5));
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
        assert_eq!(q.after(None), None);
        // Nobody waiting: history is forgotten at the next tag.
        let p = q.tag(&Client::new("later", 1), 1);
        q.push(p, 2);
        assert_eq!(q.clients.len(), 1);
        // One client keeps two requests waiting while many others pass through.
        let (w1, w2) = (q.tag(&c, 1), q.tag(&c, 1));
        q.push(w1, 3);
        q.push(w2, 4);
        for i in 0..(3 * SWEEP_AT) {
            let place = q.tag(&Client::new(&format!("c{i}"), 1), 1);
            q.push(place, 100 + i as u64);
            q.remove(place);
        }
        assert!(q.clients.len() <= SWEEP_AT, "{}", q.clients.len());
        assert_eq!(q.clients[&c.id].waiting, 2, "a client with waiters is never forgotten");
        assert_eq!(drain(&mut q), [2, 3, 4], "its requests keep their order");
    }

    #[test]
    fn a_lower_priority_goes_first_and_each_priority_is_fair() {
        let (burst, lone) = (Client::new("burst", 1), Client::new("lone", 1));
        let mut requests: Vec<(Client, u32)> = vec![(burst, 1); 4];
        requests.push((lone.at(5), 1));
        requests.push((burst.at(-1), 1));
        requests.push((lone.at(-1), 1));
        requests.push((lone, 1));
        let refs: Vec<(&Client, u32)> = requests.iter().map(|(c, n)| (c, *n)).collect();
        let mut q = queue(&refs);
        assert_eq!(
            drain(&mut q),
            [6, 5, 0, 1, 2, 7, 3, 4],
            "every -1, then every 0, then 5; within one priority by the fair tags (the lone \
             client is charged for all its requests, whatever their priority)"
        );
    }

    #[test]
    fn an_urgent_request_does_not_move_newcomers_behind_its_clients_backlog() {
        let (heavy, light) = (Client::new("heavy", 1), Client::new("light", 1));
        let mut q = queue(&[(&heavy, 1); 10]);
        let urgent = q.tag(&heavy.at(-1), 1);
        q.push(urgent, 100);
        let (place, id) = q.after(None).unwrap();
        assert_eq!(id, 100, "the urgent request goes first");
        q.admit(place);
        let newcomer = q.tag(&light, 1);
        q.push(newcomer, 200);
        let order = drain(&mut q);
        assert_eq!(
            order[..2],
            [0, 200],
            "beside the backlog's head, not behind all of it: {order:?}"
        );
    }

    #[test]
    fn names_are_known_by_a_keyed_hash() {
        assert_eq!(Client::new("sk-a", 2), Client::new("sk-a", 2));
        assert_ne!(Client::new("sk-a", 1).id, Client::new("sk-b", 1).id);
        assert_eq!(name_hash("x"), Client::new("x", 1).id);
    }
}
