//! Node-preparation subcommands: `sparkgate download` — check the head's weight trees and fetch
//! what is missing with the Hugging Face CLI (AUTO_DOWNLOAD=0 or `--dry-run`: report only);
//! `sparkgate sync` — mirror them to the worker (WEIGHT_SYNC=rsync).

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

/// `sparkgate sync`: WEIGHT_SYNC=rsync mirrors each tree to the worker unless its marker says the
/// worker's copy is current (`--force` or FORCE_SYNC=1 copies anyway).
pub(super) fn sync(config: &Config, force: bool) -> anyhow::Result<ExitCode> {
    use sparkgate_config::WeightSync;
    use sparkgate_prepare::sync::{self, Synced};
    match config.storage.weight_sync {
        WeightSync::Rsync => {}
        WeightSync::None => {
            println!("WEIGHT_SYNC=none: the worker's weights are managed outside sparkgate; nothing to do");
            return Ok(ExitCode::SUCCESS);
        }
        other => {
            eprintln!(
                "sparkgate: WEIGHT_SYNC={} is not carried out by `sparkgate sync` yet; use WEIGHT_SYNC=rsync or the launcher's share script",
                format!("{other:?}").to_lowercase()
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    let force = force || config.storage.force_sync;
    for plan in sync::plans(config) {
        let started = std::time::Instant::now();
        println!(
            "sync {}: {} → {}:{}",
            plan.name,
            plan.src.display(),
            config.nodes.worker_ssh,
            plan.dest
        );
        match sync::sync(config, &plan, force) {
            Ok(Synced::Unchanged) => println!(
                "sync {}: unchanged (marker {} matches), skipped in {:.2} s",
                plan.name,
                plan.marker_file,
                started.elapsed().as_secs_f64()
            ),
            Ok(Synced::Copied) => println!("sync {}: copied in {:.1} s", plan.name, started.elapsed().as_secs_f64()),
            Err(e) => {
                eprintln!("sparkgate: sync {}: {e}", plan.name);
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
