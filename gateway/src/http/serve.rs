//! `serve`: builds the shared state, starts the background tasks (the upstream probe or the
//! groups' mirrors, the speculation policy, the limiter's housekeeping, the token-rate sampler)
//! and runs the connection loop until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sparkgate_config::Config;
use sparkgate_events::Event;
use tokio::net::TcpListener;

use super::edge::Edge;
use super::listen::{Front, ListenConfig, ShutdownHooks};
use super::systemd;
use super::tls::Tls;
use crate::admin::ops as admin;
use crate::api::body::BodyLimits;
use crate::app::{App, Shared};
use crate::control::keys::KeyRing;
use crate::control::state::{GatewayControl, UpstreamState};
use crate::groups::{Groups, Upstreams};
use crate::observe;

/// In gateway-only mode nobody supervises the upstream: probe its `/health` every second, and
/// read its `/version` whenever it comes back (it may be a different vLLM now).
async fn probe_upstream(app: Shared) {
    let upstream = &app.groups.first().upstream;
    let mut known = false;
    loop {
        let base = upstream.base().to_owned();
        let (state, event) = if upstream.healthy().await {
            if !known {
                let version = upstream.version().await;
                known = version.is_some();
                app.groups.set_vllm(0, version);
            }
            (UpstreamState::Ready, Event::UpstreamUp { upstream: base })
        } else {
            known = false;
            let detail = format!("{base}/health does not answer 200");
            (
                UpstreamState::Unreachable(detail.clone()),
                Event::UpstreamDown { upstream: base, detail },
            )
        };
        if app.control.set_upstream(state) {
            event.emit();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Serves the gateway on `listener` until `shutdown` resolves, then drains connections for at
/// most the configured drain timeout.
pub async fn serve(
    config: &Config,
    listener: TcpListener,
    control: GatewayControl,
    upstreams: Upstreams,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    observe::metrics_handle();
    // A certificate that cannot serve stops the start here, with the reason.
    let tls = config
        .gateway
        .tls
        .as_ref()
        .map(Tls::load)
        .transpose()
        .map_err(std::io::Error::other)?
        .map(Arc::new);
    if let Some(t) = &config.gateway.tracing {
        observe::otel::init(t).map_err(|e| std::io::Error::other(format!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}")))?;
    }
    let groups = Arc::new(Groups::of(config, &upstreams));
    crate::groups::seed(&control, &groups);
    admission_rules(&control, config);
    // MODELS: one group per model, swapped by the swap runner.
    let models: Vec<sparkgate_config::GroupConfig> = match &upstreams {
        Upstreams::Supervised(list) if groups.models() => list.iter().map(|(g, _)| g.clone()).collect(),
        _ => Vec::new(),
    };
    let swapper = (!models.is_empty()).then(|| crate::groups::start_swaps(control.clone(), groups.clone(), &models));
    let configs: Vec<&Config> = models.iter().map(|m| &m.config).collect();
    let app = App::new(
        config,
        control.clone(),
        groups.clone(),
        Some(Arc::new(store_slot(config)?)),
        (&configs, swapper),
    );
    for sup in groups.all().iter().filter_map(|g| g.supervisor.as_ref()) {
        let board = app.in_flight.clone();
        sup.report_in_flight(Arc::new(move || board.report()));
    }
    let keys = Arc::new(KeyRing::new(config).map_err(std::io::Error::other)?);
    super::reload::watch(keys.clone(), tls.clone(), config.gateway.tenancy.quota_mode);
    if keys.required() {
        seed_quotas(&app).await;
        observe::usage::known(&keys.names(), config.gateway.tenancy.quota_mode);
    }
    // A body refused before a restart is refused from the first request on.
    if let Err(e) = app.quarantine.sync().await {
        tracing::warn!(error = %e, "the quarantine's record not read from the store: bodies refused before are not refused until it is");
    }
    sync_quarantine(&app);
    let edge = Arc::new(Edge::new(config, keys));
    systemd::start(supervised_names(&upstreams));
    watch_upstreams(&app, upstreams, groups);
    background(&app, &edge);
    let (cfg, limits) = connection_limits(config);
    let hooks = shutdown_hooks(control);
    let kept = app.clone();
    let front = tls.map_or(Front::Plain, |tls| {
        super::reload::log_loaded(&tls, "loaded");
        Front::Tls(tls)
    });
    super::listen::run(
        super::stack::stack(app, edge, limits),
        (listener, front),
        cfg,
        shutdown,
        hooks,
    )
    .await;
    // Every finished generation's usage is in the store before the gateway exits.
    kept.ledger.flush().await;
    // And every generation's spans are sent (the exporter blocks its caller).
    let _ = tokio::task::spawn_blocking(observe::otel::flush).await;
    Ok(())
}

/// Who tells the gateway the upstream's state: its own health probe (gateway-only mode), or
/// each group's supervisor through `groups::mirror` — and with one supervised group, the
/// speculation policy that switches its mode.
fn watch_upstreams(app: &Shared, upstreams: Upstreams, groups: Arc<Groups>) {
    let control = &app.control;
    if let Some(warm) = &app.warm {
        for group in groups.all() {
            crate::groups::keep_warm(warm.clone(), group.clone(), control.admission().clone());
        }
    }
    match upstreams {
        Upstreams::Probe => {
            sparkgate_task::spawn("upstream-probe", probe_upstream(app.clone()));
        }
        Upstreams::Supervised(list) if list.len() > 1 => {
            crate::groups::mirror(control.clone(), groups);
            if list
                .iter()
                .any(|(g, _)| g.config.speculation.policy == sparkgate_config::SpecPolicy::Auto)
            {
                tracing::warn!(
                    "SPEC_POLICY=auto runs with one group only; with GROUPS_FILE each group keeps its SPEC_METHOD"
                );
            }
        }
        Upstreams::Supervised(mut list) => {
            crate::groups::mirror(control.clone(), groups);
            let h = list.pop().expect("one group").1;
            let (for_switch, demand) = (app.clone(), control.clone());
            crate::control::spec::run(
                app.spec_policy.clone(),
                h,
                move || {
                    let s = demand.snapshot();
                    (s.in_use + s.queued as u32, demand.delivered_tokens())
                },
                move |mode| admin::auto_switch(&for_switch, mode),
            );
        }
    }
}

/// The periodic upkeep: the rate limiter's forgotten keys, the tokens/s `/admin/status` reports.
/// The response store STORE_URL names (docs/store.md), opened on first use; a location that
/// cannot be read stops the start with the reason.
fn store_slot(config: &Config) -> std::io::Result<crate::control::storage::StoreSlot> {
    let g = &config.gateway;
    let at = sparkgate_store::Location::parse(g.store_url.expose()).map_err(std::io::Error::other)?;
    let retention = sparkgate_store::Retention {
        ttl: (!g.store_ttl.is_zero()).then_some(g.store_ttl),
        max_bytes: (g.store_max_bytes > 0).then_some(g.store_max_bytes),
    };
    Ok(crate::control::storage::StoreSlot::new(at, retention))
}

fn background(app: &Shared, edge: &Edge) {
    if app.store.is_some() {
        let app = app.clone();
        sparkgate_task::spawn("store-sweep", async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                let Some(slot) = app.store.as_ref() else { continue };
                if let Some(store) = slot.opened() {
                    if let Some(stats) = crate::observe::store::sweep(store).await {
                        slot.saw(stats);
                    }
                }
            }
        });
    }
    if let Some(l) = edge.limiter.clone() {
        sparkgate_task::spawn("rate-limit-housekeeping", async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                l.housekeeping();
            }
        });
    }
    let sampled = app.control.clone();
    sparkgate_task::spawn("token-rate", async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            sampled.sample_rate();
        }
    });
}

