//! The rank groups behind the gateway (one, or one per GROUPS_FILE section) and how a
//! generation picks one. Admission stays one shared queue: its capacity is the sum of the
//! serving groups' MAX_NUM_SEQS, so an admitted request always finds a group with room. The
//! request then takes a lease on a group — by prefix affinity (the group that served the same
//! conversation prefix within [`AFFINITY_TTL`], so vLLM's prefix cache is reused), else the
//! least loaded — and holds it until its answer is sent. Each group's supervisor state is
//! mirrored into its own view; a group that restarts or fails only takes its capacity away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_config::{Config, GroupConfig, GroupRouting, SpecMethod, SINGLE_GROUP};
use sparkgate_supervisor::{GroupState, Status, SupervisorHandle};

use crate::admission::{Hold, Home, Preference, Reservation};
use crate::state::{GatewayControl, UpstreamState};
use crate::upstream::Upstream;

/// How long a conversation prefix stays bound to the group that served it.
pub(crate) const AFFINITY_TTL: Duration = Duration::from_secs(600);
/// Prefixes remembered at most (the oldest are forgotten first).
const AFFINITY_MAX: usize = 65_536;

/// What the gateway knows of one group: its supervisor's state as admission sees it.
#[derive(Debug, Clone, PartialEq)]
struct View {
    state: UpstreamState,
    mode: SpecMethod,
    capacity: u32,
}

/// One rank group.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) upstream: Upstream,
    pub(crate) supervisor: Option<SupervisorHandle>,
    /// Its rank 0's `/metrics`, cached for a second.
    pub(crate) metrics: crate::exposition::UpstreamMetrics,
    view: RwLock<View>,
    /// Its slots in use, in one word so both counts change together: leases in the low half,
    /// slots held for admitted requests that prefer it (until they lease them) in the high half.
    slots: AtomicU64,
    routed: AtomicU64,
    /// `sparkgate_group_requests_total{group}`, looked up once: a lease is on every request's path.
    requests: metrics::Counter,
    /// An operator drains it before restarting it alone: no new leases.
    drained: AtomicBool,
    /// Slots of generations cut before vLLM's answer ended, kept until vLLM has let go of them.
    fence: Mutex<Vec<Fenced>>,
    /// One permit: a request lost under twice (`quarantine`) runs with no other such suspect
    /// beside it, so a third loss names one request.
    probation: Arc<tokio::sync::Semaphore>,
    /// Suspects' leases (`quarantine`): in flight now, and ever given.
    suspects_in_flight: AtomicU64,
    suspects_routed: AtomicU64,
}

impl Group {
    /// A group; one without a supervisor (gateway-only mode) is always open to leases — its
    /// health is probed into the gateway's state instead.
    pub(crate) fn new(
        name: &str,
        upstream: Upstream,
        supervisor: Option<SupervisorHandle>,
        mode: SpecMethod,
        capacity: u32,
    ) -> Group {
        let state = match supervisor {
            Some(_) => UpstreamState::Starting,
            None => UpstreamState::Ready,
        };
        Group {
            name: name.to_owned(),
            upstream,
            supervisor,
            metrics: Default::default(),
            view: RwLock::new(View { state, mode, capacity }),
            slots: AtomicU64::new(0),
            routed: AtomicU64::new(0),
            requests: metrics::counter!(crate::observe::GROUP_REQUESTS, "group" => name.to_owned()),
            drained: AtomicBool::new(false),
            probation: Arc::new(tokio::sync::Semaphore::new(1)),
            suspects_in_flight: AtomicU64::new(0),
            suspects_routed: AtomicU64::new(0),
            fence: Mutex::new(Vec::new()),
        }
    }

    fn view(&self) -> View {
        self.view.read().expect("group view").clone()
    }

    /// The speculation mode the group runs.
    pub(crate) fn mode(&self) -> SpecMethod {
        self.view().mode
    }

    pub(crate) fn state(&self) -> UpstreamState {
        self.view().state
    }

    /// Serving and not drained: it takes new requests up to its capacity.
    fn open(&self) -> bool {
        self.open_in(&self.view.read().expect("group view"))
    }

    fn open_in(&self, view: &View) -> bool {
        !self.drained.load(Ordering::Relaxed) && view.state == UpstreamState::Ready
    }

    /// Its capacity while open, else 0.
    fn open_capacity(&self) -> u32 {
        let view = self.view.read().expect("group view");
        if self.open_in(&view) {
            view.capacity
        } else {
            0
        }
    }

    pub(crate) fn in_use(&self) -> u32 {
        leases(self.slots.load(Ordering::Relaxed))
    }

