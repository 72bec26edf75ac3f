//! The last events of this process, kept in memory for `/admin/events` (the console's event
//! table): a bounded ring written by `Event::emit`, so the page reads what the log says without
//! parsing log files. Events are rare (lifecycle, not per token): one short lock per event.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Event, Level};

/// How many events are kept; the oldest leave first.
pub const KEPT: usize = 500;

/// One event as it was emitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Its place in this process's sequence (1, 2, …): a reader asks for what came after.
    pub seq: u64,
    /// Unix time in milliseconds.
    pub at_ms: u64,
    pub level: Level,
    /// The `event` field's name.
    pub name: &'static str,
    /// The log line's text.
    pub text: String,
    /// The group and epoch it names, where it names one (a lost group: its diagnostics bundle).
    pub group: Option<(String, u64)>,
}

static RING: Mutex<(u64, VecDeque<Recorded>)> = Mutex::new((0, VecDeque::new()));

pub(crate) fn record(event: &Event, text: &str) {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let group = match event {
        Event::GroupLost { group, epoch, .. } => Some((group.clone(), *epoch)),
        _ => None,
    };
    let mut ring = RING.lock().unwrap_or_else(|e| e.into_inner());
    ring.0 += 1;
    let seq = ring.0;
    if ring.1.len() == KEPT {
        ring.1.pop_front();
    }
    ring.1.push_back(Recorded {
        seq,
        at_ms,
        level: event.level(),
        name: event.name(),
        text: text.to_owned(),
        group,
    });
}

/// The kept events at `at_least` or louder, newest first, at most `limit`.
pub fn recent(at_least: Level, limit: usize) -> Vec<Recorded> {
    let ring = RING.lock().unwrap_or_else(|e| e.into_inner());
    ring.1
        .iter()
        .rev()
        .filter(|r| r.level >= at_least)
        .take(limit)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_come_first_filtered_by_level_and_a_lost_group_names_its_epoch() {
        Event::Adopted { epoch: 3 }.emit();
        Event::GroupLost {
            group: "g".into(),
            epoch: 4,
            reason: "rank_exited".into(),
            detail: "x".into(),
            diagnostics: None,
        }
        .emit();
        let all = recent(Level::Info, 10);
        assert!(all.len() >= 2);
        assert!(all[0].seq > all[1].seq);
        let warn = recent(Level::Warn, 10);
        assert!(warn.iter().all(|r| r.level >= Level::Warn));
        let lost = warn.iter().find(|r| r.name == "group_lost").expect("kept");
        assert_eq!(lost.group, Some(("g".into(), 4)));
        assert!(!warn.iter().any(|r| r.name == "adopted"));
    }

    #[test]
    fn the_ring_keeps_the_last_kept_events() {
        for i in 0..(KEPT as u64 + 10) {
            Event::Released { epoch: i }.emit();
        }
        let all = recent(Level::Info, usize::MAX);
        assert_eq!(all.len(), KEPT);
        assert!(all.windows(2).all(|w| w[0].seq == w[1].seq + 1));
    }
}
