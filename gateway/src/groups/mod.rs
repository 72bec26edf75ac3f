//! The rank groups behind the gateway (one, or one per GROUPS_FILE section) and how a
//! generation picks one. Admission stays one shared queue: its capacity is the sum of the
//! serving groups' MAX_NUM_SEQS, so an admitted request always finds a group with room. The
//! request then takes a lease on a group — by prefix affinity (the group that served the same
//! conversation prefix within [`AFFINITY_TTL`], so vLLM's prefix cache is reused), else the
//! least loaded — and holds it until its answer is sent. Each group's supervisor state is
//! mirrored into its own view; a group that restarts or fails only takes its capacity away.
//! With MODELS the groups are the models instead, one serving at a time (`swap`): a request
//! leases its own model's group, and admission grants only the loaded model's requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sparkgate_config::{Config, GroupConfig, GroupRouting, UpstreamVersion, VllmRelease, SINGLE_GROUP};
use sparkgate_supervisor::{GroupState, Status, SupervisorHandle};

use crate::api::models::ModelId;
use crate::control::admission::{Hold, Home, Preference, Reservation};
use crate::control::state::{GatewayControl, UpstreamState};
use crate::upstream::Upstream;

/// How long a conversation prefix stays bound to the group that served it.
pub(crate) const AFFINITY_TTL: Duration = Duration::from_secs(600);
/// Prefixes remembered at most (the oldest are forgotten first).
const AFFINITY_MAX: usize = 65_536;

/// The group a request prefers, as admission sees it: the group among its siblings, so that a
/// request does not wait for its full group while another sits idle (all conversations bound to
/// one group, the other just back from a restart, would otherwise keep it idle).
#[derive(Debug)]
pub(super) struct Affine {
    pub(super) groups: Arc<Groups>,
    pub(super) index: usize,
}

impl Affine {
    pub(super) fn group(&self) -> &Group {
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
    releases: Releases,
    /// One group per model (MODELS), one serving at a time, rather than replicas of one model.
    models: bool,
    /// The gateway's state in words while a swap between models leaves no group serving.
    pub(super) note: std::sync::RwLock<Option<String>>,
}

impl Groups {
    pub(crate) fn new(list: Vec<Group>, routing: GroupRouting, wait: Duration) -> Groups {
        assert!(!list.is_empty(), "at least one group");
        let releases = Releases::new(list.len());
        let models = list.iter().any(|g| g.model != ModelId::default());
        Groups {
            list: list.into_iter().map(Arc::new).collect(),
            routing,
            wait,
            recent: Mutex::new(HashMap::new()),
            turn: AtomicUsize::new(0),
            releases,
            models,
            note: std::sync::RwLock::new(None),
        }
    }

    /// Whether the groups are models served in turn (MODELS), not replicas.
    pub(crate) fn models(&self) -> bool {
        self.models
    }

    /// Whether several groups serve the one model side by side (GROUPS_FILE).
    pub(crate) fn replicas(&self) -> bool {
        self.list.len() > 1 && !self.models
    }

    /// The group that answers for the gateway (its supervisor in `/admin/status`, operators'
    /// commands): the first, or with MODELS the loaded model's.
    pub(crate) fn current(&self, loaded: Option<ModelId>) -> &Arc<Group> {
        match loaded.filter(|_| self.models) {
            Some(m) => &self.list[m.index()],
            None => &self.list[0],
        }
    }

    /// The vLLM release whose rules the gateway applies (`release::Releases::rules`).
    pub(crate) fn rules(&self) -> VllmRelease {
        self.releases.rules()
    }

    /// Records what group `index`'s rank 0 reported (`None`: unknown now), with its metric.
    pub(crate) fn set_vllm(&self, index: usize, version: Option<UpstreamVersion>) {
        if self.releases.set(index, version.clone()) {
            if let Some(w) = version.as_ref().and_then(UpstreamVersion::warning) {
                tracing::warn!(group = %self.list[index].name, "{w}");
            }
        }
    }

    /// The gateway's vLLM in `/admin/status`: the first group's report (each group's is in
    /// its own entry) and the release whose rules apply.
    pub(crate) fn vllm_json(&self) -> Value {
        let reported = (0..self.list.len()).find_map(|i| self.releases.of(i));
        let mut j = reported.as_ref().map_or_else(|| json!({"version": null}), vllm_json);
        j["rules"] = json!(self.rules());
        j["release_rules"] = json!(crate::api::releases::holding(self.rules()));
        j
    }

