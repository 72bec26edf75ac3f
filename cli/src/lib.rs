//! The `sparkgate` command line: parsing, configuration loading, and the subcommands that need
//! no running gateway (`config`, `plan`). `serve`/`demo` live in `serve.rs`, `bench` in
//! `bench.rs`, `smoke` in `smoke.rs`, `download` in `prepare.rs`, and the operator commands that
//! talk to a running gateway in `admin.rs`.

mod admin;
mod bench;
mod bench_request;
mod diagnostics;
mod doctor;
mod https;
mod install;
mod models;
mod prepare;
mod quarantine;
mod serve;
mod smoke;
mod top;
mod usage;
mod wait;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use sparkgate_config::{Config, LoadOptions};

/// sparkgate — OpenAI gateway and supervisor for vLLM across two DGX Spark machines.
#[derive(Debug, Parser)]
#[command(name = "sparkgate", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where configuration comes from (precedence: these flags > environment > env file > profile).
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Launcher-style env file [default: ./.env when it exists].
    #[arg(long, global = true, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// Deployment profile: deepseek-v4.1-flash or glm-5.3-flash [default: PROFILE, else deepseek-v4.1-flash].
    #[arg(long, global = true, value_name = "PROFILE")]
    pub profile: Option<String>,
    /// PEM certificate(s) to trust for a gateway served over HTTPS (TLS_CERT) [default: the
    /// system's roots].
    #[arg(long, global = true, value_name = "FILE", env = "SPARKGATE_CACERT")]
    pub cacert: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the effective configuration with the source of every value (secrets redacted).
    Config {
        /// Print JSON instead of NAME=value lines.
        #[arg(long)]
        json: bool,
        /// Print the Markdown configuration reference (every variable, both profiles' defaults).
        #[arg(long, conflicts_with = "json")]
        reference: bool,
        /// Show what `sparkgate demo` runs (its defaults under yours).
        #[arg(long)]
        demo: bool,
    },
    /// Serve the OpenAI gateway on PORT and supervise the ranks (RUNTIME); with --upstream (or
    /// UPSTREAM_URL) it only fronts an already running vLLM and supervises nothing.
    Serve {
        /// vLLM rank 0's base URL (overrides UPSTREAM_URL), e.g. http://127.0.0.1:8000.
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// Port to listen on (overrides PORT); 0 picks a free one and logs it.
        #[arg(long)]
        port: Option<u16>,
        /// Address to listen on (overrides BIND_ADDR).
        #[arg(long, value_name = "ADDR")]
        bind: Option<String>,
    },
    /// The whole system on this machine without a GPU: the gateway on PORT (8888) supervising two
    /// simulated ranks (vllm-sim processes on loopback, their ports picked free). Builds the
    /// simulator if needed.
    Demo {
        /// Port to listen on (overrides PORT); 0 picks a free one and logs it.
        #[arg(long)]
        port: Option<u16>,
        /// Keep the temporary log directory when the demo exits (a LOG_DIR you set is always kept).
        #[arg(long)]
        keep_logs: bool,
        /// Simulated rank groups behind the one gateway (a GROUPS_FILE of N sections).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
        groups: u8,
    },
    /// Show the running gateway's state: ranks, epoch, mode, admission.
    Status {
        #[command(flatten)]
        target: admin::Target,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show what each API key used (requests, tokens, errors, quota refusals, queue waits).
    Usage {
        #[command(flatten)]
        target: admin::Target,
        /// hour (the last 60 minutes), today (since UTC midnight) or all.
        #[arg(long, default_value = "today", value_parser = ["hour", "today", "all"])]
        window: String,
        /// One key's name.
        #[arg(long)]
        key: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// The request bodies refused as poisonous (they crashed the engine); `release ID` lets one
    /// run again.
    Quarantine {
        #[command(flatten)]
        target: admin::Target,
        #[command(subcommand)]
        action: Option<quarantine::Action>,
    },
    /// Drain, then restart the rank group in a new epoch; waits until it is ready again.
    Restart {
        #[command(flatten)]
        target: admin::Target,
        /// Restart at once: in-flight requests end with an error instead of finishing.
        #[arg(long)]
        force: bool,
        /// Restart this group (a GROUPS_FILE section) alone; the others keep serving.
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        wait: wait::WaitArgs,
    },
    /// Show the speculation mode and the profile's modes; with MODE, drain and restart into it
    /// (its own MAX_NUM_SEQS) and wait until it serves.
    Spec {
        #[command(flatten)]
        target: admin::Target,
        /// dspark, dflash, mtp or none (the profile's modes).
        mode: Option<sparkgate_config::SpecMethod>,
        /// Switch at once: in-flight requests end with an error instead of finishing.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        wait: wait::WaitArgs,
    },
    /// Show the models (MODELS) and which is loaded; with NAME (a served name, an alias or a
    /// profile), drain the loaded model, swap NAME in and wait until it serves.
    Model {
        #[command(flatten)]
        target: admin::Target,
        name: Option<String>,
        #[command(flatten)]
        wait: wait::WaitArgs,
    },
    /// Stop the rank group (the gateway keeps answering, with 503); waits until it has stopped.
    Stop {
        #[command(flatten)]
        target: admin::Target,
        #[command(flatten)]
        wait: wait::WaitArgs,
    },
    /// Start the rank group again after `stop` or a give-up; waits until it is ready.
    Start {
        #[command(flatten)]
        target: admin::Target,
        #[command(flatten)]
        wait: wait::WaitArgs,
    },
    /// A live view of the running gateway: state, admission, tokens/s, latency, ranks (q quits).
    Top {
        #[command(flatten)]
        target: admin::Target,
        /// Refresh interval in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        interval_ms: u64,
    },
    /// Show a rank's log: `logs` (rank 0), `logs worker` (rank 1), `logs rank N`.
    Logs {
        #[command(flatten)]
        target: admin::Target,
        /// `worker`, or `rank N`.
        which: Vec<String>,
        /// Lines from the end.
        #[arg(long, default_value_t = 100)]
        tail: usize,
        /// Keep following new lines.
        #[arg(long, short = 'f')]
        follow: bool,
        /// List the diagnostics bundles unplanned restarts wrote and print one: the newest, or
        /// the epoch given.
        #[arg(long, value_name = "EPOCH", num_args = 0..=1, default_missing_value = "newest")]
        diagnostics: Option<String>,
    },
    /// Streaming decode benchmark against an OpenAI-compatible URL (the gateway by default):
    /// TTFT, inter-token latency and tokens/s per concurrency, as the GLM guide's bench_decode.py.
    /// The default run (2 phases × concurrency 1, 2, 4 × 5 runs, up to 400 tokens: 70 requests)
    /// takes about 8 minutes against the demo.
    Bench(bench::BenchArgs),
    /// Check the head's weight trees (counts, sizes, index) and fetch what is missing with the
    /// Hugging Face CLI; AUTO_DOWNLOAD=0 only reports.
    Download {
        /// Print what would run without running it.
        #[arg(long)]
        dry_run: bool,
    },
    /// The worker's weights: WEIGHT_SYNC=rsync mirrors the trees (skipped when the worker's
    /// marker matches), nfs creates the worker's NFS volumes and prints the head's export, zfs
    /// prints the snapshot/send commands.
    Sync {
        /// Copy even when the marker matches (also FORCE_SYNC=1).
        #[arg(long)]
        force: bool,
    },
    /// IMAGE on the head (present, pulled, or built when BUILD=1), then on the worker unless its
    /// RootFS layers match: streamed, or staged through a resumable rsync (IMAGE_SHIP).
    Ship {
        /// stream, staged or auto (overrides IMAGE_SHIP).
        #[arg(long, value_name = "MODE")]
        mode: Option<String>,
    },
    /// The Engram pack (DeepSeek): the image's packer once per node with that node's rank;
    /// ranks whose packed files exist are skipped.
    Pack,
    /// Check without starting: IMAGE on both nodes with the same layers, the head's weights
    /// complete, and the image's self-check (SELF_CHECK_CMD).
    Verify,
    /// Every check on every node (workers over SSH): the same image, kernel, driver and weights
    /// everywhere, the ranks' link up with one MTU and speed, the peer reachable, the RoCE GID
    /// entry, clock skew, memory, disk and ports — one table; exit 1 when a check fails.
    Doctor {
        /// The rows as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The guides' smoke request (17*19, thinking off) through the gateway: pass or fail, with
    /// its latency.
    Smoke {
        /// The gateway's base URL [default: http://127.0.0.1:PORT].
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 300)]
        timeout_s: u64,
    },
    /// Write and enable the systemd unit `sparkgate.service` that runs `sparkgate serve` with
    /// this env file (root, on the head node); a re-run updates it and names what changed.
    Install(install::InstallArgs),
    /// Stop and disable `sparkgate.service` and remove its unit.
    Uninstall(install::InstallArgs),
    /// Print each rank's container and `vllm serve` command line as you could paste them.
    Plan {
        /// Print the plan as JSON (container specs, argv, labels).
        #[arg(long)]
        json: bool,
        /// Only this rank.
        #[arg(long, value_name = "N")]
        rank: Option<u32>,
        /// Show what `sparkgate demo` runs (its defaults under yours).
        #[arg(long)]
        demo: bool,
    },
}

