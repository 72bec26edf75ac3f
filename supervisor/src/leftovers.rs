//! RUNTIME=process: the local ranks a gateway runs, written to `LOG_DIR/ranks.json` whenever
//! they change, so the next gateway removes what an earlier one left running — a gateway
//! killed on a host without `setpriv`, or a rank that outlived its parent some other way —
//! before its preflight finds the ports taken, naming each process it removes. A pid counts as
//! the recorded rank only while its start time matches, so a reused pid is never touched.
//! (Remote ranks run under sshd on the worker and end with their SSH session.)

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One recorded rank process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Recorded {
    pub(crate) rank: u32,
    pub(crate) pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot the process started.
    pub(crate) started: u64,
}

/// The state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct State {
    pub(crate) epoch: u64,
    pub(crate) config_hash: String,
    pub(crate) vllm_port: u16,
    pub(crate) ranks: Vec<Recorded>,
}

pub(crate) fn path(log_dir: &Path) -> PathBuf {
    log_dir.join("ranks.json")
}

/// When `pid` started, if it runs (not a zombie).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Records the ranks now running (an empty list removes the file).
pub(crate) fn write(log_dir: &Path, state: &State) {
    let file = path(log_dir);
    if state.ranks.is_empty() {
        let _ = std::fs::remove_file(&file);
        return;
    }
    let _ = std::fs::create_dir_all(log_dir);
    let tmp = file.with_extension("json.tmp");
    let written = serde_json::to_vec_pretty(state)
        .ok()
        .and_then(|bytes| std::fs::write(&tmp, bytes).ok())
        .and_then(|()| std::fs::rename(&tmp, &file).ok());
    if written.is_none() {
        tracing::warn!(file = %file.display(), "cannot record the rank processes");
    }
}

/// Kills (as whole process groups) the recorded ranks that still run, and says which.
pub(crate) fn remove(log_dir: &Path) -> Vec<String> {
    let file = path(log_dir);
    let Some(state) = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice::<State>(&b).ok())
    else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for r in &state.ranks {
        if start_time(r.pid) != Some(r.started) {
            continue;
        }
        crate::rank::kill_group(r.pid);
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            start_time(r.pid).is_none()
        });
        let what = format!(
            "rank {} (pid {}, epoch {}, port {}){}",
            r.rank,
            r.pid,
            state.epoch,
            state.vllm_port,
            if gone { "" } else { " — still running after SIGKILL" }
        );
        sparkgate_events::Event::LeftoverRemoved { what: what.to_string() }.emit();
        removed.push(what);
    }
    let _ = std::fs::remove_file(&file);
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_live_process_is_removed_and_a_reused_pid_is_not() {
        use std::os::unix::process::CommandExt as _;
        let dir = tempfile_dir();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = start_time(pid).unwrap();
        let state = |started| State {
            epoch: 4,
            config_hash: "h".into(),
            vllm_port: 18888,
            ranks: vec![Recorded { rank: 0, pid, started }],
        };
        write(&dir, &state(started + 1));
        assert!(remove(&dir).is_empty(), "another process's pid is left alone");
        assert!(start_time(pid).is_some());
        write(&dir, &state(started));
        let removed = remove(&dir);
        assert_eq!(
            removed,
            vec!["rank 0 (pid {pid}, epoch 4, port 18888)".replace("{pid}", &pid.to_string())]
        );
        let _ = child.wait();
        assert!(!path(&dir).exists(), "the file goes with them");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sparkgate-leftovers-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
