//! Poison requests: a request vLLM held when its rank group failed is a suspect, its strikes
//! counted as it is sent again through new epochs. It is quarantined — not sent again, ended
//! with `request_crashed_engine` — when the evidence names it: it ran alone and the engine
//! crashed (a rank exited by itself, `LossCause::Crashed`) within [`POISON_WINDOW`] of its
//! dispatch; or it was lost under twice with no other suspect beside it the second time; or
//! three times. A rank killed from outside (the OOM killer, an operator's SIGKILL), a hang or
//! memguard is no such evidence: a lone request then is sent again once, like a bystander. A request lost under twice runs on
//! probation — no other such suspect beside it on its group — so a bystander that shared two
//! crashes with a poison request is told apart from it by the third. A body quarantined twice
//! (two requests, e.g. a client sending it again) is refused at arrival for [`TTL`].
//!
//! Strikes belong to one request, not to its body: identical bodies from different requests
//! (a retrying client, a load loop) share only the quarantine verdicts, so innocent requests that
//! happen to be in flight at two unrelated crashes are never refused for it. A single random
//! crash (an OOM kill, an operator's SIGKILL, a hung collective) costs its bystanders nothing:
//! they are sent again at once, side by side. A stream cut by a loss already ended with its
//! error event; only the strong evidence (alone, soon) counts against its body.
//!
//! Bodies are known by a fingerprint of the body forwarded upstream, computed only when a
//! verdict is recorded and, at arrival, only while something is on record; the record is a
//! bounded map, the oldest entry forgotten first.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::counter;
use sparkgate_events::Event;

use crate::control::clients::Caller;
use crate::groups::{Group, Lost};
use crate::observe;
use sparkgate_supervisor::LossCause;

/// A group lost this soon after a lone request was sent to it is that request's doing.
const POISON_WINDOW: Duration = Duration::from_secs(10);
/// How long a quarantined body is remembered.
const TTL: Duration = Duration::from_secs(3600);
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
    /// The engine crashed by itself (not killed, hung or stopped from outside).
    pub(crate) crashed: bool,
}

/// What the gateway does with a request whose group was lost under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Maybe a bystander: sent again once the group is back.
    Suspect,
    /// Not sent again.
    Quarantined,
}

/// The rule, for a request's `strikes`-th loss.
fn judge(strikes: u32, loss: Loss) -> Verdict {
    let named = (loss.alone && loss.soon && loss.crashed) || (strikes >= 2 && loss.lone_suspect) || strikes >= 3;
    if named {
        Verdict::Quarantined
    } else {
        Verdict::Suspect
    }
}

/// A request's strikes from which it runs on probation (no other such suspect beside it).
pub(crate) const PROBATION_FROM: u32 = 2;
/// Quarantine verdicts under one body from which it is refused at arrival.
const REFUSED_FROM: u32 = 2;

#[derive(Debug, Clone, Copy)]
struct Record {
    /// Requests quarantined under this body.
    quarantines: u32,
    at: Instant,
    /// When it was last recorded, in records made: the oldest is forgotten first.
    order: u64,
}

#[derive(Debug, Default)]
struct Records {
    by_body: HashMap<u64, Record>,
    recorded: u64,
}

/// The gateway's record of quarantined bodies.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    records: Mutex<Records>,
    /// Something is on record: arrivals fingerprint their bodies only then.
    any: AtomicBool,
}