    /// Each group's vLLM as the `sparkgate_upstream_info` family (rendered at each scrape, so
    /// a replaced version leaves no stale series).
    pub(crate) fn upstream_info(&self) -> String {
        let known: Vec<(&str, UpstreamVersion)> = (self.list.iter().enumerate())
            .filter_map(|(i, g)| Some((g.name.as_str(), self.releases.of(i)?)))
            .collect();
        crate::observe::upstream_info(&known)
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

    /// The most sequences one request for `model` may run at once: its group's MAX_NUM_SEQS,
    /// or the largest group's (a request runs on one group, while admission counts every
    /// group's slots).
    pub(crate) fn capacity_for(&self, model: ModelId) -> u32 {
        if self.models {
            return self.list[model.index()].capacity();
        }
        self.list.iter().map(|g| g.capacity()).max().unwrap_or(0)
    }

    /// Whether routing uses a request's conversation prefix (several groups, affinity).
    pub(crate) fn wants_prefix(&self) -> bool {
        self.replicas() && self.routing == GroupRouting::Affinity
    }

    /// A group for an admitted request: the slot admission held for it, else the prefix's
    /// recent group when it has room, else the one with the most room (round-robin: the next
    /// with room). `None` only in the moment a group closes under an admitted request.
    pub(crate) fn lease(
        &self,
        prefix: Option<u64>,
        held: Option<Reservation>,
        seqs: u32,
        model: ModelId,
    ) -> Option<Lease> {
        if self.list.len() == 1 {
            return self.list[0].try_lease(seqs);
        }
        if self.models {
            return self.list[model.index()].try_lease(seqs);
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

    /// Bytes above the memory line on the tightest node of the open groups (what a prefill may
    /// take wherever it is routed); `None` when none of them was read.
    fn headroom(&self) -> Option<i64> {
        let gib = self
            .list
            .iter()
            .filter(|g| g.open())
            .filter_map(|g| *g.headroom_gib.lock().expect("headroom"))
            .reduce(f64::min)?;
        Some((gib * f64::from(1u32 << 30)) as i64)
    }

    /// The gateway's state: ready while any group serves; otherwise the first held group's
    /// (starting, restarting, stalled: requests wait), else the first group's.
    fn summary(&self) -> UpstreamState {
        if self.list.iter().any(|g| g.open()) {
            return UpstreamState::Ready;
        }
        if let Some(note) = self.note.read().expect("swap note").clone() {
            return UpstreamState::Restarting(note);
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
            .enumerate()
            .map(|(index, g)| {
                let several = self.list.len() > 1;
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
                if let Some(v) = self.releases.of(index) {
                    j["vllm"] = vllm_json(&v);
                }
                // One group's supervisor is the status's own `supervisor`; several are each here.
                if let Some(s) = g.supervisor.as_ref().filter(|_| several) {
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
                .enumerate()
                .map(|(i, (g, h))| {
                    let mode = g.config.speculation.active_mode();
                    let upstream = Upstream::new(&g.config.gateway.upstream, key);
                    let mut group = Group::new(&g.name, upstream, Some(h.clone()), mode.method, mode.max_num_seqs);
                    // MODELS: the groups are its models, in its order.
                    if config.gateway.models.len() > 1 {
                        group.model = ModelId(i as u8);
                    }
                    group
                })
                .collect(),
        };
        Groups::new(list, config.gateway.group_routing, config.gateway.affinity_wait)
    }
}

/// A group's vLLM in `/admin/status`: what rank 0 reported, whose rules apply, and the
/// warning when those are not its own.
pub(crate) fn vllm_json(v: &UpstreamVersion) -> Value {
    json!({"version": v.reported, "rules": v.rules, "fit": v.fit, "warning": v.warning()})
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
        GroupState::Restarting { reason, .. } | GroupState::Backoff { reason, .. } => {
            UpstreamState::Restarting(reason.clone())
        }
        GroupState::Failed { reason } => UpstreamState::Failed(reason.clone()),
        GroupState::Stopped | GroupState::Stopping | GroupState::ShuttingDown => UpstreamState::Stopped,
    };
    View {
        state,
        mode: status.mode,
        capacity: status.max_num_seqs,
    }
}

/// Seeds admission from the groups as configured (their capacity and the first one's mode),
/// before anything is served: the one place capacity comes from config. From then on
/// `apply` keeps it to what the open groups take.
pub(crate) fn seed(control: &GatewayControl, groups: &Groups) {
    let capacity = match groups.models {
        // One model serves at a time: the default's.
        true => groups.first().capacity(),
        false => groups.all().iter().map(|g| g.capacity()).sum(),
    };
    control.admission().set_capacity(capacity);
    control.set_mode(groups.first().mode());
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

/// Gives admission's memory guard the open groups' headroom (each sample of any group).
fn guard_memory(control: &GatewayControl, groups: &Groups) {
    let headroom = groups.headroom();
    if let Some(h) = headroom {
        metrics::gauge!(crate::observe::MEMORY_HEADROOM).set(h as f64);
    }
    control.admission().observe_memory(headroom);
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
                let (view, vllm) = {
                    let status = rx.borrow_and_update();
                    crate::observe::lifecycle::published(&groups.all()[index].name, &status);
                    *groups.all()[index].headroom_gib.lock().expect("headroom") = status.headroom_gib;
                    (view_of(&status), status.vllm.clone())
                };
                groups.set_vllm(index, vllm);
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
                guard_memory(&control, &groups);
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

mod prefix;
pub(crate) use prefix::{prefix_key, session_key};
mod swap;
pub(crate) use swap::{start as start_swaps, Answer as SwapAnswer, Swapper};
mod warm;
pub(crate) use warm::{keep_warm, Warm};

mod fence;
mod group;
mod release;
pub(crate) use group::{Group, Lease, Lost};
use group::{View, HELD};
use release::Releases;

#[cfg(test)]
mod tests;
