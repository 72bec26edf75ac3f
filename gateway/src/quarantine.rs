//! Poison requests: a request vLLM held when its rank group was lost is a suspect. It is
//! quarantined — not sent again, ended with `request_crashed_engine` — when the evidence names
//! it: it ran alone and the group died within [`POISON_WINDOW`] of its dispatch; or its body was
//! lost under twice and no other suspect ran beside it the second time; or three times. A body
//! quarantined after two losses or more is refused at arrival for [`TTL`]. A body lost under
//! twice runs on probation — no other such suspect beside it on its group — so a bystander that
//! shared two crashes with a poison request is told apart from it by the third.
//!
//! A single random crash (an OOM kill, an operator's SIGKILL, a hung collective) costs its
//! bystanders nothing: they are sent again at once, side by side. A stream cut by a loss already
//! ended with its error event; only the strong evidence (alone, soon) is recorded against its
//! body.
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
    /// No other suspect ran on the group from its dispatch to the loss.
    pub(crate) lone_suspect: bool,
}

/// What the gateway does with a request whose group was lost under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Maybe a bystander: sent again once the group is back.
    Suspect,
    /// Not sent again.
    Quarantined,
}

/// The rule, for the `strikes`-th loss under a body.
pub(crate) fn judge(strikes: u32, loss: Loss) -> Verdict {
    let named = (loss.alone && loss.soon) || (strikes >= 2 && loss.lone_suspect) || strikes >= 3;
    if named {
        Verdict::Quarantined
    } else {
        Verdict::Suspect
    }
}

/// What the record says of a body at arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Lost under this many times (0: never), not quarantined for it.
    Struck(u32),
    /// Quarantined after two losses or more: refused.
    Refused,
}

impl Standing {
    pub(crate) fn strikes(self) -> u32 {
        match self {
            Standing::Struck(n) => n,
            Standing::Refused => u32::MAX,
        }
    }
}

/// Strikes from which a suspect runs on probation (no other such suspect beside it).
pub(crate) const PROBATION_FROM: u32 = 2;

#[derive(Debug, Clone, Copy)]
struct Record {
    strikes: u32,
    refused: bool,
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
    /// What is on record for `body` (not forgotten since). Costs nothing while the record is
    /// empty.
    pub(crate) fn check(&self, body: &[u8]) -> Standing {
        if !self.any.load(Ordering::Relaxed) {
            return Standing::Struck(0);
        }
        let records = self.records.lock().expect("quarantine");
        match records.by_body.get(&fingerprint(body)) {
            Some(r) if r.at.elapsed() < TTL && r.refused => Standing::Refused,
            Some(r) if r.at.elapsed() < TTL => Standing::Struck(r.strikes),
            _ => Standing::Struck(0),
        }
    }

    #[cfg(test)]
    fn holds(&self, body: &[u8]) -> bool {
        self.check(body) == Standing::Refused
    }

    /// Counts one loss under `body`; the verdict on the request it was lost under, and the
    /// body's strikes now.
    pub(crate) fn strike(&self, body: &[u8], loss: Loss) -> (Verdict, u32) {
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
        let strikes = records.by_body.get(&key).map_or(0, |r| r.strikes).saturating_add(1);
        let verdict = judge(strikes, loss);
        records.struck += 1;
        let record = Record {
            strikes,
            refused: verdict == Verdict::Quarantined && strikes >= 2,
            at: now,
            order: records.struck,
        };
        records.by_body.insert(key, record);
        self.any.store(true, Ordering::Relaxed);
        (verdict, strikes)
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
    /// A suspect, and no other suspect was on the group when it was sent.
    lone_suspect: bool,
    /// The group's suspect lease count then.
    suspects_routed: u64,
}

impl Dispatched {
    /// Taken right after the request's lease on `group` (marked when it is a suspect), before
    /// it is sent.
    pub(crate) fn now(group: Arc<Group>, seqs: u32, suspect: bool) -> Dispatched {
        let (in_flight, suspects_routed) = group.suspects();
        Dispatched {
            epoch: group.epoch(),
            at: Instant::now(),
            alone: group.in_use() <= seqs,
            routed: group.routed(),
            lone_suspect: suspect && in_flight == 1,
            suspects_routed,
            group,
        }
    }

