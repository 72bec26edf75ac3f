//! The speculation policy at work: every second the demand width (admission in flight + queued)
//! goes to `sparkgate_spec::policy::AutoPolicy`; a switch it takes drains and
//! restarts the group into the chosen mode. Decisions (taken or declined) are logged, kept for
//! `/admin/spec` and counted in metrics. An operator's mode pin turns `auto` off until released.
//! Every second in a steady mode also teaches the policy the tokens delivered at that width, and
//! every switch it asked for, how long the restart took (see `sparkgate_spec::policy`'s learning rule).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sparkgate_config::{SpecMethod, SpecPolicy, Speculation};
use sparkgate_spec::policy::{AutoPolicy, Decision, ModeRates, PolicySettings};
use sparkgate_supervisor::{GroupState, SupervisorHandle};

const KEPT_DECISIONS: usize = 20;

/// Shared between the policy task and `/admin/spec`.
#[derive(Debug)]
pub(crate) struct ModePolicy {
    /// `auto` while the policy may switch (SpecPolicy::Auto); an atomic, as `/admin/spec`
    /// flips it while the policy task reads it every second.
    auto: AtomicBool,
    policy: Mutex<AutoPolicy>,
    methods: Vec<SpecMethod>,
    decisions: Mutex<VecDeque<Decision>>,
    /// Set while a switch the policy asked for is draining or restarting.
    switching: AtomicBool,
}

impl ModePolicy {
    pub(crate) fn new(spec: &Speculation) -> Arc<Self> {
        let modes: Vec<ModeRates> = spec
            .modes
            .iter()
            .map(|m| ModeRates {
                name: m.method,
                tokens_per_s: m.throughput.points().iter().map(|p| p.tokens_per_s).collect(),
            })
            .collect();
        let current = spec.modes.iter().position(|m| m.method == spec.active).unwrap_or(0);
        let a = &spec.auto;
        let settings = PolicySettings {
            restart_s: a.restart_s,
            min_dwell_s: a.min_dwell_s,
            hold_s: a.hold_s,
            margin: a.margin,
            rate_tau_s: a.rate_tau_s,
            max_horizon_s: PolicySettings::for_restart(a.restart_s).max_horizon_s,
        };
        Arc::new(Self {
            auto: AtomicBool::new(spec.policy == SpecPolicy::Auto),
            policy: Mutex::new(AutoPolicy::new(modes, current, settings, 0.0)),
            methods: spec.modes.iter().map(|m| m.method).collect(),
            decisions: Mutex::new(VecDeque::new()),
            switching: AtomicBool::new(false),
        })
    }

    pub(crate) fn policy(&self) -> SpecPolicy {
        if self.auto.load(Ordering::SeqCst) {
            SpecPolicy::Auto
        } else {
            SpecPolicy::Fixed
        }
    }

    /// `Auto` releases an operator's pin; `Fixed` pins the current mode.
    pub(crate) fn set_policy(&self, policy: SpecPolicy) {
        self.auto.store(policy == SpecPolicy::Auto, Ordering::SeqCst);
    }

    pub(crate) fn decisions(&self) -> Vec<Decision> {
        self.decisions.lock().expect("decisions lock").iter().cloned().collect()
    }

    pub(crate) fn settings(&self) -> PolicySettings {
        self.policy.lock().expect("policy lock").settings().clone()
    }

    /// What the policy learned: the machine-wide speed factor, the configured restart cost and
    /// each mode's seeded, measured and used table.
    pub(crate) fn learned(&self) -> serde_json::Value {
        let p = self.policy.lock().expect("policy lock");
        serde_json::json!({
            "speed_factor": p.speed_factor(),
            "configured_restart_s": p.configured_restart_s(),
            "tables": p.tables(),
        })
    }

    fn record(&self, d: Decision) {
        tracing::info!(
            from = %d.from, to = %d.to, width = d.width, gain_tokens = d.gain_tokens, cost_tokens = d.cost_tokens,
            expected_s = d.expected_s, taken = d.taken, why = %d.why, "speculation policy decision"
        );
        metrics::counter!("sparkgate_spec_decisions_total", "to" => d.to.as_str(), "taken" => d.taken.to_string())
            .increment(1);
        let mut q = self.decisions.lock().expect("decisions lock");
        if q.len() == KEPT_DECISIONS {
            q.pop_front();
        }
        q.push_back(d);
    }
}

/// Runs the policy every second for the gateway's life. `demand` gives the demand width and the
/// completion tokens delivered so far; `switch` drains and restarts into a mode.
pub(crate) fn run(
    spec: Arc<ModePolicy>,
    supervisor: SupervisorHandle,
    demand: impl Fn() -> (u32, u64) + Send + 'static,
    switch: impl Fn(SpecMethod) + Send + 'static,
) {
    sparkgate_task::spawn("spec-policy", async move {
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let (mut last_tokens, mut last_at) = (demand().1, 0.0);
        // When the switch the policy asked for began, and the epoch it asked from.
        let mut switch_began: Option<(f64, u64)> = None;
        loop {
            tick.tick().await;
            let now = started.elapsed().as_secs_f64();
            let (width, tokens) = demand();
            let (delivered, seconds) = (tokens.saturating_sub(last_tokens), now - last_at);
            (last_tokens, last_at) = (tokens, now);
            let status = supervisor.status();
            if !matches!(status.state, GroupState::Ready { .. }) {
                continue;
            }
            let width = f64::from(width);
            metrics::gauge!("sparkgate_demand_width").set(width);
            let decision = {
                let mut policy = spec.policy.lock().expect("policy lock");
                // The group runs whatever mode the supervisor says (a switch done, an operator pin).
                if let Some(i) = spec.methods.iter().position(|m| *m == status.mode) {
                    if i != policy.current() {
                        policy.set_current(i, now);
                        if let Some((began, _)) = switch_began.take() {
                            policy.restart_measured(now - began);
                        }
                        spec.switching.store(false, Ordering::SeqCst);
                        // Tokens of the second the mode changed belong to neither mode cleanly.
                        continue;
                    }
                }
                if spec.switching.load(Ordering::SeqCst) {
                    // A newer epoch runs and the mode did not change: that switch will not
                    // happen (an operator's pin or restart came first); the policy decides again.
                    match switch_began {
                        Some((_, from)) if status.epoch > from => {
                            tracing::info!(epoch = status.epoch, mode = %status.mode, "the policy's switch was superseded");
                            switch_began = None;
                            spec.switching.store(false, Ordering::SeqCst);
                        }
                        _ => continue,
                    }
                }
                let current = policy.current();
                policy.learn(current, width, delivered as f64, seconds);
                if spec.policy() == SpecPolicy::Fixed {
                    continue;
                }
                policy.observe(now, width)
            };
            if let Some(d) = decision {
                let target = spec.methods.iter().copied().find(|m| *m == d.to);
                let taken = d.taken;
                spec.record(d);
                if let (true, Some(mode)) = (taken, target) {
                    spec.switching.store(true, Ordering::SeqCst);
                    switch_began = Some((now, status.epoch));
                    switch(mode);
                }
            }
        }
    });
}
