//! The `sparkgate` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

// Small allocations dominate a request's allocator traffic; mimalloc serves them in fewer
// instructions than glibc's malloc (measured in BENCHMARKS.md, "The hot path").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
