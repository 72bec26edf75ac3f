//! The state every handler shares (`App`, behind `Shared`): the normaliser, the upstream
//! client, admission and upstream state, limits and the speculation policy: the layer between
//! what serves one request (`pipeline`, `admin`) and the parts it is made of.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_config::Config;

use crate::api::normalize::Normalizer;
use crate::control::state::GatewayControl;
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
    pub(crate) store: Option<StoreSlot>,
}

/// The response store, opened when a request first needs it: a gateway whose clients never use
/// the Responses API's state creates no file and needs no database.
#[derive(Debug)]
pub(crate) struct StoreSlot {
    at: sparkgate_store::Location,
    retention: sparkgate_store::Retention,
    cell: tokio::sync::OnceCell<sparkgate_store::Store>,
    /// What the last sweep found (`sparkgate status`).
    last: std::sync::Mutex<Option<sparkgate_store::Stats>>,
}

impl StoreSlot {
    pub(crate) fn new(at: sparkgate_store::Location, retention: sparkgate_store::Retention) -> StoreSlot {
        StoreSlot {
            at,
            retention,
            cell: tokio::sync::OnceCell::new(),
            last: std::sync::Mutex::new(None),
        }
    }

    /// Records what a sweep found.
    pub(crate) fn saw(&self, stats: sparkgate_store::Stats) {
        *self.last.lock().expect("store stats") = Some(stats);
    }

    /// The store in `/admin/status`: where (redacted), whether a request opened it, and what
    /// the last sweep found.
    pub(crate) fn status_json(&self) -> Value {
        let last = *self.last.lock().expect("store stats");
        let evicted = self.opened().map_or(0, sparkgate_store::Store::evicted);
        json!({
            "url": self.at.to_string(),
            "open": self.opened().is_some(),
            "records": last.map(|s| s.records),
            "bytes": last.map(|s| s.bytes),
            "evicted": evicted,
        })
    }

    /// The store, opened now if it was not yet; a store that cannot be opened is a 503 that
    /// names why (and is tried again by the next request).
    pub(crate) async fn get(&self) -> Result<&sparkgate_store::Store, crate::api::error::GatewayError> {
        self.cell
            .get_or_try_init(|| async {
                let store = sparkgate_store::Store::open(&self.at, self.retention).await?;
                tracing::info!(store = %self.at, "response store open");
                // Its size from the start, not only from the first sweep.
                if let Some(stats) = crate::observe::store::publish(&store).await {
                    self.saw(stats);
                }
                Ok(store)
            })
            .await
            .map_err(|e: sparkgate_store::StoreError| crate::api::error::GatewayError::StoreFailed(e.to_string()))
    }

    /// The store, if a request opened it.
    pub(crate) fn opened(&self) -> Option<&sparkgate_store::Store> {
        self.cell.get()
    }
}

pub(crate) type Shared = Arc<App>;

impl App {
    pub(crate) fn new(
        config: &Config,
        control: GatewayControl,
        groups: Arc<Groups>,
        store: Option<StoreSlot>,
    ) -> Shared {
        let g = &config.gateway;
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
            store,
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
        "store": app.store.as_ref().map(StoreSlot::status_json),
    })
}
