//! The state every handler shares (`App`, behind `Shared`): the normaliser, the upstream
//! client, admission and upstream state, limits and the speculation policy: the layer between
//! what serves one request (`pipeline`, `admin`) and the parts it is made of.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sparkgate_config::Config;

use crate::api::catalog::Catalog;
use crate::api::models::ModelId;
use crate::api::normalize::Normalizer;
use crate::api::openai::ModelCard;
use crate::control::state::GatewayControl;
use crate::control::storage::StoreSlot;
use crate::groups::Groups;

/// Everything the handlers share.
/// How a request reached the gateway: plain HTTP, or HTTPS on the gateway's own TLS (TLS_CERT).
/// The connection loop puts it on every request; the console's sign-in reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

#[derive(Debug)]
pub(crate) struct App {
    /// Every model served (one without MODELS), each with its normaliser.
    pub(crate) models: Arc<Catalog>,
    /// MODELS: the swap between models (none with one model).
    pub(crate) swapper: Option<Arc<crate::groups::Swapper>>,
    /// The rank groups (one without GROUPS_FILE), each with its upstream and supervisor.
    pub(crate) groups: Arc<Groups>,
    pub(crate) control: GatewayControl,
    pub(crate) drain_timeout: Duration,
    pub(crate) first_token_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// How long a cut stream waits to be continued (RESUME_TIMEOUT; zero: not at all).
    pub(crate) resume_timeout: Duration,
    /// Each model's `/v1/models` entry, in the catalog's order.
    pub(crate) model_cards: Vec<ModelCard>,
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
    /// LONG_PROMPT_TOKENS: a prompt estimated above it is a long request (the reserve).
    pub(crate) long_prompt_tokens: u64,
    /// The header that names a conversation for routing (SESSION_HEADER).
    pub(crate) session_header: Option<axum::http::HeaderName>,
    /// The generations sent and not finished (listed in diagnostics bundles).
    pub(crate) in_flight: Arc<crate::control::inflight::InFlight>,
    /// Every setting with its source, secrets redacted (`/admin/config`; `sparkgate config
    /// --json`'s object), of each model served.
    pub(crate) settings: Value,
}

pub(crate) type Shared = Arc<App>;

impl App {
    /// `models` are the configurations of the models served (MODELS), none for the one of
    /// `config`.
    pub(crate) fn new(
        config: &Config,
        control: GatewayControl,
        groups: Arc<Groups>,
        store: Option<Arc<StoreSlot>>,
        (models, swapper): (&[&Config], Option<Arc<crate::groups::Swapper>>),
    ) -> Shared {
        let g = &config.gateway;
        let t = &g.tenancy;
        let one = [config];
        let models = if models.is_empty() { &one[..] } else { models };
        let normalizers = models
            .iter()
            .map(|c| {
                let mut n = Normalizer::new(
                    c.profile,
                    &c.serving.served_model_name,
                    &c.gateway.model_aliases,
                    &c.gateway.effort_map,
                );
                n.resume_streams = !g.resume_timeout.is_zero();
                n
            })
            .collect();
        Arc::new(App {
            models: Arc::new(Catalog::new(normalizers)),
            swapper,
            groups,
            control,
            drain_timeout: g.drain_timeout,
            first_token_timeout: g.first_token_timeout,
            idle_timeout: g.stream_idle_timeout,
            request_timeout: g.request_timeout,
            resume_timeout: g.resume_timeout,
            model_cards: models.iter().map(|c| model_card(c)).collect(),
            spec_modes: config.speculation.modes.clone(),
            quarantine: Arc::new(crate::quarantine::Quarantine::new(t.quarantine_ttl, store.clone())),
            warm: crate::groups::Warm::new(g.warm_replay_bytes),
            ledger: crate::control::ledger::Ledger::new(store.clone()),
            store,
            quotas: crate::control::quota::Quotas::new(t.quota, t.quota_mode),
            fair_charge: t.fair_charge,
            long_prompt_tokens: t.reserve.long_prompt_tokens,
            in_flight: Arc::default(),
            settings: if models.len() == 1 {
                config.settings_json()
            } else {
                Value::Array(models.iter().map(|c| c.settings_json()).collect())
            },
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

/// A model's `/v1/models` entry: `root` is the model path `vllm serve` is given.
fn model_card(c: &Config) -> ModelCard {
    let plan = c.plan();
    let cmd = plan.ranks.first().map(|r| r.container.cmd.clone()).unwrap_or_default();
    let root = cmd
        .iter()
        .skip_while(|w| *w != "serve")
        .nth(1)
        .cloned()
        .unwrap_or_default();
    ModelCard {
        id: c.serving.served_model_name.clone(),
        root,
        max_model_len: c.serving.max_model_len,
    }
}

impl App {
    /// The model a request that names none is for: the loaded one (or the one being loaded),
    /// so it never causes a swap.
    pub(crate) fn fallback_model(&self) -> ModelId {
        let Some(s) = &self.swapper else {
            return ModelId::default();
        };
        s.loaded().or_else(|| s.target()).unwrap_or_default()
    }

    /// The 503 for a request whose model is not loaded and that does not load it.
    pub(crate) fn not_loaded(&self, model: ModelId, hint: String) -> crate::api::error::GatewayError {
        let loaded = self.swapper.as_ref().and_then(|s| s.loaded());
        crate::api::error::GatewayError::ModelNotLoaded {
            model: self.models.get(model).served().to_owned(),
            loaded: loaded.map_or_else(|| "none".to_owned(), |l| self.models.get(l).served().to_owned()),
            hint,
        }
    }

    /// Every model in `/admin/status` and `/admin/model`: its name, profile, and whether it is
    /// the loaded one.
    pub(crate) fn models_json(&self) -> Value {
        let loaded = self.swapper.as_ref().map_or(Some(ModelId::default()), |s| s.loaded());
        let list: Vec<Value> = self
            .models
            .ids()
            .map(|id| {
                let n = self.models.get(id);
                json!({"name": n.served(), "profile": n.profile(), "aliases": n.aliases(), "loaded": loaded == Some(id)})
            })
            .collect();
        Value::Array(list)
    }
}

pub(crate) fn status_json(app: &App) -> Value {
    let snap = app.control.snapshot();
    let upstream = app.control.upstream();
    let current = app.models.get(app.fallback_model());
    // The longest any waiter has queued, whichever model it waits for.
    let oldest = app.control.admission().waiting().iter().filter_map(|w| w.oldest).min();
    let oldest_wait_s = oldest.map(|t| (t.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    json!({
        "ready": app.control.is_ready(),
        "upstream": upstream,
        "upstream_url": app.groups.first().upstream.base(),
        "profile": current.profile(),
        "model": current.served(),
        "models": app.models_json(),
        "swap": app.swapper.as_ref().map(|s| s.status_json()),
        "mode": app.control.mode(),
        "vllm": app.groups.vllm_json(),
        "tokens_per_s": (app.control.tokens_per_s() * 10.0).round() / 10.0,
        "admission": {"open": !snap.paused, "capacity": snap.capacity, "in_flight": snap.in_use, "queued": snap.queued, "oldest_wait_s": oldest_wait_s},
        "groups": app.groups.status_json(),
        "store": app.store.as_ref().map(|s| s.status_json()),
        "quarantine": app.quarantine.list(),
    })
}