/// Exit code for a configuration the user must fix (EX_USAGE, as in sysexits.h).
pub const EXIT_CONFIG: u8 = 64;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    https::set_cacert(cli.source.cacert.clone());
    if let Command::Config { reference: true, .. } = cli.command {
        emit(&sparkgate_config::reference_markdown())?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Uninstall(args) = &cli.command {
        return install::uninstall(args);
    }
    // An operator command given --url talks to that gateway: no serving configuration needed.
    if let Some(url) = admin_url(&cli.command) {
        return admin_command(cli.command, &admin::Endpoint::from_url(&url));
    }
    let mut options = LoadOptions::from_process(cli.source.env_file, cli.source.profile);
    serve_flags(&cli.command, &mut options);
    let logs = match demo_defaults(&cli.command, &mut options) {
        Err(e) => {
            eprintln!("sparkgate demo: {e:#}");
            return Ok(ExitCode::FAILURE);
        }
        Ok(logs) => logs,
    };
    let config = match Config::load(&options) {
        Ok(config) => config,
        // Every load error is the user's to fix: a bad value, file or syntax.
        Err(err) => {
            eprintln!("sparkgate: {err}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    for warning in config.warnings() {
        eprintln!("sparkgate: warning: {warning}");
    }
    let models = match models_of(&config, &options) {
        Ok(models) => models,
        Err(err) => {
            eprintln!("sparkgate: {err}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    let output = match cli.command {
        Command::Config { json: true, .. } => each_model(&models, true, |c| {
            Ok(serde_json::to_string_pretty(&c.settings_json())? + "\n")
        })?,
        Command::Config { .. } => each_model(&models, false, |c| Ok(sparkgate_config::settings_table(c)))?,
        Command::Plan { json, rank, .. } => each_model(&models, json, |c| render_plan(c, json, rank))?,
        Command::Serve { .. } | Command::Demo { .. } => return serve_command(&cli.command, &config, &options, logs),
        Command::Status { ref target, .. }
        | Command::Usage { ref target, .. }
        | Command::Quarantine { ref target, .. }
        | Command::Restart { ref target, .. }
        | Command::Spec { ref target, .. }
        | Command::Model { ref target, .. }
        | Command::Stop { ref target, .. }
        | Command::Start { ref target, .. }
        | Command::Logs { ref target, .. }
        | Command::Top { ref target, .. } => {
            let ep = admin::Endpoint::of(&config, target);
            return admin_command(cli.command, &ep);
        }
        Command::Doctor { json } => return doctor::run(&models, json),
        Command::Install(ref args) => return install::install(&config, args),
        other => return node_command(other, &models),
    };
    emit(&output)?;
    Ok(ExitCode::SUCCESS)
}

/// The models `config`/`plan` show: with MODELS each model's configuration, else the one.
fn models_of(config: &Config, options: &LoadOptions) -> Result<Vec<(String, Config)>, sparkgate_config::ConfigError> {
    if config.gateway.models.is_empty() {
        return Ok(vec![(String::new(), config.clone())]);
    }
    Ok(Config::load_groups(options)?
        .into_iter()
        .map(|g| (g.name, g.config))
        .collect())
}

/// `render` of each model: as it is for one model; with MODELS under a `# model NAME` line each
/// (the first, the default, loaded at start), or as one JSON object by model.
pub(crate) fn each_model(
    models: &[(String, Config)],
    json: bool,
    mut render: impl FnMut(&Config) -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    if let [(name, config)] = models {
        if name.is_empty() {
            return render(config);
        }
    }
    if json {
        let mut all = serde_json::Map::new();
        for (name, config) in models {
            all.insert(name.clone(), serde_json::from_str(&render(config)?)?);
        }
        return Ok(serde_json::to_string_pretty(&serde_json::json!({ "models": all }))? + "\n");
    }
    let mut out = String::new();
    for (i, (name, config)) in models.iter().enumerate() {
        let role = if i == 0 {
            "the default, loaded at start"
        } else {
            "swapped in on demand"
        };
        out.push_str(&format!("{}# model {name} ({role})\n", if i == 0 { "" } else { "\n" }));
        out.push_str(&render(config)?);
    }
    Ok(out)
}

/// `serve`'s flags, which win over the environment.
fn serve_flags(command: &Command, options: &mut LoadOptions) {
    if let Command::Serve { upstream, port, bind } = command {
        for (name, value) in [
            ("UPSTREAM_URL", upstream.clone()),
            ("PORT", port.map(|p| p.to_string())),
            ("BIND_ADDR", bind.clone()),
        ] {
            if let Some(v) = value {
                options.overrides.insert(name.to_owned(), v);
            }
        }
    }
}

/// The demo's defaults under the user's settings (for `demo`, and for `config`/`plan --demo`),
/// and what becomes of its logs; `Logs::Keep` for every other command.
fn demo_defaults(command: &Command, options: &mut LoadOptions) -> anyhow::Result<serve::Logs> {
    let demo = match command {
        Command::Demo {
            port,
            keep_logs,
            groups,
        } => {
            if let Some(p) = port {
                options.overrides.insert("PORT".to_owned(), p.to_string());
            }
            Some((serve::Simulator::BuildIfMissing, *keep_logs, *groups))
        }
        Command::Config { demo: true, .. } | Command::Plan { demo: true, .. } => {
            Some((serve::Simulator::NameOnly, true, 1))
        }
        _ => None,
    };
    match demo {
        Some((sim, keep, groups)) => serve::demo_defaults(options, sim, keep, groups),
        None => Ok(serve::Logs::Keep),
    }
}

/// `serve` or `demo`: the gateway and its groups (GROUPS_FILE's, or the one of the settings).
fn serve_command(
    command: &Command,
    config: &Config,
    options: &LoadOptions,
    logs: serve::Logs,
) -> anyhow::Result<ExitCode> {
    let groups = match Config::load_groups(options) {
        Ok(groups) => groups,
        Err(err) => {
            eprintln!("sparkgate: {err}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    let mode = match command {
        Command::Demo { .. } => serve::Mode::Demo(logs),
        _ => serve::Mode::Serve,
    };
    serve::serve(config, groups, mode)
}

/// The commands that prepare or measure the nodes: bench, download, sync, ship, pack, verify,
/// smoke.
/// The commands that prepare or measure the nodes; a preparation runs for each model (MODELS),
/// the first failure ending it.
fn node_command(command: Command, models: &[(String, Config)]) -> anyhow::Result<ExitCode> {
    let config = &models[0].1;
    let each = |run: &dyn Fn(&Config) -> anyhow::Result<ExitCode>| -> anyhow::Result<ExitCode> {
        for (name, c) in models {
            if !name.is_empty() {
                println!("# model {name}");
            }
            let code = run(c)?;
            if code != ExitCode::SUCCESS {
                return Ok(code);
            }
        }
        Ok(ExitCode::SUCCESS)
    };
    match command {
        Command::Bench(args) => bench::run(config, args),
        Command::Download { dry_run } => each(&|c| prepare::download(c, dry_run)),
        Command::Sync { force } => each(&|c| prepare::sync(c, force)),
        Command::Ship { mode } => each(&|c| prepare::ship(c, mode.as_deref())),
        Command::Pack => each(&prepare::pack),
        Command::Verify => each(&prepare::verify),
        Command::Smoke { url, timeout_s } => {
            smoke::run(config, url.as_deref(), std::time::Duration::from_secs(timeout_s))
        }
        other => unreachable!("not a node command: {other:?}"),
    }
}

/// The `--url` of an operator command, when it has one.
fn admin_url(command: &Command) -> Option<String> {
    match command {
        Command::Status { target, .. }
        | Command::Usage { target, .. }
        | Command::Quarantine { target, .. }
        | Command::Restart { target, .. }
        | Command::Spec { target, .. }
        | Command::Model { target, .. }
        | Command::Stop { target, .. }
        | Command::Start { target, .. }
        | Command::Logs { target, .. }
        | Command::Top { target, .. } => target.url.clone(),
        _ => None,
    }
}

/// The operator commands, against `ep`.
fn admin_command(command: Command, ep: &admin::Endpoint) -> anyhow::Result<ExitCode> {
    use admin::Change;
    match command {
        Command::Status { json, .. } => admin::status(ep, json),
        Command::Usage { window, key, json, .. } => usage::run(ep, &window, key.as_deref(), json),
        Command::Quarantine { action, .. } => quarantine::run(ep, action),
        Command::Restart { force, group, wait, .. } => admin::change(ep, Change::Restart { force, group }, &wait),
        Command::Spec { mode: None, .. } => admin::show_spec(ep),
        Command::Spec {
            mode: Some(mode),
            force,
            wait,
            ..
        } => admin::change(ep, Change::Spec { mode, force }, &wait),
        Command::Model { name: None, .. } => models::show(&admin::get_json(ep, "/admin/model")?),
        Command::Model {
            name: Some(name), wait, ..
        } => admin::change(ep, Change::Model { name }, &wait),
        Command::Stop { wait, .. } => admin::change(ep, Change::Stop, &wait),
        Command::Start { wait, .. } => admin::change(ep, Change::Start, &wait),
        Command::Logs {
            diagnostics: Some(epoch),
            ..
        } => diagnostics::run(ep, &epoch),
        Command::Logs {
            which, tail, follow, ..
        } => admin::logs(ep, &which, tail, follow),
        Command::Top { interval_ms, .. } => top::run(ep, std::time::Duration::from_millis(interval_ms)),
        other => anyhow::bail!("{other:?} is not an operator command"),
    }
}

/// Writes to stdout; a closed pipe (`sparkgate plan | head`) ends the output quietly.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn render_plan(config: &Config, json: bool, only: Option<u32>) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let mut plan = config.plan();
    if let Some(rank) = only {
        anyhow::ensure!(
            rank < config.serving.nnodes,
            "--rank {rank}: the plan has ranks 0..{}",
            config.serving.nnodes - 1
        );
        plan.ranks.retain(|r| r.rank == rank);
    }
    if json {
        return Ok(serde_json::to_string_pretty(&plan)? + "\n");
    }
    let mut out = String::new();
    writeln!(
        out,
        "# {} · mode {} · config hash {}",
        config.profile, config.speculation.active, plan.config_hash
    )?;
    // Start order: workers first, then rank 0.
    for r in plan.ranks.iter().rev() {
        let place = match config.nodes.worker(r.rank) {
            None => "head (local Docker)".to_owned(),
            Some(w) if w.is_remote(&config.nodes) => format!("{} (ssh {} port {})", w.label, w.ssh, w.ssh_port),
            Some(w) => format!("{} (on the head, local Docker)", w.label),
        };
        writeln!(out, "\n# rank {} on {place}\n{}", r.rank, r.docker_run_command())?;
        writeln!(
            out,
            "\n# rank {} vLLM command inside the container\n{}",
            r.rank,
            r.vllm_command()
        )?;
    }
    Ok(out)
}
