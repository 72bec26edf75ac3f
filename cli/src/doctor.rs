//! `sparkgate doctor [--json]`: every check on every node (`sparkgate_doctor`) as a table — or
//! its rows as JSON — and exit 1 when one failed.

use std::process::ExitCode;

use sparkgate_config::Config;

pub(crate) fn run(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = runtime.block_on(sparkgate_doctor::examine(config, sparkgate_doctor::Depth::All));
    let text = if json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        report.table()
    };
    crate::emit(&text)?;
    Ok(if report.failures().next().is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
