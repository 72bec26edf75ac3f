//! Whether stderr is systemd's journal (JOURNAL_STREAM names stderr's device and inode), so
//! each log line carries its level as a syslog priority prefix that journald reads and strips:
//! `journalctl -u sparkgate -p warning` then shows the warnings and errors — the unplanned
//! events — and nothing else. Prefixes rather than the journal's native protocol (one datagram
//! per event, tracing-journald): the lines keep going through the log writer's buffer on its
//! own thread, so neither a request nor a slow journald waits for the other; the events' fields
//! stay in the line as `key=value` (`journalctl -u sparkgate -g event=rank_exited`).

use std::os::unix::fs::MetadataExt as _;

use super::logwriter::Priorities;

/// `Syslog` when stderr is the stream JOURNAL_STREAM (`device:inode`) names.
pub(crate) fn priorities() -> Priorities {
    let Some(named) = std::env::var("JOURNAL_STREAM").ok() else {
        return Priorities::None;
    };
    let stderr = std::fs::metadata("/proc/self/fd/2").ok().map(|m| (m.dev(), m.ino()));
    match (parse(&named), stderr) {
        (Some(journal), Some(ours)) if journal == ours => Priorities::Syslog,
        _ => Priorities::None,
    }
}

/// `device:inode`, both decimal.
fn parse(value: &str) -> Option<(u64, u64)> {
    let (dev, ino) = value.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert_eq!(parse("8:1234"), Some((8, 1234)));
        assert_eq!(parse("8-1234"), None);
        assert_eq!(parse(":"), None);
    }
}
