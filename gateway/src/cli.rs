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
    let config = match Config::load(&LoadOptions::from_process(cli.source.env_file, cli.source.profile)) {
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
