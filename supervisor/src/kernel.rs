//! The kernel log lines the wedge watch follows on each node (issue #35): NVIDIA's Xid reports
//! (`NVRM: Xid (PCI:0000:01:00): 79, pid=…, GPU has fallen off the bus.`) and the OOM killer's
//! (`Out of memory: Killed process 1234 (python3) …`, `oom-kill:…`). Each becomes an event in
//! the status; a fatal Xid (the GPU is gone) ends the group with the line as the reason.

use serde::{Deserialize, Serialize};

/// Xids after which the GPU cannot go on serving: fallen off the bus (79), double-bit ECC (48),
/// uncorrectable/contained memory errors (94, 95), NVLink (74), GSP timeouts (119, 120), a
/// channel or context that will not recover (109, 145, 154).
const FATAL_XIDS: [u32; 10] = [48, 74, 79, 94, 95, 109, 119, 120, 145, 154];

/// A kernel log line the watch reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelEvent {
    pub node: String,
    pub kind: KernelKind,
    pub line: String,
    pub at_unix: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelKind {
    /// An NVIDIA Xid, with its number.
    Xid { xid: u32, fatal: bool },
    /// The kernel's OOM killer.
    OutOfMemory,
}

impl KernelKind {
    /// The group cannot go on after it. (An OOM kill of a rank ends the group by the rank's
    /// exit; of another process, it need not.)
    pub(crate) fn ends_the_group(self) -> bool {
        matches!(self, KernelKind::Xid { fatal: true, .. })
    }
}

/// What a log line is, when the watch reports it.
pub(crate) fn classify(line: &str) -> Option<KernelKind> {
    if let Some(rest) = line.split("NVRM: Xid").nth(1) {
        // `(PCI:0000:01:00): 79, pid=…`: the number after the address.
        let xid = rest
            .split_once("):")
            .and_then(|(_, after)| after.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())?;
        return Some(KernelKind::Xid {
            xid,
            fatal: FATAL_XIDS.contains(&xid),
        });
    }
    (line.contains("Out of memory: Killed process") || line.contains("oom-kill:")).then_some(KernelKind::OutOfMemory)
}

/// The lines of `tail` after the last one seen before (all of them when it is not there any
/// more: the ring buffer moved on); `None` seen: the first read, history only.
pub(crate) fn new_lines<'a>(tail: &'a str, seen: Option<&str>) -> Vec<&'a str> {
    let lines: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some(seen) = seen else {
        return Vec::new();
    };
    match lines.iter().rposition(|l| *l == seen) {
        Some(at) => lines[at + 1..].to_vec(),
        None => lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_and_the_oom_killer_are_told_apart_and_fatal_ones_end_the_group() {
        let fallen = "[ 812.004] NVRM: Xid (PCI:0000:01:00): 79, pid=2211, name=python3, GPU has fallen off the bus.";
        assert_eq!(classify(fallen), Some(KernelKind::Xid { xid: 79, fatal: true }));
        let app = "NVRM: Xid (PCI:000f:01:00): 13, pid=4415, name=python3, Graphics SM Warp Exception";
        assert_eq!(classify(app), Some(KernelKind::Xid { xid: 13, fatal: false }));
        assert!(!classify(app).unwrap().ends_the_group());
        let oom = "Out of memory: Killed process 4415 (python3) total-vm:912341kB, anon-rss:80123kB";
        assert_eq!(classify(oom), Some(KernelKind::OutOfMemory));
        assert_eq!(classify("usb 1-1: new high-speed USB device"), None);
    }

    #[test]
    fn only_the_lines_after_the_last_seen_one_are_new() {
        let tail = "a\nb\nc\n";
        assert!(new_lines(tail, None).is_empty(), "the first read is history");
        assert_eq!(new_lines(tail, Some("b")), ["c"]);
        assert_eq!(new_lines(tail, Some("c")), Vec::<&str>::new());
        assert_eq!(new_lines(tail, Some("gone")), ["a", "b", "c"]);
    }
}
