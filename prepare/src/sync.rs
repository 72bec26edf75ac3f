//! WEIGHT_SYNC=rsync: each weight tree copied to the worker with `rsync -a --partial` over SSH,
//! and a marker file on the worker recording what was copied — DeepSeek: `name:size:mtime` of
//! every file, GLM: the revision — so an unchanged tree is skipped after one SSH round trip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sparkgate_config::{Config, KnownHosts, Weights, Worker};

use crate::PrepareError;

/// One tree to mirror onto the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPlan {
    pub name: &'static str,
    pub src: PathBuf,
    /// Absolute path on the worker.
    pub dest: String,
    pub marker_file: &'static str,
    /// What the marker must say for the worker's copy to count as current.
    pub marker: String,
}

/// What [`sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// The worker's marker matched: nothing copied.
    Unchanged,
    Copied,
}

/// The trees the profile mirrors onto `worker`, with their markers computed from the head's copy.
pub fn plans(config: &Config, worker: &Worker) -> Vec<SyncPlan> {
    match &config.storage.weights {
        Weights::DeepSeek {
            model_host,
            engram_dir,
            worker_model_dir,
            worker_engram_dir,
            ..
        } => vec![
            SyncPlan {
                name: "model",
                marker: file_list_marker(Path::new(model_host)),
                src: model_host.into(),
                dest: worker.path(worker_model_dir),
                marker_file: ".dsv41-exl3-synced",
            },
            SyncPlan {
                name: "engram",
                marker: file_list_marker(Path::new(engram_dir)),
                src: engram_dir.into(),
                dest: worker.path(worker_engram_dir),
                marker_file: ".dsv41-engram-synced",
            },
        ],
        Weights::Glm {
            hf_home,
            worker_hf_home,
            revision,
            cache_name,
            ..
        } => vec![SyncPlan {
            name: "model",
            src: Path::new(hf_home).join("hub").join(cache_name),
            dest: format!("{}/hub/{cache_name}", worker.path(worker_hf_home)),
            marker_file: ".glm53-exl3-synced",
            marker: revision.clone(),
        }],
    }
}

/// `name:size:mtime|…` of the tree's files (sorted; dot files such as markers left out).
fn file_list_marker(dir: &Path) -> String {
    let mut entries: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata().ok().filter(|m| m.is_file() && !name.starts_with('.'))?;
            let mtime = meta
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs();
            Some(format!("{name}:{}:{mtime}", meta.len()))
        })
        .collect();
    entries.sort();
    entries.join("|")
}

/// `ssh` with the worker's port and the configured key, host-key policy and timeout,
/// non-interactive.
pub fn ssh_argv(config: &Config, worker: &Worker) -> Vec<String> {
    let s = &config.nodes.ssh;
    let mut a: Vec<String> = vec!["ssh".into(), "-p".into(), worker.ssh_port.to_string()];
    if let Some(k) = &s.keyfile {
        a.extend(["-i".into(), k.display().to_string()]);
    }
    let check = match s.known_hosts {
        KnownHosts::Strict => "yes",
        KnownHosts::Accept => "no",
        KnownHosts::AcceptNew => "accept-new",
    };
    a.extend([
        "-o".into(),
        "BatchMode=yes".into(),
        "-o".into(),
        format!("ConnectTimeout={}", s.connect_timeout.as_secs().max(1)),
        "-o".into(),
        format!("StrictHostKeyChecking={check}"),
        // A worker that vanishes without a reset is noticed in about a minute, not hours.
        "-o".into(),
        "ServerAliveInterval=15".into(),
        "-o".into(),
        "ServerAliveCountMax=4".into(),
    ]);
    if let Some(f) = &s.known_hosts_file {
        a.extend(["-o".into(), format!("UserKnownHostsFile={}", f.display())]);
    }
    a
}

/// A word for a POSIX shell, single-quoted.
pub(crate) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn remote(config: &Config, worker: &Worker, script: &str) -> Result<String, PrepareError> {
    let argv = ssh_argv(config, worker);
    let target = &worker.ssh;
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .arg(target)
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| PrepareError::Spawn {
            command: format!("ssh {target}"),
            source,
        })?;
    if !out.status.success() {
        return Err(PrepareError::Remote {
            target: target.clone(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

const NOT_WRITABLE: &str = "SPARKGATE_NOT_WRITABLE";

/// Mirrors one tree unless the worker's marker says it is current (`force` copies anyway).
/// The destination must be writable by the SSH user; otherwise the error carries the fix.
pub fn sync(config: &Config, worker: &Worker, plan: &SyncPlan, force: bool) -> Result<Synced, PrepareError> {
    let dest = quote(&plan.dest);
    let marker_path = quote(&format!("{}/{}", plan.dest, plan.marker_file));
    let probe = format!(
        "mkdir -p {dest} 2>/dev/null; if [ ! -w {dest} ]; then echo {NOT_WRITABLE}; exit 0; fi; cat {marker_path} 2>/dev/null || true"
    );
    let seen = remote(config, worker, &probe)?;
    if seen.trim() == NOT_WRITABLE {
        return Err(PrepareError::NotWritable {
            target: worker.ssh.clone(),
            fix: format!("sudo mkdir -p {dest} && sudo chown -R {} {dest}", worker.user),
            dest: plan.dest.clone(),
        });
    }
    if !force && seen == plan.marker {
        return Ok(Synced::Unchanged);
    }
    let argv = [
        "-a".to_owned(),
        "--partial".to_owned(),
        "--info=progress2".to_owned(),
        "--timeout=120".to_owned(),
        "-e".to_owned(),
        ssh_argv(config, worker).join(" "),
        format!("{}/", plan.src.display()),
        format!("{}:{}/", worker.ssh, plan.dest),
    ];
    let rsync = format!("rsync {}", argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "));
    crate::run_to_success(Command::new("rsync").args(&argv), &rsync)?;
    remote(
        config,
        worker,
        &format!("printf %s {} > {marker_path}", quote(&plan.marker)),
    )?;
    Ok(Synced::Copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_list_name_size_and_mtime_and_ignore_dot_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.safetensors"), b"xx").unwrap();
        std::fs::write(dir.path().join("a.json"), b"x").unwrap();
        std::fs::write(dir.path().join(".dsv41-exl3-synced"), b"old").unwrap();
        let m = file_list_marker(dir.path());
        let parts: Vec<&str> = m.split('|').collect();
        assert_eq!(parts.len(), 2, "{m}");
        assert!(
            parts[0].starts_with("a.json:1:") && parts[1].starts_with("b.safetensors:2:"),
            "{m}"
        );
    }

    #[test]
    fn shell_quoting_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
