//! `sparkgate serve` and `sparkgate demo`: the gateway, with the supervisor (RUNTIME) or in
//! gateway-only mode, until SIGTERM or Ctrl-C.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use sparkgate_config::{Config, GroupConfig, LoadOptions, Source};
use sparkgate_supervisor::SupervisorHandle;

use sparkgate_gateway::{GatewayControl, Upstreams};

/// True when UPSTREAM_URL was given (flag, environment or env file): front it, supervise nothing.
fn gateway_only(config: &Config) -> bool {
    config
        .settings()
        .iter()
        .any(|s| s.name == "UPSTREAM_URL" && !matches!(s.source, Source::Profile { .. }))
}

/// What runs: the real thing, or the demo (whose log directory may be removed at exit).
#[derive(Debug)]
pub(super) enum Mode {
    Serve,
    Demo(Logs),
}

/// The demo's temporary log directory: removed when the demo exits, or kept.
#[derive(Debug)]
pub(super) enum Logs {
    RemoveOnExit(PathBuf),
    Keep,
}

pub(super) fn serve(config: &Config, groups: Vec<GroupConfig>, run: Mode) -> anyhow::Result<ExitCode> {
    let _log = sparkgate_gateway::init_logging(config.gateway.log_format);
    // One thread (the default) is tokio's current-thread scheduler: the accept loop, the
    // connections and the supervisor share the thread that runs them, with no hand-off to a
    // worker and no cross-thread wake-up per request (a multi-threaded runtime with one worker
    // runs `block_on` on a thread of its own beside it).
    let mut builder = match config.gateway.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    let runtime = builder.enable_all().build()?;
    runtime.block_on(run_gateway(config, groups, run))
}

/// Listens, starts a supervisor per group (none in gateway-only mode), serves until a signal,
/// then lets each supervisor stop its ranks (or leave its containers).
async fn run_gateway(config: &Config, groups: Vec<GroupConfig>, run: Mode) -> anyhow::Result<ExitCode> {
    let addr = std::net::SocketAddr::new(config.gateway.bind, config.ports.public);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e} (is PORT {} in use?)", config.ports.public))?;
    let local = sparkgate_gateway::local_addr(&listener)?;
    let mode = config.speculation.active_mode();
    let limits = sparkgate_gateway::QueueLimits {
        depth: config.gateway.queue_depth,
        bytes: config.gateway.queue_max_bytes,
        timeout: config.gateway.queue_timeout,
    };
    let control = GatewayControl::new(limits);
    let supervised = if gateway_only(config) {
        Vec::new()
    } else {
        supervise(groups, !config.gateway.models.is_empty()).await?
    };
    tracing::info!(
        profile = %config.profile,
        model = %config.serving.served_model_name,
        upstream = %config.gateway.upstream,
        supervised = !supervised.is_empty(),
        groups = supervised.len().max(1),
        max_num_seqs = mode.max_num_seqs,
        "sparkgate listening on {}://{local}",
        if config.gateway.tls.is_some() { "https" } else { "http" }
    );
    if let Mode::Demo(logs) = &run {
        demo_banner(config, logs, local);
    }
    let handles: Vec<SupervisorHandle> = supervised.iter().map(|(_, h)| h.clone()).collect();
    let upstreams = match supervised.is_empty() {
        true => Upstreams::Probe,
        false => Upstreams::Supervised(supervised),
    };
    sparkgate_gateway::serve(config, listener, control, upstreams, shutdown_signal()).await?;
    // Each supervisor decides: process ranks stop with the gateway (they cannot be
    // adopted); containers stay for the next gateway unless STOP_RANKS_ON_EXIT=1.
    futures_util::future::join_all(handles.iter().map(|h| h.shutdown())).await;
    tracing::info!("sparkgate stopped");
    if let Mode::Demo(Logs::RemoveOnExit(dir)) = &run {
        // Only the directory the demo made: a LOG_DIR the operator set is theirs.
        if *dir == config.supervision.log_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One supervisor per group, each with its own preflight; a group that cannot start stops the
/// whole start here, before any port is served. With MODELS the groups are the models: the
/// others first, each clearing what an earlier gateway left of it, then the default, adopted if
/// it runs, else loaded by the gateway once it has read the nodes' memory.
async fn supervise(groups: Vec<GroupConfig>, models: bool) -> anyhow::Result<Vec<(GroupConfig, SupervisorHandle)>> {
    use sparkgate_supervisor::Begin;
    let mut supervised = Vec::new();
    let mut order: Vec<(usize, GroupConfig)> = groups.into_iter().enumerate().collect();
    if models {
        order.rotate_left(1);
    }
    for (i, g) in order {
        let begin = match (models, i) {
            (false, _) => Begin::Start,
            (true, 0) => Begin::Adopt,
            (true, _) => Begin::Standby,
        };
        let what = if models { "model" } else { "group" };
        let handle = SupervisorHandle::spawn_as(&g.config, &g.name, begin)
            .await
            .map_err(|e| anyhow::anyhow!("{what} {}: {e}", g.name))?;
        if begin == Begin::Standby {
            handle.begun().await;
        }
        supervised.push((i, g, handle));
    }
    supervised.sort_by_key(|(i, _, _)| *i);
    Ok(supervised.into_iter().map(|(_, g, h)| (g, h)).collect())
}

/// What the demo says on start: where it serves, where its logs go, a request to try.
fn demo_banner(config: &Config, logs: &Logs, local: std::net::SocketAddr) {
    // A LOG_DIR the user set is theirs: only the demo's own temporary one is removed.
    let kept = match logs {
        Logs::RemoveOnExit(temp) if *temp == config.supervision.log_dir => " (removed on exit; --keep-logs keeps it)",
        Logs::RemoveOnExit(_) | Logs::Keep => "",
    };
    eprintln!(
        "\nsparkgate demo: {} with two simulated ranks (vllm-sim) on http://{local}/v1\n  logs: {}{kept}\n  try:  curl -s http://{local}/v1/chat/completions -H 'Content-Type: application/json' \\\n          -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"What is 17*19? Reply with the integer only.\"}}],\"max_tokens\":32,\"chat_template_kwargs\":{{\"enable_thinking\":false}}}}'\n  stop: Ctrl-C\n",
        config.profile,
        config.supervision.log_dir.display(),
        config.serving.served_model_name
    );
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown requested");
}

/// How the demo finds its simulator: built on first use when the demo runs; only named when
/// `config --demo` or `plan --demo` show what it would run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Simulator {
    BuildIfMissing,
    NameOnly,
}

