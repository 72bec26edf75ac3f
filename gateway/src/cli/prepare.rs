//! Node-preparation subcommands: `sparkgate download` — check the head's weight trees and fetch
//! what is missing with the Hugging Face CLI (AUTO_DOWNLOAD=0 or `--dry-run`: report only).

use std::process::ExitCode;

use sparkgate_config::Config;
use sparkgate_prepare::{Fetched, Search};

pub(super) fn download(config: &Config, dry_run: bool) -> anyhow::Result<ExitCode> {
    let trees = sparkgate_prepare::check(config);
    for t in &trees {
        if t.complete() {
            println!("weights: {} ({}): complete", t.name, t.dir.display());
        } else {
            println!("weights: {} ({}): {}", t.name, t.dir.display(), t.missing.join("; "));
        }
    }
    if trees.iter().all(|t| t.complete()) {
        println!("weights complete; nothing to download");
        return Ok(ExitCode::SUCCESS);
    }
    let storage = &config.storage;
    if dry_run || !storage.auto_download {
        let cli = sparkgate_prepare::locate(&Search::from_env(&storage.hf_bin));
        for t in trees.iter().filter(|t| !t.complete()) {
            match &cli {
                Ok(cli) => println!("would run: {}", cli.describe(&t.fetch)),
                Err(e) => println!("would download {} from {}, but: {e}", t.name, t.fetch.repo),
            }
        }
        if dry_run {
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("sparkgate: AUTO_DOWNLOAD=0: not downloading; the weights above are incomplete");
        return Ok(ExitCode::FAILURE);
    }
    let cli = sparkgate_prepare::locate(&Search::from_env(&storage.hf_bin))?;
    let token = config.secrets.hf_token.as_ref().map(|t| t.expose().to_owned());
    for t in trees.iter().filter(|t| !t.complete()) {
        println!("→ {}", cli.describe(&t.fetch));
    }
    match sparkgate_prepare::download(config, &cli, token.as_deref()) {
        Ok(done) => {
            let fetched = done
                .iter()
                .filter(|(_, f)| matches!(f, Fetched::Downloaded { .. }))
                .count();
            println!("weights complete ({fetched} tree(s) downloaded)");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("sparkgate: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
