//! Poison requests: a request vLLM held when its rank group failed is a suspect, its strikes
//! counted as it is sent again through new epochs. It is quarantined — not sent again, ended
//! with `request_crashed_engine` — when the evidence names it: it ran alone and the engine
//! crashed (a rank exited by itself, `LossCause::Crashed`) within [`POISON_WINDOW`] of its
//! dispatch; or it was lost under twice with no other suspect beside it the second time; or
//! three times. A rank killed from outside (the OOM killer, an operator's SIGKILL), a hang or
//! memguard is no such evidence: a lone request then is sent again once, like a bystander. A request lost under twice runs on
//! probation — no other such suspect beside it on its group — so a bystander that shared two
//! crashes with a poison request is told apart from it by the third. A body quarantined twice
//! (two requests, e.g. a client sending it again) is refused at arrival for QUARANTINE_TTL, or
//! until an operator releases it (`sparkgate quarantine release ID`).
//!
//! Strikes belong to one request, not to its body: identical bodies from different requests
//! (a retrying client, a load loop) share only the quarantine verdicts, so innocent requests that
//! happen to be in flight at two unrelated crashes are never refused for it. A single random
//! crash (an OOM kill, an operator's SIGKILL, a hung collective) costs its bystanders nothing:
//! they are sent again at once, side by side. A stream cut by a loss already ended with its
//! error event; only the strong evidence (alone, soon) counts against its body.
//!
//! Bodies are known by a fingerprint of the body forwarded upstream (SHA-256's first 8 bytes,
//! shown as 16 hex digits: the id an operator releases), computed only when a verdict is
//! recorded and, at arrival, only while something is on record. Each verdict is written to the
//! store (its fingerprint, reason, key, request id, time) before the quarantined request's
//! answer goes out; the record in memory is what arrivals read, and `sync` replaces it with the
//! store's every few seconds, so a restarted gateway and every gateway on one PostgreSQL store
//! refuse the same bodies, an operator's release reaches them all, and a body is forgotten
//! QUARANTINE_TTL after its last verdict. The record is bounded, the oldest entry forgotten first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::counter;
use sha2::{Digest, Sha256};
use sparkgate_events::Event;
use sparkgate_store::Quarantined as Entry;

use crate::control::clients::Caller;
use crate::control::ledger::{now_secs, ANONYMOUS};
use crate::control::storage::StoreSlot;
use crate::groups::{Group, Lost};
use crate::observe;
use sparkgate_supervisor::LossCause;

/// A group lost this soon after a lone request was sent to it is that request's doing.
const POISON_WINDOW: Duration = Duration::from_secs(10);
/// Bodies remembered at most.
const MAX_RECORDS: usize = 4096;
/// How often the record is read again from the store (other gateways' verdicts and releases).
pub(crate) const SYNC_EVERY: Duration = Duration::from_secs(2);
/// The longest a quarantined request's answer waits for its verdict to be written.
const WRITE_WAIT: Duration = Duration::from_secs(5);

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

/// Why a request was quarantined: the evidence that named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// It ran alone and the engine crashed by itself soon after its dispatch.
    CrashedAlone,
    /// Its second loss, with no other suspect beside it.
    LostTwiceAlone,
    /// Its third loss.
    LostThrice,
    /// Its stream was cut when the engine crashed by itself soon after, with it alone.
    CutAlone,
}

impl Reason {
    /// The reason as the store, `/admin/quarantine` and `sparkgate quarantine` show it.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Reason::CrashedAlone => "the engine crashed within 10 s of its dispatch while it ran alone",
            Reason::LostTwiceAlone => "the engine was lost under it twice, the second time with no other suspect",
            Reason::LostThrice => "the engine was lost under it three times",
            Reason::CutAlone => "its stream was cut: the engine crashed within 10 s of its dispatch while it ran alone",
        }
    }
}

/// What the gateway does with a request whose group was lost under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Maybe a bystander: sent again once the group is back.
    Suspect,
    /// Not sent again.
    Quarantined(Reason),
}

/// The rule, for a request's `strikes`-th loss.
fn judge(strikes: u32, loss: Loss) -> Verdict {
    if loss.alone && loss.soon && loss.crashed {
        Verdict::Quarantined(Reason::CrashedAlone)
    } else if strikes >= 2 && loss.lone_suspect {
        Verdict::Quarantined(Reason::LostTwiceAlone)
    } else if strikes >= 3 {
        Verdict::Quarantined(Reason::LostThrice)
    } else {
        Verdict::Suspect
    }
}

