//! The `sparkgate` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = sparkgate_gateway::cli::Cli::parse();
    match sparkgate_gateway::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sparkgate: {err:#}");
            ExitCode::FAILURE
        }
    }
}
