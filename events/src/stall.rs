//! A stall's lines: one (WARN) when it starts, one every `STALL_EVERY` while it lasts and one
//! when it ends (INFO) — whatever the rate it is observed at (the supervisor samples every
//! second).

use std::time::{Duration, Instant};

use crate::Event;

/// How often a lasting stall is logged again.
pub const STALL_EVERY: Duration = Duration::from_secs(10);

/// One group's stall as its lines go.
#[derive(Debug, Default)]
pub struct Stall {
    began: Option<Instant>,
    logged: Option<Instant>,
}

impl Stall {
    /// The stall as observed at `now` (`stalled_for`: how long the group has looked stalled, or
    /// `None`); the event to log, if one is due.
    pub fn observe(&mut self, group: &str, stalled_for: Option<Duration>, now: Instant) -> Option<Event> {
        let group = group.to_owned();
        match (stalled_for, self.began) {
            (Some(d), None) => {
                self.began = Some(now.checked_sub(d).unwrap_or(now));
                self.logged = Some(now);
                Some(Event::Stalled {
                    group,
                    for_s: d.as_secs(),
                })
            }
            (Some(_), Some(began)) if self.logged.is_some_and(|l| now.duration_since(l) >= STALL_EVERY) => {
                self.logged = Some(now);
                Some(Event::StillStalled {
                    group,
                    for_s: now.duration_since(began).as_secs(),
                })
            }
            (None, Some(began)) => {
                self.began = None;
                self.logged = None;
                Some(Event::StallOver {
                    group,
                    lasted_s: now.duration_since(began).as_secs(),
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Level;

    #[test]
    fn a_thirty_second_stall_observed_every_second_logs_five_lines_one_of_them_a_warning() {
        let mut stall = Stall::default();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        // Seen as a stall from its first second, for 30 s, then over.
        for s in 0..=30u64 {
            let at = t0 + Duration::from_secs(s);
            if let Some(e) = stall.observe("main", Some(Duration::from_secs(s)), at) {
                lines.push(e);
            }
        }
        if let Some(e) = stall.observe("main", None, t0 + Duration::from_secs(31)) {
            lines.push(e);
        }
        let shown: Vec<String> = lines.iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 5, "{shown:?}");
        assert_eq!(
            lines.iter().filter(|e| e.level() >= Level::Warn).count(),
            1,
            "{shown:?}"
        );
        assert!(shown[3].contains("after 30 s"), "{shown:?}");
        assert!(shown[4].contains("ended after 31 s"), "{shown:?}");
        assert_eq!(stall.observe("main", None, t0 + Duration::from_secs(40)), None);
    }

    #[test]
    fn a_stall_first_seen_late_counts_from_when_it_began() {
        let mut stall = Stall::default();
        let t0 = Instant::now();
        let first = stall.observe("g", Some(Duration::from_secs(5)), t0).unwrap();
        assert_eq!(
            first,
            Event::Stalled {
                group: "g".into(),
                for_s: 5
            }
        );
        let over = stall.observe("g", None, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(
            over,
            Event::StallOver {
                group: "g".into(),
                lasted_s: 7
            }
        );
    }
}
