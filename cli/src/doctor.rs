//! `sparkgate doctor [--json]`: every check on every node (`sparkgate_doctor`) as a table — or
//! its rows as JSON — and exit 1 when one failed. With MODELS, each model's checks (its image,
//! its weights), one table each.

use std::process::ExitCode;

use sparkgate_config::Config;

pub(crate) fn run(models: &[(String, Config)], json: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut failed = false;
    let text = crate::each_model(models, json, |config| {
        let report = runtime.block_on(sparkgate_doctor::examine(config, sparkgate_doctor::Depth::All));
        failed |= report.failures().next().is_some();
        Ok(if json {
            serde_json::to_string_pretty(&report)? + "\n"
        } else {
            report.table()
        })
    })?;
    crate::emit(&text)?;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
