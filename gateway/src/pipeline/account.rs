//! A generation's account with its API key (docs/keys.md): opened when the request arrives,
//! its quota reserved once the body is read (before it takes a place in the queue), the fair
//! queue charged its tokens (FAIR_CHARGE=tokens: the prompt's estimate at admission, the output
//! as it streams), and closed once with how it ended — the quota and the queue settled with
//! vLLM's own usage, the usage written to the ledger and the key's metrics counted.

use std::sync::Arc;
use std::time::Duration;

use sparkgate_config::{FairCharge, QuotaMode};
use sparkgate_store::UsageKey;

use crate::api::error::GatewayError;
use crate::api::family::Api;
use crate::api::normalize::Normalized;
use crate::app::App;
use crate::control::clients::Caller;
use crate::control::fairq::Client;
use crate::control::keys::KeyInfo;
use crate::control::ledger::{now_secs, ANONYMOUS};
use crate::control::quota::Hold;
use crate::observe;

/// What a request that names no output limit is reserved for.
const DEFAULT_OUTPUT_RESERVE: u64 = 1024;
/// Body bytes per prompt token, for the estimate made before vLLM has tokenised it.
const BYTES_PER_TOKEN: u64 = 4;
/// Streamed events between charges of the fair queue (one lock per this many tokens).
const CHARGE_EVERY: u32 = 32;

/// How a generation ended, as its key's usage counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Completed,
    /// Its client left before the end; counted with what was generated until then.
    Disconnected,
    /// Refused for its key's quota.
    Refused,
    Error,
}

impl Ending {
    /// By the outcome a generation's log line names.
    pub(crate) fn of(outcome: &str) -> Ending {
        match outcome {
            "completed" | "resumed" => Ending::Completed,
            "client_disconnected" => Ending::Disconnected,
            "quota" => Ending::Refused,
            _ => Ending::Error,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Disconnected => "disconnected",
            Ending::Refused => "refused",
            Ending::Error => "error",
        }
    }
}

pub(crate) struct Account {
    app: Arc<App>,
    key: Option<KeyInfo>,
    route: &'static str,
    model: Option<Arc<str>>,
    hold: Option<Hold>,
    /// Over its quota (refused, or served in shadow mode).
    refused: bool,
    /// Its prompt's estimate (tokens).
    estimate: u64,
    /// FAIR_CHARGE=tokens: the client charged, and what it was charged so far.
    fair: Option<(Client, u64)>,
    streamed: u32,
    waited: Option<Duration>,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account").field("key", &self.name()).finish_non_exhaustive()
    }
}

impl Account {
    pub(crate) fn open(app: &Arc<App>, caller: &Caller, route: &'static str) -> Account {
        Account {
            app: app.clone(),
            key: caller.key.clone(),
            route,
            model: None,
            hold: None,
            refused: false,
            estimate: 0,
            fair: None,
            streamed: 0,
            waited: None,
        }
    }

    fn name(&self) -> &str {
        self.key.as_ref().map_or(ANONYMOUS, |k| &k.name)
    }

    /// Reserves the request's cost under its key's quotas: its prompt's estimate plus its output
    /// limit, for each sequence. Over a quota: 429 (enforced) or counted and served (shadow).
    pub(crate) fn reserve(&mut self, api: Api, norm: &Normalized, bytes: usize) -> Result<(), GatewayError> {
        self.model = norm.model.clone();
        self.estimate = bytes as u64 / BYTES_PER_TOKEN;
        let Some(key) = &self.key else { return Ok(()) };
        let seqs = norm.sequences.total();
        let output = api.output_limit(&norm.body).unwrap_or(DEFAULT_OUTPUT_RESERVE);
        let cost = self.estimate + output * u64::from(seqs);
        let quotas = &self.app.quotas;
        let (hold, refusal) = quotas.reserve(key, cost, seqs, now_secs());
        self.hold = hold;
        let Some(r) = refusal else { return Ok(()) };
        self.refused = true;
        observe::usage::refused(&key.name, r.limit, quotas.mode);
        let retry_after_s = r.retry_after.as_secs();
        match quotas.mode {
            QuotaMode::Enforce => {
                tracing::warn!(key = %key.name, limit = r.limit.label(), quota = r.quota, retry_after_s, "quota: refused");
                Err(GatewayError::QuotaExceeded {
                    limit: r.limit.label(),
                    quota: r.quota,
                    retry_after: r.retry_after,
                })
            }
            QuotaMode::Shadow => {
                tracing::warn!(key = %key.name, limit = r.limit.label(), quota = r.quota, retry_after_s, "quota (shadow): would have refused");
                Ok(())
            }
        }
    }

    /// The queue's client for this request, charged its prompt's estimate when the queue
    /// charges tokens.
    pub(crate) fn client(&self, client: Client) -> Client {
        match self.app.fair_charge {
            FairCharge::Tokens => client.costing(self.estimate),
            FairCharge::Sequences => client,
        }
    }

    /// Admitted after `waited` in the queue as `client`.
    pub(crate) fn admitted(&mut self, client: Client, waited: Duration) {
        self.waited = Some(waited);
        if self.app.fair_charge == FairCharge::Tokens {
            self.fair = Some((client, self.estimate.max(1)));
        }
        observe::usage::waited(self.name(), waited.as_secs_f64());
    }

    /// One streamed event (about a token): the queue is charged for every `CHARGE_EVERY`.
    pub(crate) fn streamed(&mut self) {
        self.streamed += 1;
        if self.streamed % CHARGE_EVERY == 0 {
            if let Some((client, charged)) = self.fair.as_mut() {
                *charged += u64::from(CHARGE_EVERY);
                self.app.control.admission().charge(client, i64::from(CHARGE_EVERY));
            }
        }
    }

    /// The events streamed so far.
    pub(crate) fn events(&self) -> u32 {
        self.streamed
    }

    /// Closes the account with vLLM's usage and how the request ended.
    pub(crate) fn close(mut self, usage: &observe::Usage, ending: Ending) {
        let ending = if self.refused && self.hold.is_none() {
            Ending::Refused
        } else {
            ending
        };
        let (prompt, completion) = (usage.prompt.unwrap_or(0), usage.completion.unwrap_or(0));
        if let Some(hold) = self.hold.take() {
            self.app.quotas.settle(hold, prompt + completion);
        }
        if let Some((client, charged)) = self.fair.take() {
            let delta = (prompt + completion) as i64 - charged as i64;
            self.app.control.admission().charge(&client, delta);
        }
        let mut counted = sparkgate_store::Usage {
            requests: 1,
            errors: u64::from(ending == Ending::Error),
            disconnects: u64::from(ending == Ending::Disconnected),
            refusals: u64::from(self.refused),
            prompt,
            cached: usage.cached.unwrap_or(0),
            completion,
            reasoning: usage.reasoning.unwrap_or(0),
            ..Default::default()
        };
        if let Some(w) = self.waited {
            counted.waited(w.as_millis() as u64);
        }
        observe::usage::finished(self.name(), self.route, ending.label(), &counted);
        let who = UsageKey {
            key: self.name().to_owned(),
            model: self.model.as_deref().unwrap_or("-").to_owned(),
            route: self.route.to_owned(),
        };
        self.app.ledger.add(who, counted);
    }
}
