//! Poison requests: a request whose rank group was lost while vLLM held it is a suspect, and
//! one that is caught twice — or at once, when it ran alone and the group died within
//! [`POISON_WINDOW`] of its dispatch — is quarantined: it is not sent again, it ends with
//! `request_crashed_engine`, and the same body sent again is refused at arrival for [`TTL`].
//! Without this guard the gateway requeues such a request into every new epoch (a request
//! that never reached a rank must not fail with it) until the restart budget is spent and the
//! group is `failed` for everyone.
//!
//! Requests are known by a fingerprint of the body forwarded upstream, computed only when a
//! loss is judged and, at arrival, only while something is on record; the record is a bounded
//! map, the oldest entry forgotten first.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::counter;

use crate::clients::Caller;
use crate::groups::Group;
use crate::observe;

/// A group lost this soon after a lone request was sent to it is that request's doing.
pub(crate) const POISON_WINDOW: Duration = Duration::from_secs(10);
/// How long a suspect or a quarantined body is remembered.
pub(crate) const TTL: Duration = Duration::from_secs(3600);
/// Bodies remembered at most.
const MAX_RECORDS: usize = 4096;

/// What one loss says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loss {
    /// Nothing else ran on the group from its dispatch to the loss.
    pub(crate) alone: bool,
    /// The loss came within [`POISON_WINDOW`] of its dispatch.
    pub(crate) soon: bool,
}

/// What the gateway does with a request whose group was lost under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Maybe a bystander: sent again once the group is back.
    Suspect,
    /// Not sent again.
    Quarantined,
}

/// The rule: the second loss under the same body, or a first one that can only be its own.
pub(crate) fn judge(strikes: u32, loss: Loss) -> Verdict {
    if strikes >= 2 || (loss.alone && loss.soon) {
        Verdict::Quarantined
    } else {
        Verdict::Suspect
    }
}

#[derive(Debug, Clone, Copy)]
struct Record {
    strikes: u32,
    verdict: Verdict,
    at: Instant,
    /// When it was last struck, in strikes counted: the oldest is forgotten first.
    order: u64,
}

#[derive(Debug, Default)]
struct Records {
    by_body: HashMap<u64, Record>,
    struck: u64,
}

/// The gateway's record of suspects and quarantined bodies.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    records: Mutex<Records>,
    /// Something is on record: arrivals fingerprint their bodies only then.
    any: AtomicBool,
}

/// A body's fingerprint.
pub(crate) fn fingerprint(body: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

impl Quarantine {
    /// What is on record for `body` (not forgotten since): a suspect runs on probation, a
    /// quarantined body is refused. Costs nothing while the record is empty.
    pub(crate) fn check(&self, body: &[u8]) -> Option<Verdict> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let records = self.records.lock().expect("quarantine");
        let record = records.by_body.get(&fingerprint(body))?;
        (record.at.elapsed() < TTL).then_some(record.verdict)
    }

    #[cfg(test)]
    fn holds(&self, body: &[u8]) -> bool {
        self.check(body) == Some(Verdict::Quarantined)
    }

    /// Counts one loss under `body`; the verdict.
    pub(crate) fn strike(&self, body: &[u8], loss: Loss) -> Verdict {
        let key = fingerprint(body);
        let now = Instant::now();
        let mut guard = self.records.lock().expect("quarantine");
        let records = &mut *guard;
        records.by_body.retain(|_, r| now.duration_since(r.at) < TTL);
        if records.by_body.len() >= MAX_RECORDS && !records.by_body.contains_key(&key) {
            let oldest = records.by_body.iter().min_by_key(|(_, r)| r.order).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                records.by_body.remove(&oldest);
            }
        }
        let strikes = records.by_body.get(&key).map_or(0, |r| r.strikes) + 1;
        let verdict = judge(strikes, loss);
        records.struck += 1;
        let order = records.struck;
        records.by_body.insert(
            key,
            Record {
                strikes,
                verdict,
                at: now,
                order,
            },
        );
        self.any.store(true, Ordering::Relaxed);
        verdict
    }

    /// Bodies on record, quarantined or suspected.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.lock().expect("quarantine").by_body.len()
    }
}

/// Where and when a request was sent: what its loss is judged by.
#[derive(Debug, Clone)]
pub(crate) struct Dispatched {
    pub(crate) group: Arc<Group>,
    pub(crate) epoch: Option<u64>,
    at: Instant,
    /// Only this request's sequences were on the group when it was sent.
    alone: bool,
    /// The group's lease count then (a later lease means something else ran beside it).
    routed: u64,
}

impl Dispatched {
    /// Taken right after the request's lease on `group`, before it is sent.
    pub(crate) fn now(group: Arc<Group>, seqs: u32) -> Dispatched {
        Dispatched {
            epoch: group.epoch(),
            at: Instant::now(),
            alone: group.in_use() <= seqs,
            routed: group.routed(),
            group,
        }
    }

