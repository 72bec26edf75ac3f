//! How a relayed stream ends, once, when its body is dropped: its slots back (or to the abort
//! fence when it was cut), its tokens counted, its key's account closed with vLLM's usage (or,
//! cut before that came, what was generated until then) unless its final event closed it, and
//! its one log line written.

use super::Relay;
use crate::control::ledger::Committed;
use crate::observe;
use crate::pipeline::account::{Account, Ending};

impl Drop for Relay {
    fn drop(&mut self) {
        // A cut answer's slots go to the fence (vLLM may still hold it); a whole one's back.
        if let Some(held) = self.ctx.held.take() {
            if self.upstream_ended {
                drop(held.into_parts());
            } else {
                drop(held);
            }
        }
        let outcome = self.outcome_at(self.done);
        if let Some(t) = self.usage.completion {
            self.ctx.control.count_tokens(self.ctx.mode, t);
        }
        if let Some(account) = self.ctx.account.take() {
            let usage = self.usage_so_far(&account);
            // Not awaited: an answer that ended whole was closed at its final event (`finish`).
            drop(account.close(&usage, Ending::of(outcome)));
        }
        observe::generation_done(&observe::Finished {
            request_id: &self.ctx.request_id,
            route: self.ctx.route,
            status: 200,
            model: self.ctx.model.as_deref(),
            usage: self.usage,
            ttft: self.first_at.map(|f| f.duration_since(self.ctx.started)),
            duration: self.ctx.started.elapsed(),
            outcome,
        });
    }
}

impl Relay {
    /// How the stream ended, as its log line and its key's usage name it.
    fn outcome_at(&self, done: bool) -> &'static str {
        match (done, self.outcome) {
            (false, _) => "client_disconnected",
            (true, "completed") if self.resumes > 0 => "resumed",
            (true, outcome) => outcome,
        }
    }

    /// Closes the key's account at the answer's final event (nothing when it has none or it is
    /// closed already).
    pub(super) fn close_account(&mut self) -> Committed {
        let Some(account) = self.ctx.account.take() else {
            return Committed::now();
        };
        let usage = self.usage_so_far(&account);
        account.close(&usage, Ending::of(self.outcome_at(true)))
    }

    /// vLLM's usage; for a stream cut before it came, what was generated until the cut: the
    /// prompt's and the output's token ids where the stream carried them, else the prompt vLLM
    /// reported and one token per streamed event.
    fn usage_so_far(&self, account: &Account) -> observe::Usage {
        let mut usage = self.usage;
        if usage.completion.is_some() {
            return usage;
        }
        match self.trace.as_deref().filter(|t| t.prompt.is_some()) {
            Some(t) => {
                usage.prompt = usage.prompt.or(t.prompt.as_ref().map(|p| p.len() as u64));
                usage.completion = Some(t.output.len() as u64);
            }
            None => usage.completion = Some(u64::from(account.events())),
        }
        usage
    }
}
