//! Which vLLM the groups run: each group's rank-0 `/version`, placed among the releases
//! sparkgate knows, and the one release whose rules (`api::releases`) the gateway applies.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::RwLock;

use sparkgate_config::{UpstreamVersion, VllmRelease};

/// One slot per group, and the applied release kept in one byte: every request reads it.
#[derive(Debug)]
pub(super) struct Releases {
    reported: Vec<RwLock<Option<UpstreamVersion>>>,
    rules: AtomicU8,
}

impl Releases {
    pub(super) fn new(groups: usize) -> Releases {
        Releases {
            reported: (0..groups).map(|_| RwLock::new(None)).collect(),
            rules: AtomicU8::new(index(VllmRelease::OLDEST)),
        }
    }

    /// Records group `index`'s version (`None`: not known now); true when it changed.
    pub(super) fn set(&self, group: usize, version: Option<UpstreamVersion>) -> bool {
        {
            let mut slot = self.reported[group].write().expect("group release");
            if *slot == version {
                return false;
            }
            *slot = version;
        }
        self.rules.store(index(self.applied()), Ordering::Relaxed);
        true
    }

    pub(super) fn of(&self, group: usize) -> Option<UpstreamVersion> {
        self.reported[group].read().expect("group release").clone()
    }

    /// The release whose rules apply: the oldest any group reports, since one request's
    /// group is chosen after its body was prepared (groups of one deployment share an image,
    /// so they differ only while one restarts into another). Before any group has reported,
    /// the oldest known: its repairs are each harmless on a newer release.
    pub(super) fn rules(&self) -> VllmRelease {
        VllmRelease::ALL[usize::from(self.rules.load(Ordering::Relaxed))]
    }

    fn applied(&self) -> VllmRelease {
        self.reported
            .iter()
            .filter_map(|slot| slot.read().expect("group release").as_ref().map(|v| v.rules))
            .min()
            .unwrap_or(VllmRelease::OLDEST)
    }
}

fn index(release: VllmRelease) -> u8 {
    let i = VllmRelease::ALL
        .iter()
        .position(|r| *r == release)
        .expect("a known release");
    u8::try_from(i).expect("fewer than 256 releases")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_reported_release_applies_and_the_oldest_known_before_any_report() {
        let r = Releases::new(2);
        assert_eq!(r.rules(), VllmRelease::OLDEST);
        assert!(r.set(0, Some(UpstreamVersion::place("0.34.0"))));
        assert_eq!(r.rules(), VllmRelease::V0_34);
        assert!(
            !r.set(0, Some(UpstreamVersion::place("0.34.0"))),
            "the same version is no change"
        );
        assert!(r.set(1, Some(UpstreamVersion::place("0.33.0"))));
        assert_eq!(r.rules(), VllmRelease::V0_33);
        assert!(r.set(1, None));
        assert_eq!(r.rules(), VllmRelease::V0_34);
        assert!(r.set(0, Some(UpstreamVersion::place("0.36.1"))));
        assert_eq!(
            (r.rules(), r.of(0).unwrap().reported.as_str()),
            (VllmRelease::V0_34, "0.36.1")
        );
    }
}