    /// What a loss noticed now says.
    pub(crate) fn loss(&self) -> Loss {
        Loss {
            alone: self.alone && self.group.routed() == self.routed,
            soon: self.at.elapsed() <= POISON_WINDOW,
        }
    }
}

/// Where a request is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// After its group was lost under it.
    Dispatch,
    /// At arrival: the same body was quarantined before.
    Arrival,
}

impl Stage {
    pub(crate) fn label(self) -> &'static str {
        observe::QUARANTINE_STAGES[self as usize]
    }
}

/// A request whose group was lost while vLLM held it, with what judging it needs.
#[derive(Debug)]
pub(crate) struct Suspect {
    pub(crate) quarantine: Arc<Quarantine>,
    /// The body as forwarded: its fingerprint is taken only now.
    pub(crate) body: Bytes,
    pub(crate) dispatched: Dispatched,
    pub(crate) request_id: String,
    /// Who sent it (named in a log line only, by `Caller::label`).
    pub(crate) client: Caller,
}

impl Suspect {
    /// Strikes its body for a loss noticed now; logs and counts the verdict.
    pub(crate) fn judge(self) -> Verdict {
        let loss = self.dispatched.loss();
        self.record(loss)
    }

    /// A stream cut under the request: judged once its group's supervisor has confirmed the
    /// loss (a broken connection alone is not one). The client already has the stream's error
    /// event; the verdict guards the next time the same body comes.
    pub(crate) fn on_cut(self) {
        let loss = self.dispatched.loss();
        tokio::spawn(async move {
            if self.dispatched.group.lost_since(self.dispatched.epoch).await {
                self.record(loss);
            }
        });
    }

    fn record(&self, loss: Loss) -> Verdict {
        let verdict = self.quarantine.strike(&self.body, loss);
        let (request_id, client) = (self.request_id.as_str(), self.client.label());
        let client = client.as_str();
        let group = self.dispatched.group.name.as_str();
        match verdict {
            Verdict::Suspect => {
                counter!(observe::SUSPECTS).increment(1);
                tracing::warn!(
                    request_id,
                    client,
                    group,
                    alone = loss.alone,
                    "request in flight when its group was lost: a suspect (sent again, unless its stream had begun)"
                );
            }
            Verdict::Quarantined => {
                counter!(observe::QUARANTINED, "stage" => Stage::Dispatch.label()).increment(1);
                tracing::error!(
                    request_id,
                    client,
                    group,
                    alone = loss.alone,
                    "request_crashed_engine: quarantined, not sent again; the same body is refused"
                );
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONE_AND_SOON: Loss = Loss {
        alone: true,
        soon: true,
    };
    const CROWDED: Loss = Loss {
        alone: false,
        soon: true,
    };
    const LONE_BUT_LATE: Loss = Loss {
        alone: true,
        soon: false,
    };

    #[test]
    fn the_second_loss_or_a_lone_prompt_one_quarantines() {
        assert_eq!(judge(1, CROWDED), Verdict::Suspect, "one of several: maybe a bystander");
        assert_eq!(
            judge(1, LONE_BUT_LATE),
            Verdict::Suspect,
            "alone, but long after its dispatch"
        );
        assert_eq!(judge(1, LONE_AND_SOON), Verdict::Quarantined);
        assert_eq!(judge(2, CROWDED), Verdict::Quarantined);
        assert_eq!(judge(2, LONE_BUT_LATE), Verdict::Quarantined);
    }

    #[test]
    fn strikes_add_up_per_body_and_only_quarantined_bodies_are_held() {
        let q = Quarantine::default();
        assert!(!q.holds(b"a"), "an empty record holds nothing");
        assert_eq!(q.strike(b"a", CROWDED), Verdict::Suspect);
        assert!(!q.holds(b"a"), "a suspect is sent again");
        assert_eq!(q.strike(b"b", CROWDED), Verdict::Suspect);
        assert_eq!(q.strike(b"a", CROWDED), Verdict::Quarantined, "a's second loss");
        assert!(q.holds(b"a"));
        assert!(!q.holds(b"b"));
        assert_eq!(q.strike(b"c", LONE_AND_SOON), Verdict::Quarantined);
        assert!(q.holds(b"c"));
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn the_record_is_bounded_oldest_first() {
        let q = Quarantine::default();
        for i in 0..MAX_RECORDS + 10 {
            q.strike(&i.to_le_bytes(), LONE_AND_SOON);
        }
        assert_eq!(q.len(), MAX_RECORDS);
        assert!(!q.holds(&0usize.to_le_bytes()), "the oldest went first");
        assert!(q.holds(&(MAX_RECORDS + 9).to_le_bytes()));
    }
}
