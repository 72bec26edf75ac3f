//! A real PostgreSQL server for a test (Debian's package, never a mock): a fresh cluster in a
//! temporary directory, listening only on a Unix socket there, run as the `postgres` user when
//! the tests run as root (the server refuses root), and stopped with the fixture.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::Proc;

/// One running cluster.
#[derive(Debug)]
pub struct Postgres {
    pub proc: Proc,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

/// The newest installed server's binaries (`/usr/lib/postgresql/N/bin`).
fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server is installed (.ci/run: apt-get install postgresql)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("postgres").exists())
        .collect();
    found.sort();
    found
        .pop()
        .expect("a PostgreSQL server under /usr/lib/postgresql/*/bin")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args…` as the cluster's owner: `postgres` under root, else the caller.
fn as_owner(program: &Path, args: &[&str]) -> (String, Vec<String>) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if !is_root() {
        return (program.display().to_string(), args);
    }
    let mut all: Vec<String> = [
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--pdeathsig=KILL",
    ]
    .map(String::from)
    .to_vec();
    all.push(program.display().to_string());
    all.extend(args);
    ("setpriv".into(), all)
}

fn run(program: &Path, args: &[&str]) {
    let (cmd, args) = as_owner(program, args);
    let out = Command::new(&cmd)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Postgres {
    /// A new cluster, ready for connections.
    pub fn start() -> Postgres {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("tempdir");
        if is_root() {
            // The server's user owns the cluster's directory.
            let ok = Command::new("chown")
                .args(["postgres:postgres", &dir.path().display().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown the cluster's directory to postgres");
        }
        let data = dir.path().join("data");
        let data_s = data.display().to_string();
        run(
            &bin.join("initdb"),
            &[
                "-D",
                &data_s,
                "-U",
                "sparkgate",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let socket = dir.path().display().to_string();
        let (cmd, args) = as_owner(
            &bin.join("postgres"),
            &[
                "-D",
                &data_s,
                "-k",
                &socket,
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=off",
            ],
        );
        let proc = Proc::spawn(&cmd, &args, &[]);
        proc.wait_for_within(
            "database system is ready to accept connections",
            Duration::from_secs(60),
        );
        Postgres { proc, dir, bin }
    }

    /// A new database `name` in the cluster, as a connection URL for its socket.
    pub fn database(&self, name: &str) -> String {
        let socket = self.dir.path().display().to_string();
        run(&self.bin.join("createdb"), &["-h", &socket, "-U", "sparkgate", name]);
        format!("postgresql://sparkgate@localhost/{name}?host={socket}")
    }
}