/// A request's strikes from which it runs on probation (no other such suspect beside it).
pub(crate) const PROBATION_FROM: u32 = 2;
/// Quarantine verdicts under one body from which it is refused at arrival.
const REFUSED_FROM: u64 = 2;

/// One body on record.
#[derive(Debug)]
struct Kept {
    entry: Entry,
    /// When it was last recorded, in records made (the oldest is forgotten first).
    made: u64,
    /// Its last verdict's write to the store: not done yet, or done as the `writes`-th.
    written: Option<u64>,
}

/// The bodies on record.
#[derive(Debug, Default)]
struct Records {
    by_body: HashMap<u64, Kept>,
    made: u64,
    /// Verdicts written to the store so far: a read that began before a write may miss it.
    writes: u64,
}

/// The gateway's record of quarantined bodies.
#[derive(Debug)]
pub(crate) struct Quarantine {
    records: Mutex<Records>,
    /// Something is on record: arrivals fingerprint their bodies only then.
    any: AtomicBool,
    /// QUARANTINE_TTL in seconds.
    ttl: i64,
    store: Option<Arc<StoreSlot>>,
}

/// A body's fingerprint.
fn fingerprint(body: &[u8]) -> u64 {
    let digest = Sha256::digest(body);
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

impl Quarantine {
    pub(crate) fn new(ttl: Duration, store: Option<Arc<StoreSlot>>) -> Quarantine {
        Quarantine {
            records: Mutex::default(),
            any: AtomicBool::new(false),
            ttl: ttl.as_secs().max(1) as i64,
            store,
        }
    }

    /// Whether `body` is refused at arrival — quarantined twice and not expired or released
    /// since —, by its id. Costs nothing while the record is empty.
    pub(crate) fn refuses(&self, body: &[u8]) -> Option<String> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let records = self.records.lock().expect("quarantine");
        let e = &records.by_body.get(&fingerprint(body))?.entry;
        (e.quarantines >= REFUSED_FROM && e.expires_at > now_secs()).then(|| e.id.clone())
    }

    /// Records a quarantine verdict under `body` in memory; the entry as recorded.
    fn remember(&self, body: &[u8], reason: Reason, key: &str, request_id: &str) -> Entry {
        let print = fingerprint(body);
        let now = now_secs();
        let mut guard = self.records.lock().expect("quarantine");
        let records = &mut *guard;
        records.by_body.retain(|_, k| k.entry.expires_at > now);
        if records.by_body.len() >= MAX_RECORDS && !records.by_body.contains_key(&print) {
            let oldest = records.by_body.iter().min_by_key(|(_, k)| k.made).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                records.by_body.remove(&oldest);
            }
        }
        records.made += 1;
        let made = records.made;
        let kept = records.by_body.entry(print).or_insert_with(|| Kept {
            entry: Entry {
                id: format!("{print:016x}"),
                quarantines: 0,
                reason: String::new(),
                key: String::new(),
                request_id: String::new(),
                first_at: now,
                last_at: now,
                expires_at: now,
            },
            made,
            written: None,
        });
        (kept.made, kept.written) = (made, None);
        let e = &mut kept.entry;
        e.quarantines += 1;
        (e.reason, e.key, e.request_id) = (reason.text().to_owned(), key.to_owned(), request_id.to_owned());
        (e.last_at, e.expires_at) = (now, now + self.ttl);
        self.any.store(true, Ordering::Relaxed);
        e.clone()
    }

    /// Records a quarantine verdict under `body`: in memory at once, in the store when this
    /// returns (or WRITE_WAIT passed: a WARN says only this gateway refuses it then).
    async fn quarantined(&self, body: &[u8], reason: Reason, key: &str, request_id: &str) {
        let entry = self.remember(body, reason, key, request_id);
        let Some(slot) = &self.store else { return };
        let write = async {
            let store = slot.get().await.map_err(|e| e.to_string())?;
            let v = sparkgate_store::Verdict {
                id: &entry.id,
                reason: &entry.reason,
                key: &entry.key,
                request_id: &entry.request_id,
                ttl: self.ttl,
            };
            store.quarantine(v).await.map_err(|e| e.to_string())
        };
        let failed = match tokio::time::timeout(WRITE_WAIT, write).await {
            Ok(Ok(())) => return self.written(&entry.id),
            Ok(Err(e)) => e,
            Err(_) => "no answer within 5 s".to_owned(),
        };
        tracing::warn!(id = %entry.id, error = %failed, "quarantine not written to the store: only this gateway refuses the body, until it restarts");
    }

    /// Body `id`'s last verdict is in the store.
    fn written(&self, id: &str) {
        let mut guard = self.records.lock().expect("quarantine");
        let records = &mut *guard;
        records.writes += 1;
        if let Some(k) = records.by_body.values_mut().find(|k| k.entry.id == id) {
            k.written = Some(records.writes);
        }
    }

    /// The bodies on record, the latest verdict first.
    pub(crate) fn list(&self) -> Vec<Entry> {
        let now = now_secs();
        let records = self.records.lock().expect("quarantine");
        let mut all: Vec<Entry> = records
            .by_body
            .values()
            .map(|k| &k.entry)
            .filter(|e| e.expires_at > now)
            .cloned()
            .collect();
        all.sort_by(|a, b| b.last_at.cmp(&a.last_at).then_with(|| a.id.cmp(&b.id)));
        all
    }

    /// Replaces the record by the store's, read once `writes` verdicts were written: a verdict
    /// of this gateway's not written before the read began is kept.
    fn replace(&self, stored: Vec<Entry>, writes: u64) {
        let mut records = self.records.lock().expect("quarantine");
        // The store lists the latest first: the order made here counts up to the newest.
        let mut fresh: HashMap<u64, Kept> = stored
            .into_iter()
            .rev()
            .filter_map(|e| u64::from_str_radix(&e.id, 16).ok().map(|p| (p, e)))
            .enumerate()
            .map(|(i, (p, entry))| {
                let kept = Kept {
                    entry,
                    made: i as u64,
                    written: Some(0),
                };
                (p, kept)
            })
            .collect();
        let base = fresh.len() as u64;
        for (print, mut k) in records.by_body.drain() {
            if k.written.is_none_or(|w| w > writes) {
                k.made += base;
                fresh.insert(print, k);
            }
        }
        self.any.store(!fresh.is_empty(), Ordering::Relaxed);
        records.made += base;
        records.by_body = fresh;
    }

    /// Reads the record from the store (other gateways' verdicts, releases, expiries).
    pub(crate) async fn sync(&self) -> Result<(), String> {
        let Some(slot) = &self.store else { return Ok(()) };
        let writes = self.records.lock().expect("quarantine").writes;
        let store = slot.get().await.map_err(|e| e.to_string())?;
        store.expire_quarantine().await.map_err(|e| e.to_string())?;
        let stored = store.quarantined().await.map_err(|e| e.to_string())?;
        self.replace(stored, writes);
        Ok(())
    }

    /// Releases a body by its id, here and in the store; whether it was on record.
    pub(crate) async fn release(&self, id: &str) -> Result<bool, String> {
        let here = {
            let mut records = self.records.lock().expect("quarantine");
            let before = records.by_body.len();
            records.by_body.retain(|_, k| k.entry.id != id);
            records.by_body.len() < before
        };
        let stored = match &self.store {
            Some(slot) => {
                let store = slot.get().await.map_err(|e| e.to_string())?;
                store.release(id).await.map_err(|e| e.to_string())?
            }
            None => false,
        };
        Ok(here || stored)
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

    /// Judges this loss by `cause`, noticed now; logs and counts the verdict, and a quarantine
    /// is in the store when this returns. Also the request's strikes now.
    pub(crate) async fn judge(self, cause: LossCause) -> (Verdict, u32) {
        let loss = self.dispatched.loss(cause);
        let strikes = self.strikes.saturating_add(1);
        (self.record(judge(strikes, loss), strikes, loss).await, strikes)
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
                let verdict = Verdict::Quarantined(Reason::CutAlone);
                self.record(verdict, self.strikes.saturating_add(1), loss).await;
            }
        });
    }

    async fn record(&self, verdict: Verdict, strikes: u32, loss: Loss) -> Verdict {
        let (request_id, client) = (self.request_id.as_str(), self.client.label());
        let group = self.dispatched.group.name.as_str();
        match verdict {
            Verdict::Suspect => {
                counter!(observe::SUSPECTS).increment(1);
                tracing::debug!(group, alone = loss.alone, "a suspect");
                Event::Requeued {
                    request_id: request_id.to_owned(),
                    client,
                    strikes,
                }
                .emit();
            }
            Verdict::Quarantined(reason) => {
                counter!(observe::QUARANTINED, "stage" => Stage::Dispatch.label()).increment(1);
                tracing::debug!(group, alone = loss.alone, reason = reason.text(), "quarantined");
                Event::Quarantined {
                    request_id: request_id.to_owned(),
                    client,
                    strikes,
                }
                .emit();
                let key = self.client.key.as_ref().map_or(ANONYMOUS, |k| &k.name);
                self.quarantine.quarantined(&self.body, reason, key, request_id).await;
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
        assert_eq!(judge(1, LONE_AND_SOON), Verdict::Quarantined(Reason::CrashedAlone));
        assert_eq!(
            judge(1, LONE_AND_SOON_KILLED),
            Verdict::Suspect,
            "a kill from outside names no request: sent again once"
        );
        assert_eq!(
            judge(2, LONE_AND_SOON_KILLED),
            Verdict::Quarantined(Reason::LostTwiceAlone),
            "lost under twice with no other suspect beside it"
        );
        assert_eq!(
            judge(2, CROWDED),
            Verdict::Suspect,
            "another suspect shared both losses"
        );
        assert_eq!(
            judge(2, AMONG_OTHERS_ONLY_SUSPECT),
            Verdict::Quarantined(Reason::LostTwiceAlone)
        );
        assert_eq!(
            judge(3, CROWDED),
            Verdict::Quarantined(Reason::LostThrice),
            "on probation, and lost again"
        );
    }

    #[test]
    fn a_body_quarantined_twice_is_refused() {
        let q = Quarantine::new(Duration::from_secs(3_600), None);
        assert!(q.refuses(b"a").is_none(), "an empty record");
        q.remember(b"a", Reason::CrashedAlone, "alice", "req");
        assert!(
            q.refuses(b"a").is_none(),
            "one quarantined request: its body gets one more chance"
        );
        q.remember(b"b", Reason::CrashedAlone, "alice", "req");
        q.remember(b"a", Reason::CrashedAlone, "alice", "req");
        assert!(q.refuses(b"a").is_some());
        assert!(q.refuses(b"b").is_none());
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn the_store_is_the_record_a_verdict_not_yet_written_is_kept_and_a_release_forgets() {
        let q = Quarantine::new(Duration::from_secs(3_600), None);
        q.remember(b"a", Reason::CrashedAlone, "alice", "r1");
        q.remember(b"a", Reason::LostThrice, "alice", "r2");
        let id_a = format!("{:016x}", fingerprint(b"a"));
        q.written(&id_a);
        let mut other = q.list();
        assert_eq!(other.len(), 1);
        assert_eq!((other[0].quarantines, other[0].request_id.as_str()), (2, "r2"));
        assert_eq!(other[0].id, id_a);
        // The store, read after a's write: another gateway's body, and a gone (released there).
        other[0].id = format!("{:016x}", fingerprint(b"b"));
        q.replace(other, 1);
        assert!(q.refuses(b"b").is_some(), "another gateway's verdicts refuse here");
        assert!(q.refuses(b"a").is_none(), "released in the store: released here");
        q.remember(b"c", Reason::CrashedAlone, "bob", "r3");
        q.replace(Vec::new(), 1);
        assert!(
            q.list().iter().any(|e| e.key == "bob"),
            "a verdict not yet written is kept"
        );
        q.written(&format!("{:016x}", fingerprint(b"c")));
        q.replace(Vec::new(), 1);
        assert_eq!(q.len(), 1, "a read begun before its write does not drop it");
        q.replace(Vec::new(), 2);
        assert_eq!(q.len(), 0, "a read after its write: released elsewhere");
        q.remember(b"d", Reason::CrashedAlone, "bob", "r4");
        let mut expired = q.list();
        expired[0].expires_at = now_secs() - 1;
        q.written(&expired[0].id);
        q.replace(expired, 3);
        assert!(q.list().is_empty(), "an expired body is not listed");
        assert!(q.refuses(b"d").is_none());
    }

    #[test]
    fn the_record_is_bounded_oldest_first() {
        let q = Quarantine::new(Duration::from_secs(3_600), None);
        for i in 0..MAX_RECORDS + 10 {
            q.remember(&i.to_le_bytes(), Reason::CrashedAlone, "alice", "req");
            q.remember(&i.to_le_bytes(), Reason::CrashedAlone, "alice", "req");
        }
        assert_eq!(q.len(), MAX_RECORDS);
        assert!(q.refuses(&0usize.to_le_bytes()).is_none(), "the oldest went first");
        assert!(q.refuses(&(MAX_RECORDS + 9).to_le_bytes()).is_some());
    }
}