    /// The epoch its supervisor serves now (none without a supervisor).
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.supervisor.as_ref().map(|s| s.status().epoch)
    }

    pub(crate) fn set_drained(&self, drained: bool) {
        self.drained.store(drained, Ordering::Relaxed);
    }

    /// Adds `step` to its slots if `need` slots are free (leased and held slots both count as
    /// taken).
    fn take_slot(&self, step: u64, need: u32) -> bool {
        let capacity = self.open_capacity();
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (u64::from(leases(s)) + u64::from(held(s)) + u64::from(need) <= u64::from(capacity)).then_some(s + step)
            })
            .is_ok()
    }

    /// Takes `seqs` of its slots (one per sequence), unless it is closed or lacks the room.
    fn try_lease(self: &Arc<Self>, seqs: u32) -> Option<Lease> {
        self.take_slot(LEASE * u64::from(seqs), seqs).then(|| self.leased(seqs))
    }

    /// Turns the slot `reservation` holds for this request into its lease of `seqs` slots,
    /// while the group is open and has room for the rest (in one step: the slot never looks free
    /// in between).
    fn take_held(self: &Arc<Self>, reservation: Reservation, seqs: u32) -> Option<Lease> {
        let capacity = self.open_capacity();
        let step = LEASE * u64::from(seqs);
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let after = u64::from(leases(s)) + u64::from(held(s)) - 1 + u64::from(seqs);
                (capacity > 0 && after <= u64::from(capacity)).then(|| s - HELD + step)
            })
            .ok()?;
        reservation.settle();
        Some(self.leased(seqs))
    }

    fn leased(self: &Arc<Self>, seqs: u32) -> Lease {
        self.routed.fetch_add(1, Ordering::Relaxed);
        self.requests.increment(1);
        Lease {
            group: self.clone(),
            seqs,
            probation: None,
            suspect: false,
        }
    }

    /// Waits (at most a second) until the group is no longer the serving group of `epoch` —
    /// its supervisor noticed its loss — so a retry is not sent into the same dead rank;
    /// whether it was lost. Without a supervisor nothing judges a loss: never.
    pub(crate) async fn lost_since(&self, epoch: Option<u64>) -> bool {
        let Some(sup) = &self.supervisor else { return false };
        let mut status = sup.subscribe();
        let changed = status.wait_for(|s| !(s.is_serving() && Some(s.epoch) == epoch));
        let lost = tokio::time::timeout(Duration::from_secs(1), changed)
            .await
            .map(|seen| seen.is_ok());
        lost == Ok(true)
    }

    /// Suspects' leases in flight now, and given ever.
    pub(crate) fn suspects(&self) -> (u64, u64) {
        (
            self.suspects_in_flight.load(Ordering::Acquire),
            self.suspects_routed.load(Ordering::Acquire),
        )
    }

    /// Waits until no suspect runs on it (`Lease::on_probation`).
    pub(crate) async fn probation_over(&self) {
        let _ = self.probation.acquire().await;
    }

    /// Leases it has given, ever: a change means another request was sent to it.
    pub(crate) fn routed(&self) -> u64 {
        self.routed.load(Ordering::Relaxed)
    }

    /// Its MAX_NUM_SEQS as last seen (open or not).
    pub(crate) fn capacity(&self) -> u32 {
        self.view.read().expect("group view").capacity
    }

    /// Free slots as a share of its capacity (0 when closed).
    fn room(&self) -> f64 {
        let s = self.slots.load(Ordering::Acquire);
        match self.open_capacity() {
            0 => 0.0,
            capacity => f64::from(capacity.saturating_sub(leases(s) + held(s))) / f64::from(capacity),
        }
    }
}

impl Group {
    fn full(&self) -> bool {
        self.open_capacity() > 0 && !self.has_room()
    }

    fn has_room(&self) -> bool {
        let s = self.slots.load(Ordering::Acquire);
        leases(s) + held(s) < self.open_capacity()
    }

    /// Open with nothing running and nothing held.
    fn idle(&self) -> bool {
        self.open() && self.slots.load(Ordering::Acquire) == 0
    }
}

/// The group a request prefers, as admission sees it: the group among its siblings, so that a
/// request does not wait for its full group while another sits idle (all conversations bound to
/// one group, the other just back from a restart, would otherwise keep it idle).
#[derive(Debug)]
struct Affine {
    groups: Arc<Groups>,
    index: usize,
}

impl Affine {
    fn group(&self) -> &Group {
        &self.groups.list[self.index]
    }
}

impl Home for Affine {
    fn full(&self) -> bool {
        let mut others = self.groups.list.iter().enumerate().filter(|(i, _)| *i != self.index);
        self.group().full() && !others.any(|(_, g)| g.idle())
    }

