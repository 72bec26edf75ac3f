//! `sparkgate sync` (WEIGHT_SYNC=rsync) to a worker reached through a real sshd on 127.0.0.2:
//! a multi-GiB tree is copied once, skipped by its marker afterwards, copied again when a shard
//! changes, and an unwritable destination fails with the fix.

use std::io::{Seek, SeekFrom, Write};
use std::process::Command;

mod common;
use common::SIM;
use sparkgate_tests::hosts::Sshd;
use sparkgate_tests::test_gateway::sparkgate_bin;

const SHARD_BYTES: u64 = 512 << 20;
const SHARDS: usize = 4;

struct Topology {
    sshd: Sshd,
    dir: tempfile::TempDir,
}

impl Topology {
    fn new() -> Topology {
        let dir = tempfile::tempdir().expect("temp dir");
        let model = dir.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), b"{}").unwrap();
        for i in 1..=SHARDS {
            // Sparse on the head: quick to make, still 512 MiB each for rsync to read and send.
            let f = std::fs::File::create(model.join(format!("model-{i:05}-of-{SHARDS:05}.safetensors"))).unwrap();
            f.set_len(SHARD_BYTES).unwrap();
        }
        let engram = dir.path().join("engram");
        std::fs::create_dir_all(&engram).unwrap();
        for f in sparkgate_prepare_files() {
            std::fs::write(engram.join(f), b"engram").unwrap();
        }
        Topology {
            sshd: Sshd::start(),
            dir,
        }
    }

    fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }

    fn sync(&self, env: &[(&str, &str)]) -> (i32, String, f64) {
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let started = std::time::Instant::now();
        let out = Command::new(sparkgate_bin(SIM))
            .args(["--profile", "deepseek-v4.1-flash", "sync"])
            .env("DEPLOY_DIR", self.dir.path())
            .env("HEAD_IP", "127.0.0.1")
            .env("WORKER_IP", "127.0.0.2")
            .env("WORKER_USER", &user)
            .env("WORKER_SSH_PORT", self.sshd.port.to_string())
            .env("WORKER_SSH_KEY", self.sshd.key())
            .env("SSH_KNOWN_HOSTS_FILE", self.sshd.dir.path().join("known_hosts"))
            .env("WEIGHT_SYNC", "rsync")
            .env("MODEL_HOST", self.path("model"))
            .env("ENGRAM_DIR", self.path("engram"))
            .env("WORKER_MODEL_DIR", self.path("worker/model"))
            .env("WORKER_ENGRAM_DIR", self.path("worker/engram"))
            .envs(env.iter().copied())
            .output()
            .expect("run sparkgate sync");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
            started.elapsed().as_secs_f64(),
        )
    }
}

fn sparkgate_prepare_files() -> [&'static str; 4] {
    [
        "model-00047-of-00048.safetensors",
        "model-00048-of-00048.safetensors",
        "model.safetensors.index.json",
        "config.json",
    ]
}

#[test]
fn rsync_copies_once_skips_by_marker_and_copies_a_changed_shard() {
    let t = Topology::new();
    let (code, out, first_s) = t.sync(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("sync model: copied") && out.contains("sync engram: copied"),
        "{out}"
    );
    let shard = |root: &str| {
        t.dir
            .path()
            .join(root)
            .join(format!("model-00002-of-{SHARDS:05}.safetensors"))
    };
    assert_eq!(std::fs::metadata(shard("worker/model")).unwrap().len(), SHARD_BYTES);
    let marker = std::fs::read_to_string(t.dir.path().join("worker/model/.dsv41-exl3-synced")).unwrap();
    assert!(
        marker.contains(&format!("model-00002-of-{SHARDS:05}.safetensors:{SHARD_BYTES}:")),
        "{marker}"
    );

    let (code, out, second_s) = t.sync(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("sync model: unchanged (marker .dsv41-exl3-synced matches)"),
        "{out}"
    );
    assert!(out.contains("sync engram: unchanged"), "{out}");
    eprintln!("first sync {first_s:.1} s (2 GiB), unchanged sync {second_s:.2} s");

    // A changed shard (same size, new bytes, new mtime) is copied again; the Engram tree is not.
    let mut f = std::fs::OpenOptions::new().write(true).open(shard("model")).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(b"changed").unwrap();
    // The marker has whole seconds: make the new mtime differ for sure instead of waiting.
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(10))
        .unwrap();
    drop(f);
    let (code, out, _) = t.sync(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("sync model: copied") && out.contains("sync engram: unchanged"),
        "{out}"
    );
    let copied = std::fs::read(shard("worker/model")).unwrap();
    assert_eq!(&copied[4096..4103], b"changed");

    // --force copies even with a matching marker.
    let (code, out, _) = t.sync(&[("FORCE_SYNC", "1")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("sync engram: copied"), "{out}");
}

#[test]
fn an_unwritable_destination_fails_with_the_fix() {
    let t = Topology::new();
    let (code, out, _) = t.sync(&[("WORKER_MODEL_DIR", "/proc/sparkgate-weights")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("/proc/sparkgate-weights is not writable over SSH"),
        "{out}"
    );
    assert!(
        out.contains("sudo mkdir -p '/proc/sparkgate-weights' && sudo chown -R"),
        "{out}"
    );
}