/// `n` free loopback ports, held until all are chosen so they differ.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    Ok(held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?)
}

/// `demo --groups N`: a GROUPS_FILE in the demo's log directory with N sections, each group's
/// vLLM and rendezvous ports its own.
fn demo_groups(log_dir: &std::path::Path, groups: u8) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(log_dir)?;
    let ports = free_ports(2 * usize::from(groups))?;
    let mut text = String::from("# sparkgate demo: simulated rank groups behind one gateway\n");
    for (i, pair) in ports.chunks(2).enumerate() {
        text.push_str(&format!(
            "[g{}]\nVLLM_PORT={}\nMASTER_PORT={}\n",
            i + 1,
            pair[0],
            pair[1]
        ));
    }
    let path = log_dir.join("groups.env");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The demo's settings, as the layer just above the profile defaults (a flag, the environment
/// or the env file wins): loopback addresses only, vLLM's and the rendezvous port picked free
/// (so two demos never clash), ranks as vllm-sim processes at real speed, logs in a temporary
/// directory.
pub(super) fn demo_defaults(
    options: &mut LoadOptions,
    sim: Simulator,
    keep_logs: bool,
    groups: u8,
) -> anyhow::Result<Logs> {
    let sim = match sim {
        Simulator::BuildIfMissing => locate_simulator()?,
        Simulator::NameOnly => std::env::current_exe()?.with_file_name("vllm-sim"),
    };
    let log_dir = std::env::temp_dir().join(format!("sparkgate-demo-{}", std::process::id()));
    let ports = free_ports(2)?;
    let (vllm_port, master_port) = (ports[0], ports[1]);
    if groups > 1 {
        let file = demo_groups(&log_dir, groups)?;
        options
            .demo
            .insert("GROUPS_FILE".to_owned(), file.display().to_string());
    }
    let defaults = [
        ("HEAD_IP", "127.0.0.1".to_owned()),
        ("WORKER_IP", "127.0.0.1".to_owned()),
        ("BIND_ADDR", "127.0.0.1".to_owned()),
        ("VLLM_PORT", vllm_port.to_string()),
        ("MASTER_PORT", master_port.to_string()),
        ("RUNTIME", "process".to_owned()),
        ("VLLM_BIN", sim.display().to_string()),
        ("LOG_DIR", log_dir.display().to_string()),
        // The demo's stored Responses live and go with its temporary directory.
        (
            "STORE_URL",
            log_dir.join("state/responses.sqlite").display().to_string(),
        ),
        ("READY_TIMEOUT", "120".to_owned()),
        ("RESTART_BACKOFF_INITIAL", "1".to_owned()),
        // Simulated ranks load no weights.
        ("WEIGHTS_GIB_PER_RANK", String::new()),
    ];
    for (k, v) in defaults {
        options.demo.insert(k.to_owned(), v);
    }
    // Ranks get only the plan's environment: the simulated ranks' settings (SIM_* from the
    // environment, else paced like the reference tables after a 2 s load) go through RANK_ENV —
    // appended to the environment's own RANK_ENV when it has one.
    let env = &options.process_env;
    let mut sim: BTreeMap<String, String> = [("SIM_SPEED", "1"), ("SIM_LOAD_SECONDS", "2")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
    sim.extend(
        env.iter()
            .filter(|(k, _)| k.starts_with("SIM_"))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let given = env.get("RANK_ENV").filter(|v| !v.is_empty()).cloned();
    let mut pairs: Vec<String> = given.iter().cloned().collect();
    pairs.extend(sim.iter().map(|(k, v)| format!("{k}={v}")));
    let layer = match given {
        Some(_) => &mut options.process_env,
        None => &mut options.demo,
    };
    layer.insert("RANK_ENV".to_owned(), pairs.join(","));
    Ok(if keep_logs {
        Logs::Keep
    } else {
        Logs::RemoveOnExit(log_dir)
    })
}

/// `vllm-sim` next to this executable, built with cargo from the source tree when missing.
fn locate_simulator() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let sim = exe.with_file_name("vllm-sim");
    if sim.exists() {
        return Ok(sim);
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    anyhow::ensure!(
        workspace.join("Cargo.toml").exists(),
        "vllm-sim is not next to {} and the source tree is gone; build it with `cargo build -p sparkgate-tests --bin vllm-sim`",
        exe.display()
    );
    eprintln!("sparkgate demo: building the simulator (vllm-sim) once…");
    let release = exe.components().any(|c| c.as_os_str() == "release");
    let mut cmd = std::process::Command::new("cargo");
    cmd.current_dir(&workspace)
        .args(["build", "-p", "sparkgate-tests", "--bin", "vllm-sim"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run cargo to build vllm-sim: {e}"))?;
    anyhow::ensure!(status.success(), "building vllm-sim failed ({status})");
    anyhow::ensure!(sim.exists(), "vllm-sim was built but is not at {}", sim.display());
    Ok(sim)
}