    /// What a loss noticed now says.
    pub(crate) fn loss(&self) -> Loss {
        Loss {
            alone: self.alone && self.group.routed() == self.routed,
            soon: self.at.elapsed() <= POISON_WINDOW,
            lone_suspect: self.lone_suspect && self.group.suspects().1 == self.suspects_routed,
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
    /// Strikes its body for a loss noticed now; logs and counts the verdict. Also the body's
    /// strikes now.
    pub(crate) fn judge(self) -> (Verdict, u32) {
        let loss = self.dispatched.loss();
        self.record(loss)
    }

    /// A stream cut under the request: once its group's supervisor has confirmed the loss (a
    /// broken connection alone is not one), the strong evidence — it ran alone and the group
    /// died soon after its dispatch — is recorded against its body. The client already has
    /// the stream's error event.
    pub(crate) fn on_cut(self) {
        let loss = self.dispatched.loss();
        if !(loss.alone && loss.soon) {
            return;
        }
        tokio::spawn(async move {
            if self.dispatched.group.lost_since(self.dispatched.epoch).await {
                self.record(loss);
            }
        });
    }

    fn record(&self, loss: Loss) -> (Verdict, u32) {
        let (verdict, strikes) = self.quarantine.strike(&self.body, loss);
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
                    strikes,
                    alone = loss.alone,
                    "request in flight when its group was lost: a suspect, sent again"
                );
            }
            Verdict::Quarantined => {
                counter!(observe::QUARANTINED, "stage" => Stage::Dispatch.label()).increment(1);
                tracing::error!(
                    request_id,
                    client,
                    group,
                    strikes,
                    alone = loss.alone,
                    "request_crashed_engine: quarantined, not sent again"
                );
            }
        }
        (verdict, strikes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn loss(alone: bool, soon: bool, lone_suspect: bool) -> Loss {
        Loss {
            alone,
            soon,
            lone_suspect,
        }
    }
    const LONE_AND_SOON: Loss = loss(true, true, true);
    const CROWDED: Loss = loss(false, true, false);
    const LONE_BUT_LATE: Loss = loss(true, false, true);
    const AMONG_OTHERS_ONLY_SUSPECT: Loss = loss(false, true, true);

    #[test]
    fn the_evidence_that_names_a_request() {
        assert_eq!(judge(1, CROWDED), Verdict::Suspect, "one of several: maybe a bystander");
        assert_eq!(
            judge(1, LONE_BUT_LATE),
            Verdict::Suspect,
            "alone, but long after its dispatch"
        );
        assert_eq!(
            judge(1, AMONG_OTHERS_ONLY_SUSPECT),
            Verdict::Suspect,
            "a first loss needs more"
        );
        assert_eq!(judge(1, LONE_AND_SOON), Verdict::Quarantined);
        assert_eq!(
            judge(2, CROWDED),
            Verdict::Suspect,
            "another suspect shared both losses"
        );
        assert_eq!(judge(2, AMONG_OTHERS_ONLY_SUSPECT), Verdict::Quarantined);
        assert_eq!(judge(3, CROWDED), Verdict::Quarantined, "on probation, and lost again");
    }

    #[test]
    fn strikes_add_up_per_body_and_bodies_quarantined_twice_are_refused() {
        let q = Quarantine::default();
        assert_eq!(q.check(b"a"), Standing::Struck(0), "an empty record");
        assert_eq!(q.strike(b"a", CROWDED), (Verdict::Suspect, 1));
        assert_eq!(q.check(b"a"), Standing::Struck(1));
        assert_eq!(q.strike(b"b", CROWDED), (Verdict::Suspect, 1));
        assert_eq!(q.strike(b"a", CROWDED), (Verdict::Suspect, 2));
        assert_eq!(q.strike(b"a", CROWDED), (Verdict::Quarantined, 3));
        assert!(q.holds(b"a"));
        assert!(!q.holds(b"b"));
        assert_eq!(
            q.strike(b"c", LONE_AND_SOON),
            (Verdict::Quarantined, 1),
            "this request ends"
        );
        assert_eq!(q.check(b"c"), Standing::Struck(1), "its body gets one more chance");
        assert_eq!(q.strike(b"c", LONE_AND_SOON), (Verdict::Quarantined, 2));
        assert!(q.holds(b"c"), "quarantined at its second loss: refused");
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn the_record_is_bounded_oldest_first() {
        let q = Quarantine::default();
        for i in 0..MAX_RECORDS + 10 {
            q.strike(&i.to_le_bytes(), LONE_AND_SOON);
            q.strike(&i.to_le_bytes(), LONE_AND_SOON);
        }
        assert_eq!(q.len(), MAX_RECORDS);
        assert!(!q.holds(&0usize.to_le_bytes()), "the oldest went first");
        assert!(q.holds(&(MAX_RECORDS + 9).to_le_bytes()));
    }
}