    fn has_room(&self) -> bool {
        self.group().has_room()
    }

    fn reserve(&self) -> bool {
        self.group().take_slot(HELD, 1)
    }

    fn unreserve(&self) {
        self.group().slots.fetch_sub(HELD, Ordering::AcqRel);
    }

    fn index(&self) -> usize {
        self.index
    }
}

/// One lease, and one held slot, in a group's `slots`.
const LEASE: u64 = 1;
const HELD: u64 = 1 << 32;

fn leases(slots: u64) -> u32 {
    (slots & 0xffff_ffff) as u32
}

fn held(slots: u64) -> u32 {
    (slots >> 32) as u32
}

/// A request's hold on its slots of a group (one per sequence), released when dropped (with
/// its answer).
#[derive(Debug)]
pub(crate) struct Lease {
    group: Arc<Group>,
    seqs: u32,
    /// The group's probation, held by a suspect for as long as its lease.
    probation: Option<tokio::sync::OwnedSemaphorePermit>,
    /// It is a suspect's (counted in the group's `suspects`).
    suspect: bool,
}

impl Lease {
    pub(crate) fn group(&self) -> &Group {
        &self.group
    }

    /// Marks it a suspect's lease, counted while it lasts.
    pub(crate) fn mark_suspect(&mut self) {
        if !std::mem::replace(&mut self.suspect, true) {
            self.group.suspects_routed.fetch_add(1, Ordering::AcqRel);
            self.group.suspects_in_flight.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Puts a suspect on probation on its group: false while another suspect runs there.
    pub(crate) fn on_probation(&mut self) -> bool {
        match self.group.probation.clone().try_acquire_owned() {
            Ok(permit) => {
                self.probation = Some(permit);
                true
            }
            Err(_) => false,
        }
    }

    /// The group, to consult after the lease is given back (a retry's verdict).
    pub(crate) fn shared(&self) -> Arc<Group> {
        self.group.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.suspect {
            self.group.suspects_in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.group
            .slots
            .fetch_sub(LEASE * u64::from(self.seqs), Ordering::AcqRel);
    }
}

/// Every group, and the routing between them.
#[derive(Debug)]
pub(crate) struct Groups {
    list: Vec<Arc<Group>>,
    routing: GroupRouting,
    /// AFFINITY_WAIT_MS: how long a request waits for its prefix's full group.
    wait: Duration,
    /// Conversation prefix → (group index, when it last went there).
    recent: Mutex<HashMap<u64, (usize, Instant)>>,
    turn: AtomicUsize,
}

impl Groups {
    pub(crate) fn new(list: Vec<Group>, routing: GroupRouting, wait: Duration) -> Groups {
        assert!(!list.is_empty(), "at least one group");
        Groups {
            list: list.into_iter().map(Arc::new).collect(),
            routing,
            wait,
            recent: Mutex::new(HashMap::new()),
            turn: AtomicUsize::new(0),
        }
    }

    pub(crate) fn all(&self) -> &[Arc<Group>] {
        &self.list
    }

    /// The first group: the only one without GROUPS_FILE.
    pub(crate) fn first(&self) -> &Arc<Group> {
        &self.list[0]
    }

    /// Where a request outside admission (tokenize, a passthrough) goes: the first open group,
    /// else the first.
    pub(crate) fn serving(&self) -> &Group {
        self.list.iter().find(|g| g.open()).unwrap_or(&self.list[0])
    }

    pub(crate) fn named(&self, name: &str) -> Option<&Arc<Group>> {
        self.list.iter().find(|g| g.name == name)
    }

    /// The most sequences one request may run at once: the largest group's MAX_NUM_SEQS (a
    /// request runs on one group, while admission counts every group's slots).
    pub(crate) fn largest_capacity(&self) -> u32 {
        self.list.iter().map(|g| g.capacity()).max().unwrap_or(0)
    }

    /// Whether routing uses a request's conversation prefix (several groups, affinity).
    pub(crate) fn wants_prefix(&self) -> bool {
        self.list.len() > 1 && self.routing == GroupRouting::Affinity
    }

    /// A group for an admitted request: the slot admission held for it, else the prefix's
    /// recent group when it has room, else the one with the most room (round-robin: the next
    /// with room). `None` only in the moment a group closes under an admitted request.
    pub(crate) fn lease(&self, prefix: Option<u64>, held: Option<Reservation>, seqs: u32) -> Option<Lease> {
        if self.list.len() == 1 {
            return self.list[0].try_lease(seqs);
        }
        let now = Instant::now();
        if let Some(held) = held {
            let i = held.home().index();
            if let Some(lease) = self.list.get(i).and_then(|g| g.take_held(held, seqs)) {
                if let Some(key) = prefix {
                    self.remember(key, i, now);
                }
                return Some(lease);
            }
        }
        let preferred = match (self.routing, prefix) {
            (GroupRouting::Affinity, Some(key)) => self.recent_group(key, now),
            (GroupRouting::RoundRobin, _) => Some(self.turn.fetch_add(1, Ordering::Relaxed) % self.list.len()),
            _ => None,
        };
        let mut order: Vec<usize> = (0..self.list.len()).collect();
        if self.routing != GroupRouting::RoundRobin {
            // Most room first; ties keep configuration order.
            order.sort_by(|&a, &b| self.list[b].room().total_cmp(&self.list[a].room()));
        } else if let Some(p) = preferred {
            order.rotate_left(p);
        }
        if let Some(p) = preferred {
            order.retain(|&i| i != p);
            order.insert(0, p);
        }
        let (index, lease) = order
            .into_iter()
            .find_map(|i| Some((i, self.list[i].try_lease(seqs)?)))?;
        if let (GroupRouting::Affinity, Some(key)) = (self.routing, prefix) {
            self.remember(key, index, now);
        }
        Some(lease)
    }

    /// The group a request waits for while it is full (AFFINITY_WAIT_MS): its prefix's recent
    /// group, under affinity routing.
    pub(crate) fn preference(self: &Arc<Self>, prefix: Option<u64>) -> Option<Preference> {
        let key = prefix.filter(|_| self.wants_prefix() && !self.wait.is_zero())?;
        let index = self.recent_group(key, Instant::now())?;
        let home = Arc::new(Affine {
            groups: self.clone(),
            index,
        });
        Some(Preference { home, wait: self.wait })
    }

    fn recent_group(&self, key: u64, now: Instant) -> Option<usize> {
        let recent = self.recent.lock().expect("affinity map");
        recent
            .get(&key)
            .filter(|(_, at)| now.duration_since(*at) < AFFINITY_TTL)
            .map(|(i, _)| *i)
    }

    fn remember(&self, key: u64, index: usize, now: Instant) {
        let mut recent = self.recent.lock().expect("affinity map");
        if recent.len() >= AFFINITY_MAX {
            recent.retain(|_, (_, at)| now.duration_since(*at) < AFFINITY_TTL);
            if recent.len() >= AFFINITY_MAX {
                recent.clear();
            }
        }
        recent.insert(key, (index, now));
    }

    /// Sequences the open groups take at once.
    fn open_capacity(&self) -> u32 {
        self.list.iter().map(|g| g.open_capacity()).sum()
    }

    /// The gateway's state: ready while any group serves; otherwise the first held group's
    /// (starting, restarting, stalled: requests wait), else the first group's.
    fn summary(&self) -> UpstreamState {
        if self.list.iter().any(|g| g.open()) {
            return UpstreamState::Ready;
        }
        let held = |s: &UpstreamState| {
            matches!(
                s,
                UpstreamState::Starting | UpstreamState::Restarting(_) | UpstreamState::Stalled(_)
            )
        };
        let states: Vec<UpstreamState> = self.list.iter().map(|g| g.state()).collect();
        let named = |i: usize, s: UpstreamState| -> UpstreamState {
            if self.list.len() == 1 {
                return s;
            }
            let name = &self.list[i].name;
            match s {
                UpstreamState::Restarting(r) => UpstreamState::Restarting(format!("group {name}: {r}")),
                UpstreamState::Stalled(r) => UpstreamState::Stalled(format!("group {name}: {r}")),
                UpstreamState::Failed(r) => UpstreamState::Failed(format!("group {name}: {r}")),
                UpstreamState::Unreachable(r) => UpstreamState::Unreachable(format!("group {name}: {r}")),
                other => other,
            }
        };
        match states.iter().position(held) {
            Some(i) => named(i, states[i].clone()),
            None => named(0, states[0].clone()),
        }
    }

    /// Each group for `/admin/status`.
    pub(crate) fn status_json(&self) -> Value {
        let groups: Vec<Value> = self
            .list
            .iter()
            .map(|g| {
                let v = g.view();
                let mut j = json!({
                    "name": g.name,
                    "upstream": v.state,
                    "upstream_url": g.upstream.base(),
                    "mode": v.mode,
                    "capacity": v.capacity,
                    "in_flight": g.in_use(),
                    "open": g.open(),
                    "routed": g.routed.load(Ordering::Relaxed),
                });
                // One group's supervisor is the status's own `supervisor`; several are each here.
                if let Some(s) = g.supervisor.as_ref().filter(|_| self.list.len() > 1) {
                    j["supervisor"] = serde_json::to_value(s.status()).unwrap_or_default();
                }
                j
            })
            .collect();
        Value::Array(groups)
    }
}

/// Who keeps the gateway informed about its upstream.
#[derive(Debug, Clone)]
pub enum Upstreams {
    /// Gateway-only mode: probe the upstream's `/health` every second.
    Probe,
    /// One supervisor per rank group, in configuration order: their states drive admission and
    /// readiness; `/admin` controls them.
    Supervised(Vec<(GroupConfig, SupervisorHandle)>),
}

impl Groups {
    /// The groups behind the gateway: the supervised ones, or the one upstream of gateway-only mode.
    pub(crate) fn of(config: &Config, upstreams: &Upstreams) -> Groups {
        let key = config.secrets.vllm_api_key.as_ref();
        let list = match upstreams {
            Upstreams::Probe => {
                let mode = config.speculation.active_mode();
                let upstream = Upstream::new(&config.gateway.upstream, key);
                vec![Group::new(SINGLE_GROUP, upstream, None, mode.method, mode.max_num_seqs)]
            }
            Upstreams::Supervised(list) => list
                .iter()
                .map(|(g, h)| {
                    let mode = g.config.speculation.active_mode();
                    let upstream = Upstream::new(&g.config.gateway.upstream, key);
                    Group::new(&g.name, upstream, Some(h.clone()), mode.method, mode.max_num_seqs)
                })
                .collect(),
        };
        Groups::new(list, config.gateway.group_routing, config.gateway.affinity_wait)
    }
}

/// A group's view from its supervisor's published status.
fn view_of(status: &Status) -> View {
    let state = match &status.state {
        // Work pending and no engine step: hold rather than send more into an engine that may be
        // hung; a step lifts it, STALL_TIMEOUT restarts the group.
        GroupState::Ready { .. } if status.stalled_s.is_some() => UpstreamState::Stalled(format!(
            "no engine step for {}s with requests pending",
            status.stalled_s.unwrap_or_default()
        )),
        GroupState::Ready { .. } => UpstreamState::Ready,
        GroupState::Starting { epoch } => UpstreamState::Restarting(format!("starting epoch {epoch}")),
        GroupState::Restarting { reason, .. } => UpstreamState::Restarting(reason.clone()),
        GroupState::Failed { reason } => UpstreamState::Failed(reason.clone()),
        GroupState::Stopped | GroupState::Stopping | GroupState::ShuttingDown => UpstreamState::Stopped,
    };
    View {
        state,
        mode: status.mode,
        capacity: status.max_num_seqs,
    }
}

/// Applies every group's view to the shared admission: its capacity is what the open groups
/// take, and it holds (requests wait, not fail) while none is open.
pub(crate) fn apply(control: &GatewayControl, groups: &Groups) {
    let capacity = groups.open_capacity();
    for g in groups.all() {
        metrics::gauge!(crate::observe::GROUP_OPEN, "group" => g.name.clone()).set(f64::from(u8::from(g.open())));
        metrics::gauge!(crate::observe::GROUP_IN_FLIGHT, "group" => g.name.clone()).set(f64::from(g.in_use()));
    }
    if let Some(open) = groups.all().iter().find(|g| g.open()) {
        control.set_mode(open.mode());
    }
    control.set_upstream(groups.summary());
    if capacity == 0 {
        control.admission().pause(Hold::Group);
    } else {
        control.admission().set_capacity(capacity);
        control.admission().resume(Hold::Group);
    }
}

/// Follows each supervised group's published state into its view and re-applies admission
/// when a view changes. The supervisor republishes the same state every second (memory
/// samples); only changes are applied, so an operator drain's pause is not undone.
pub(crate) fn mirror(control: GatewayControl, groups: Arc<Groups>) {
    for (index, g) in groups.all().iter().enumerate() {
        let Some(sup) = g.supervisor.clone() else { continue };
        let (control, groups) = (control.clone(), groups.clone());
        sparkgate_task::spawn("group-mirror", async move {
            let mut rx = sup.subscribe();
            loop {
                let view = view_of(&rx.borrow_and_update());
                let group = &groups.all()[index];
                let changed = {
                    let mut v = group.view.write().expect("group view");
                    let changed = *v != view;
                    *v = view;
                    changed
                };
                if changed {
                    apply(&control, &groups);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

mod prefix;
pub(crate) use prefix::prefix_key;

mod fence;
use fence::Fenced;

#[cfg(test)]
mod tests;
