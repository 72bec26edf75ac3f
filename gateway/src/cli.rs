//! The `sparkgate` command line: parsing and the subcommands that need no running gateway.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use sparkgate_config::{Config, LoadOptions, NodeRole};

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
    },
    /// Serve the OpenAI gateway on PORT. Today this is gateway-only mode: it fronts an already
    /// running vLLM (or vllm-sim) at UPSTREAM_URL and supervises nothing.
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
    /// Print each rank's container and `vllm serve` command line as you could paste them.
    Plan {
        /// Print the plan as JSON (container specs, argv, labels).
        #[arg(long)]
        json: bool,
        /// Only this rank.
        #[arg(long, value_name = "N")]
        rank: Option<u32>,
    },
}

/// Exit code for a configuration the user must fix (EX_USAGE, as in sysexits.h).
pub const EXIT_CONFIG: u8 = 64;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Config { reference: true, .. } = cli.command {
        emit(&sparkgate_config::reference_markdown())?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut options = LoadOptions::from_process(cli.source.env_file, cli.source.profile);
    if let Command::Serve { upstream, port, bind } = &cli.command {
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
    let output = match cli.command {
        Command::Config { json: true, .. } => serde_json::to_string_pretty(&config.settings_json())? + "\n",
        Command::Config { .. } => sparkgate_config::settings_table(&config),
        Command::Plan { json, rank } => render_plan(&config, json, rank)?,
        Command::Serve { .. } => return serve(&config),
    };
    emit(&output)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout; a closed pipe (`sparkgate plan | head`) ends the output quietly.
fn emit(text: &str) -> anyhow::Result<()> {
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
        let place = match r.node {
            NodeRole::Head => "head (local Docker)".to_owned(),
            NodeRole::Worker => format!("worker (ssh {})", config.nodes.worker_ssh),
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

/// Runs the gateway until SIGTERM or Ctrl-C, then drains.
fn serve(config: &Config) -> anyhow::Result<ExitCode> {
    crate::init_logging(config.gateway.log_json);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let addr = std::net::SocketAddr::new(config.gateway.bind, config.ports.public);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e} (is PORT {} in use?)", config.ports.public))?;
        let local = crate::local_addr(&listener)?;
        let mode = config.speculation.active_mode();
        let control = crate::GatewayControl::new(
            mode.max_num_seqs,
            config.gateway.queue_depth,
            config.gateway.queue_timeout,
            mode.method.as_str(),
        );
        tracing::info!(
            profile = %config.profile,
            model = %config.serving.served_model_name,
            upstream = %config.gateway.upstream,
            max_num_seqs = mode.max_num_seqs,
            "sparkgate listening on http://{local}"
        );
        crate::serve(config, listener, control, true, shutdown_signal()).await?;
        tracing::info!("sparkgate stopped");
        Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown requested");
}