/// Reads the quarantine's record from the store every `SYNC_EVERY` (other gateways' verdicts
/// and releases, expiries).
fn sync_quarantine(app: &Shared) {
    let q = app.quarantine.clone();
    sparkgate_task::spawn("quarantine-sync", async move {
        let mut failing = false;
        loop {
            tokio::time::sleep(crate::quarantine::SYNC_EVERY).await;
            match q.sync().await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "the quarantine's record not read from the store; kept as it was");
                }
                Err(_) => {}
            }
        }
    });
}

/// Rebuilds each key's quota windows from the store's per-minute usage of the last day.
async fn seed_quotas(app: &Shared) {
    let now = crate::control::ledger::now_secs();
    match app.ledger.tokens_by_minute(now - 86_400 - 60).await {
        Ok(rows) => {
            for (key, minute, tokens) in rows {
                app.quotas.seed(&key, minute, tokens, now);
            }
        }
        Err(e) => tracing::warn!(error = %e, "the last day's usage not read: quotas count from now"),
    }
}

/// The memory guard and the interactive reserve, as the configuration sets them.
fn admission_rules(control: &GatewayControl, config: &Config) {
    control.admission().guard_memory(config.gateway.prefill_bytes_per_token);
    let reserve = config.gateway.tenancy.reserve;
    control
        .admission()
        .reserve_for_interactive(crate::control::reserve::Rule {
            slots: reserve.slots,
            active: reserve.active,
            max_wait: reserve.max_wait,
        });
}

/// The connection loop's and the request bodies' limits.
fn connection_limits(config: &Config) -> (ListenConfig, BodyLimits) {
    let g = &config.gateway;
    let listen = ListenConfig {
        header_read_timeout: g.header_read_timeout,
        drain_timeout: g.drain_timeout,
        max_connections: g.max_connections,
    };
    let body = BodyLimits {
        max: g.max_body_bytes,
        timeout: g.body_timeout,
        min_rate: g.body_min_rate,
    };
    (listen, body)
}

/// What the connection loop tells the gateway as it shuts down (and systemd, at the drain).
fn shutdown_hooks(control: GatewayControl) -> ShutdownHooks {
    let (drain, close) = (control.clone(), control);
    ShutdownHooks {
        draining: Box::new(move || {
            systemd::stopping();
            drain.begin_drain()
        }),
        closing: Box::new(move || close.close()),
    }
}

/// Each supervised group's name and handle (none in gateway-only mode), for systemd's status.
fn supervised_names(upstreams: &Upstreams) -> Vec<(String, sparkgate_supervisor::SupervisorHandle)> {
    match upstreams {
        Upstreams::Supervised(list) => list.iter().map(|(g, h)| (g.name.clone(), h.clone())).collect(),
        Upstreams::Probe => Vec::new(),
    }
}

/// The address a listener ended up on (for logs when PORT is 0).
pub fn local_addr(listener: &TcpListener) -> std::io::Result<SocketAddr> {
    listener.local_addr()
}