/// A body's fingerprint.
fn fingerprint(body: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

impl Quarantine {
    /// Whether `body` is refused at arrival: quarantined twice and not forgotten since. Costs
    /// nothing while the record is empty.
    pub(crate) fn refuses(&self, body: &[u8]) -> bool {
        if !self.any.load(Ordering::Relaxed) {
            return false;
        }
        let records = self.records.lock().expect("quarantine");
        records
            .by_body
            .get(&fingerprint(body))
            .is_some_and(|r| r.quarantines >= REFUSED_FROM && r.at.elapsed() < TTL)
    }

    /// Records a quarantine verdict under `body`.
    fn quarantined(&self, body: &[u8]) {
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
        records.recorded += 1;
        let quarantines = records.by_body.get(&key).map_or(0, |r| r.quarantines).saturating_add(1);
        let order = records.recorded;
        records.by_body.insert(
            key,
            Record {
                quarantines,
                at: now,
                order,
            },
        );
        self.any.store(true, Ordering::Relaxed);
    }

    /// Bodies on record.
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

    /// What a loss by `cause`, noticed now, says.
    pub(crate) fn loss(&self, cause: LossCause) -> Loss {
        Loss {
            alone: self.alone && self.group.routed() == self.routed,
            soon: self.at.elapsed() <= POISON_WINDOW,
            lone_suspect: self.lone_suspect && self.group.suspects().1 == self.suspects_routed,
            crashed: cause == LossCause::Crashed,
        }
    }
}

/// Where a request is quarantined.
pub(crate) use crate::observe::QuarantineStage as Stage;

/// A request whose group was lost while vLLM held it, with what judging it needs.
#[derive(Debug)]
pub(crate) struct Suspect {
    /// Its losses before this one.
    pub(crate) strikes: u32,
    pub(crate) quarantine: Arc<Quarantine>,
    /// The body as forwarded: its fingerprint is taken only now.
    pub(crate) body: Bytes,
    pub(crate) dispatched: Dispatched,
    pub(crate) request_id: String,
    /// Who sent it (named in a log line only, by `Caller::label`).
    pub(crate) client: Caller,
}

impl Suspect {
    /// The same request with `strikes` losses, sent again as `dispatched` (a continuation).
    pub(crate) fn again(&self, strikes: u32, dispatched: Dispatched) -> Suspect {
        Suspect {
            strikes,
            quarantine: self.quarantine.clone(),
            body: self.body.clone(),
            dispatched,
            request_id: self.request_id.clone(),
            client: self.client.clone(),
        }
    }

    /// Judges this loss by `cause`, noticed now; logs and counts the verdict. Also the
    /// request's strikes now.
    pub(crate) fn judge(self, cause: LossCause) -> (Verdict, u32) {
        let loss = self.dispatched.loss(cause);
        let strikes = self.strikes.saturating_add(1);
        (self.record(judge(strikes, loss), strikes, loss), strikes)
    }

    /// A stream cut under the request: once its group's supervisor has confirmed the loss (a
    /// broken connection alone is not one), the strong evidence — it ran alone and the group
    /// died soon after its dispatch — counts against its body. The client already has the
    /// stream's error event.
    pub(crate) fn on_cut(self) {
        let loss = self.dispatched.loss(LossCause::Crashed);
        if !(loss.alone && loss.soon) {
            return;
        }
        sparkgate_task::spawn("quarantine-verdict", async move {
            let lost = self.dispatched.group.lost_since(self.dispatched.epoch).await;
            if lost == Some(Lost::Failed(LossCause::Crashed)) {
                self.record(Verdict::Quarantined, self.strikes.saturating_add(1), loss);
            }
        });
    }

    fn record(&self, verdict: Verdict, strikes: u32, loss: Loss) -> Verdict {
        let (request_id, client) = (self.request_id.as_str(), self.client.label());
        let client = client.as_str();
        let group = self.dispatched.group.name.as_str();
        match verdict {
            Verdict::Suspect => {
                counter!(observe::SUSPECTS).increment(1);
                tracing::debug!(group, alone = loss.alone, "a suspect");
                Event::Requeued {
                    request_id: request_id.to_owned(),
                    client: client.to_owned(),
                    strikes,
                }
                .emit();
            }
            Verdict::Quarantined => {
                self.quarantine.quarantined(&self.body);
                counter!(observe::QUARANTINED, "stage" => Stage::Dispatch.label()).increment(1);
                tracing::debug!(group, alone = loss.alone, "quarantined");
                Event::Quarantined {
                    request_id: request_id.to_owned(),
                    client: client.to_owned(),
                    strikes,
                }
                .emit();
            }
        }
        verdict
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
            crashed: true,
        }
    }
    const LONE_AND_SOON: Loss = loss(true, true, true);
    /// Alone and soon, but the rank was killed from outside (or hung, or memguard fired).
    const LONE_AND_SOON_KILLED: Loss = Loss {
        crashed: false,
        ..LONE_AND_SOON
    };
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
            judge(1, LONE_AND_SOON_KILLED),
            Verdict::Suspect,
            "a kill from outside names no request: sent again once"
        );
        assert_eq!(
            judge(2, LONE_AND_SOON_KILLED),
            Verdict::Quarantined,
            "lost under twice with no other suspect beside it"
        );
        assert_eq!(
            judge(2, CROWDED),
            Verdict::Suspect,
            "another suspect shared both losses"
        );
        assert_eq!(judge(2, AMONG_OTHERS_ONLY_SUSPECT), Verdict::Quarantined);
        assert_eq!(judge(3, CROWDED), Verdict::Quarantined, "on probation, and lost again");
    }

    #[test]
    fn a_body_quarantined_twice_is_refused() {
        let q = Quarantine::default();
        assert!(!q.refuses(b"a"), "an empty record");
        q.quarantined(b"a");
        assert!(
            !q.refuses(b"a"),
            "one quarantined request: its body gets one more chance"
        );
        q.quarantined(b"b");
        q.quarantined(b"a");
        assert!(q.refuses(b"a"));
        assert!(!q.refuses(b"b"));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn the_record_is_bounded_oldest_first() {
        let q = Quarantine::default();
        for i in 0..MAX_RECORDS + 10 {
            q.quarantined(&i.to_le_bytes());
            q.quarantined(&i.to_le_bytes());
        }
        assert_eq!(q.len(), MAX_RECORDS);
        assert!(!q.refuses(&0usize.to_le_bytes()), "the oldest went first");
        assert!(q.refuses(&(MAX_RECORDS + 9).to_le_bytes()));
    }
}
