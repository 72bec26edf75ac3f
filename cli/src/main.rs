//! The `sparkgate` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

// mimalloc: the request path allocates and frees small buffers on every request; glibc's malloc
// spent 6.5 % of the gateway's CPU on that at 64 concurrent requests (BENCHMARKS.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = sparkgate_cli::Cli::parse();
    match sparkgate_cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sparkgate: {err:#}");
            ExitCode::FAILURE
        }
    }
}
