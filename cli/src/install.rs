//! `sparkgate install` and `sparkgate uninstall`: the systemd unit that runs `sparkgate serve`
//! on the head node. The unit is a pure function of the configuration (`unit`), so a re-run
//! with changed settings rewrites it and names the lines that changed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use sparkgate_config::Config;

/// Where the unit goes and what is done with it.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Print the unit and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Directory the unit is written to.
    #[arg(long, value_name = "DIR", default_value = "/etc/systemd/system")]
    unit_dir: PathBuf,
    /// Write the unit only: no `systemctl daemon-reload` and `enable`.
    #[arg(long)]
    no_enable: bool,
}

/// The unit's name.
pub(crate) const UNIT: &str = "sparkgate.service";

/// The watchdog period: the supervisor's actor answers its ping between effects, and the
/// longest effect it awaits is a stop that cancels a start (bounded at 120 s) and then stops
/// the ranks; half of this is how long a ping may wait.
const WATCHDOG: Duration = Duration::from_secs(300);

/// What the unit is made of, read from the configuration and the paths it runs with.
#[derive(Debug, Clone, PartialEq)]
struct Inputs {
    exe: PathBuf,
    env_file: PathBuf,
    deploy_dir: PathBuf,
    /// Directories the service writes (logs, the store), under `ProtectSystem=strict`.
    writable: Vec<PathBuf>,
    ready_timeout: Duration,
    drain_timeout: Duration,
    open_files: usize,
}

