//! The state every handler shares (`App`, behind `Shared`): the normaliser, the upstream
//! client, admission and upstream state, limits and the speculation policy: the layer between
//! what serves one request (`pipeline`, `admin`) and the parts it is made of.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_config::Config;

use crate::api::normalize::Normalizer;
use crate::control::state::GatewayControl;
use crate::control::storage::StoreSlot;
use crate::groups::Groups;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) normalizer: Arc<Normalizer>,
    /// The rank groups (one without GROUPS_FILE), each with its upstream and supervisor.
    pub(crate) groups: Arc<Groups>,
    pub(crate) control: GatewayControl,
    pub(crate) drain_timeout: Duration,
    pub(crate) first_token_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// How long a cut stream waits to be continued (RESUME_TIMEOUT; zero: not at all).
    pub(crate) resume_timeout: Duration,
    pub(crate) profile: String,
    /// The profile's speculation modes (what `/admin/spec` may switch to).
    pub(crate) spec_modes: Vec<sparkgate_config::SpecMode>,
    pub(crate) spec_policy: Arc<crate::control::spec::ModePolicy>,
    /// Who a generation is for in the admission queue.
    pub(crate) clients: crate::control::clients::Clients,
    /// Bodies whose group was lost under them, and those no longer sent.
    pub(crate) quarantine: Arc<crate::quarantine::Quarantine>,
    /// Recent conversations kept to warm a restarted group (WARM_REPLAY_BYTES; none when 0).
    pub(crate) warm: Option<Arc<crate::groups::Warm>>,
    /// Stored Responses (STORE_URL; docs/store.md), opened on first use; none where no
    /// location was given.
    pub(crate) store: Option<Arc<StoreSlot>>,
    /// Usage per key, written to the store (docs/keys.md).
    pub(crate) ledger: crate::control::ledger::Ledger,
    /// Per-key token quotas.
    pub(crate) quotas: crate::control::quota::Quotas,
    /// What the fair queue charges (FAIR_CHARGE).
    pub(crate) fair_charge: sparkgate_config::FairCharge,
    /// The header that names a conversation for routing (SESSION_HEADER).
    pub(crate) session_header: Option<axum::http::HeaderName>,
    /// The generations sent and not finished (listed in diagnostics bundles).
    pub(crate) in_flight: Arc<crate::control::inflight::InFlight>,
}

pub(crate) type Shared = Arc<App>;

impl App {
    pub(crate) fn new(
        config: &Config,
        control: GatewayControl,
        groups: Arc<Groups>,
        store: Option<Arc<StoreSlot>>,
    ) -> Shared {
        let g = &config.gateway;
        let t = &g.tenancy;
        Arc::new(App {
            normalizer: Arc::new({
                let mut n = Normalizer::new(
                    config.profile,
                    &config.serving.served_model_name,
                    &g.model_aliases,
                    &g.effort_map,
                );
                n.resume_streams = !g.resume_timeout.is_zero();
                n
            }),
            groups,
            control,
            drain_timeout: g.drain_timeout,
            first_token_timeout: g.first_token_timeout,
            idle_timeout: g.stream_idle_timeout,
            request_timeout: g.request_timeout,
            resume_timeout: g.resume_timeout,
            profile: config.profile.to_string(),
            spec_modes: config.speculation.modes.clone(),
            quarantine: Arc::default(),
            warm: crate::groups::Warm::new(g.warm_replay_bytes),
            ledger: crate::control::ledger::Ledger::new(store.clone()),
            store,
            quotas: crate::control::quota::Quotas::new(t.quota, t.quota_mode),
            fair_charge: t.fair_charge,
            in_flight: Arc::default(),
            session_header: t
                .session_header
                .as_deref()
                .and_then(|h| axum::http::HeaderName::from_bytes(h.as_bytes()).ok()),
            spec_policy: crate::control::spec::ModePolicy::new(&config.speculation),
            clients: crate::control::clients::Clients::new(
                g.queue_policy,
                config.serving.scheduling_policy,
                &g.client_weights,
            ),
        })
    }
}

pub(crate) fn status_json(app: &App) -> Value {
    let snap = app.control.snapshot();
    let upstream = app.control.upstream();
    json!({
        "ready": app.control.is_ready(),
        "upstream": upstream,
        "upstream_url": app.groups.first().upstream.base(),
        "profile": app.profile,
        "model": app.normalizer.served(),
        "mode": app.control.mode(),
        "vllm": app.groups.vllm_json(),
        "tokens_per_s": (app.control.tokens_per_s() * 10.0).round() / 10.0,
        "admission": {"open": !snap.paused, "capacity": snap.capacity, "in_flight": snap.in_use, "queued": snap.queued},
        "groups": app.groups.status_json(),
        "store": app.store.as_ref().map(|s| s.status_json()),
    })
}