impl Inputs {
    fn of(config: &Config) -> anyhow::Result<Inputs> {
        let env_file = config.env_file.as_deref().ok_or_else(|| {
            anyhow::anyhow!("install runs `sparkgate serve` with the deployment's env file: run it where ./.env is, or pass --env-file FILE")
        })?;
        let abs = |p: &Path| std::path::absolute(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
        let mut writable = vec![abs(&config.supervision.log_dir)?];
        let store = config.gateway.store_url.expose();
        if !store.starts_with("postgres") {
            let file = Path::new(store.strip_prefix("sqlite:").unwrap_or(store));
            if let Some(dir) = file.parent() {
                writable.push(abs(dir)?);
            }
        }
        writable.dedup();
        let exe = std::env::current_exe()?;
        let env_file = abs(env_file)?;
        let deploy_dir = abs(&config.deploy_dir)?;
        let hidden: Vec<String> = [&exe, &env_file, &deploy_dir]
            .into_iter()
            .chain(&writable)
            .filter(|p| hidden_by_private_tmp(p))
            .map(|p| p.display().to_string())
            .collect();
        anyhow::ensure!(
            hidden.is_empty(),
            "{} under /tmp or /var/tmp, which the service's PrivateTmp= replaces with an empty directory: install the binary elsewhere (/usr/local/bin) and keep the deployment, LOG_DIR and STORE_URL out of them",
            hidden.join(", ")
        );
        Ok(Inputs {
            exe,
            env_file,
            deploy_dir,
            writable,
            ready_timeout: config.supervision.ready_timeout,
            drain_timeout: config.gateway.drain_timeout,
            open_files: config.gateway.max_connections + 4096,
        })
    }
}

/// Whether `path` is under a directory the service's `PrivateTmp=` hides from it.
fn hidden_by_private_tmp(path: &Path) -> bool {
    path.starts_with("/tmp") || path.starts_with("/var/tmp")
}

/// The unit's text.
fn unit(i: &Inputs) -> String {
    // A start takes the weights' load and the ranks' readiness (READY_TIMEOUT) and the node
    // preparation before it; a stop takes the drain, the streams' 2 s grace and the ranks' stop.
    let start_s = i.ready_timeout.as_secs() + 600;
    let stop_s = i.drain_timeout.as_secs() + 2 + 180;
    let writable: Vec<String> = i.writable.iter().map(|p| format!("-{}", p.display())).collect();
    format!(
        "# Written by `sparkgate install`; `sparkgate uninstall` removes it. Edit the env file,
# not this unit: a re-run of `sparkgate install` rewrites it.
[Unit]
Description=sparkgate: OpenAI and Anthropic gateway and vLLM rank supervisor
After=network-online.target docker.service
Wants=network-online.target docker.service
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
Type=notify
NotifyAccess=main
WorkingDirectory={deploy}
ExecStart={exe} --env-file {env} serve
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=10
TimeoutStartSec={start_s}
TimeoutStopSec={stop_s}
WatchdogSec={watchdog}
KillMode=mixed
LimitNOFILE={files}
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={writable}
PrivateTmp=yes
ProtectControlGroups=yes
ProtectKernelModules=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
",
        deploy = i.deploy_dir.display(),
        exe = i.exe.display(),
        env = i.env_file.display(),
        watchdog = WATCHDOG.as_secs(),
        files = i.open_files,
        writable = writable.join(" "),
    )
}

/// The lines that differ between the unit installed and the new one, as `-old` / `+new`.
fn changes(old: &str, new: &str) -> Vec<String> {
    let gone = old
        .lines()
        .filter(|l| !new.lines().any(|n| n == *l))
        .map(|l| format!("-{l}"));
    let came = new
        .lines()
        .filter(|l| !old.lines().any(|o| o == *l))
        .map(|l| format!("+{l}"));
    gone.chain(came).collect()
}

fn systemctl(args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new("systemctl")
        .args(args)
        .status()
        .map_err(|e| anyhow::anyhow!("systemctl {}: {e}", args.join(" ")))?;
    anyhow::ensure!(status.success(), "systemctl {} failed ({status})", args.join(" "));
    Ok(())
}

pub(super) fn install(config: &Config, args: &InstallArgs) -> anyhow::Result<ExitCode> {
    let inputs = Inputs::of(config)?;
    let text = unit(&inputs);
    if args.dry_run {
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let path = args.unit_dir.join(UNIT);
    let before = std::fs::read_to_string(&path).ok();
    for dir in &inputs.writable {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    }
    match &before {
        Some(old) if *old == text => println!("{} is up to date", path.display()),
        Some(old) => {
            std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            println!("{} updated:", path.display());
            for line in changes(old, &text) {
                println!("  {line}");
            }
        }
        None => {
            std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            println!("{} written", path.display());
        }
    }
    if !args.no_enable {
        systemctl(&["daemon-reload"])?;
        systemctl(&["enable", UNIT])?;
        println!(
            "enabled; start it with `systemctl start sparkgate` (a changed unit takes effect at its next restart)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Stops and disables the service (its shutdown stops or leaves the ranks as STOP_RANKS_ON_EXIT
/// says), then removes the unit.
pub(super) fn uninstall(args: &InstallArgs) -> anyhow::Result<ExitCode> {
    let path = args.unit_dir.join(UNIT);
    if !path.exists() {
        println!("{} is not installed", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    if args.dry_run {
        println!("would stop and disable {UNIT} and remove {}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    if !args.no_enable {
        systemctl(&["disable", "--now", UNIT])?;
    }
    std::fs::remove_file(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if !args.no_enable {
        systemctl(&["daemon-reload"])?;
    }
    println!("{} removed", path.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Inputs {
        Inputs {
            exe: "/usr/local/bin/sparkgate".into(),
            env_file: "/srv/spark/.env".into(),
            deploy_dir: "/srv/spark".into(),
            writable: vec!["/srv/spark/logs".into(), "/srv/spark/state".into()],
            ready_timeout: Duration::from_secs(1800),
            drain_timeout: Duration::from_secs(60),
            open_files: 14_096,
        }
    }

    #[test]
    fn the_unit_follows_the_configuration() {
        let text = unit(&inputs());
        for line in [
            "Type=notify",
            "NotifyAccess=main",
            "ExecStart=/usr/local/bin/sparkgate --env-file /srv/spark/.env serve",
            "ExecReload=/bin/kill -HUP $MAINPID",
            "TimeoutStartSec=2400",
            "TimeoutStopSec=242",
            "WatchdogSec=300",
            "KillMode=mixed",
            "ReadWritePaths=-/srv/spark/logs -/srv/spark/state",
            "After=network-online.target docker.service",
            "LimitNOFILE=14096",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn paths_that_private_tmp_hides_are_told_apart() {
        assert!(hidden_by_private_tmp(Path::new("/tmp/ci/target/debug/sparkgate")));
        assert!(hidden_by_private_tmp(Path::new("/var/tmp/sg/.env")));
        assert!(!hidden_by_private_tmp(Path::new("/usr/local/bin/sparkgate")));
        assert!(
            !hidden_by_private_tmp(Path::new("/tmpfs/x")),
            "a component, not a prefix"
        );
    }

    #[test]
    fn a_rerun_names_what_changed() {
        let old = unit(&inputs());
        let mut longer = inputs();
        longer.drain_timeout = Duration::from_secs(300);
        let new = unit(&longer);
        assert_eq!(changes(&old, &new), vec!["-TimeoutStopSec=242", "+TimeoutStopSec=482"]);
        assert!(changes(&new, &new).is_empty());
    }
}
