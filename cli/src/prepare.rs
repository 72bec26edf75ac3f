//! Node-preparation subcommands, each usable alone: `download` (the head's weights, fetched with
//! the Hugging Face CLI), `sync` (the worker's weights: rsync by marker, NFS volumes, ZFS
//! commands), `ship` (IMAGE on the head, then on the worker by layers), `pack` (the Engram pack,
//! one container per node) and `verify` (image identity, weights, the image's self-check).

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
    match config.storage.weight_sync {
        WeightSync::Rsync => {}
        WeightSync::None => {
            println!("WEIGHT_SYNC=none: the worker's weights are managed outside sparkgate; nothing to do");
            return Ok(ExitCode::SUCCESS);
        }
        WeightSync::Nfs => return nfs(config),
        WeightSync::Zfs => {
            let snapshot = format!(
                "sparkgate-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_secs()
            );
            println!(
                "WEIGHT_SYNC=zfs: run these on the head (add `-i @PREVIOUS` to `zfs send` for an incremental update):"
            );
            for c in sparkgate_prepare::share::zfs_commands(config, &snapshot, None) {
                println!("  {c}");
            }
            return Ok(ExitCode::SUCCESS);
        }
    }
    let force = force || config.storage.force_sync;
    for w in &config.nodes.workers {
        if !sync_worker(config, w, force) {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Mirrors each tree onto one worker; false when one failed (the error printed).
fn sync_worker(config: &Config, w: &sparkgate_config::Worker, force: bool) -> bool {
    use sparkgate_prepare::sync::{self, Synced};
    for plan in sync::plans(config, w) {
        let started = std::time::Instant::now();
        println!("sync {}: {} → {}:{}", plan.name, plan.src.display(), w.ssh, plan.dest);
        match sync::sync(config, w, &plan, force) {
            Ok(Synced::Unchanged) => println!(
                "sync {}: unchanged (marker {} matches), skipped in {:.2} s",
                plan.name,
                plan.marker_file,
                started.elapsed().as_secs_f64()
            ),
            Ok(Synced::Copied) => println!("sync {}: copied in {:.1} s", plan.name, started.elapsed().as_secs_f64()),
            Err(e) => {
                eprintln!("sparkgate: sync {} to the {}: {e}", plan.name, w.label);
                return false;
            }
        }
    }
    true
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// WEIGHT_SYNC=nfs: the worker's volumes are created (or recreated when their options changed);
/// the head's export is printed, since serving NFS is the host's job.
fn nfs(config: &Config) -> anyhow::Result<ExitCode> {
    let volumes = sparkgate_prepare::share::nfs_volumes(config);
    println!("WEIGHT_SYNC=nfs: the head must export (an NFSv4 server, e.g. /etc/exports with the trees bind-mounted under /export):");
    for line in sparkgate_prepare::share::nfs_exports(config, "/export") {
        println!("  {line}");
    }
    for v in &volumes {
        println!("  # /export/{} is {}", v.export, v.head_dir);
    }
    runtime()?.block_on(async {
        let (_, remotes) = sparkgate_prepare::verify::connect(config).await?;
        if remotes.is_empty() {
            println!("every worker is this machine (its address is HEAD_IP): no volumes to create");
        }
        for r in &remotes {
            for (v, created) in sparkgate_prepare::share::ensure_worker_volumes(config, &r.node).await? {
                let opts: Vec<String> = v.driver_opts.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{} volume {}: {} ({})",
                    r.worker.label,
                    v.name,
                    if created { "created" } else { "up to date" },
                    opts.join(" ")
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `sparkgate ship`: IMAGE on the head (present, pulled or built), then on the worker unless its
/// layers match.
pub(super) fn ship(config: &Config, mode: Option<&str>) -> anyhow::Result<ExitCode> {
    let mut config = config.clone();
    if let Some(m) = mode {
        config.preparation.ship = match m {
            "stream" => sparkgate_config::ImageShip::Stream,
            "staged" => sparkgate_config::ImageShip::Staged,
            "auto" => sparkgate_config::ImageShip::Auto,
            other => anyhow::bail!("--mode {other}: expected stream, staged or auto"),
        };
    }
    let report = sparkgate_prepare::progress::Terminal::new();
    runtime()?.block_on(async {
        let (head, remotes) = sparkgate_prepare::verify::connect(&config).await?;
        let id = sparkgate_prepare::image::ensure_on_head(&config, &head, &report).await?;
        if remotes.is_empty() {
            println!("every worker is this machine (its address is HEAD_IP): nothing to ship");
        }
        let many = remotes.len() > 1;
        for r in &remotes {
            let to = if many {
                format!(" to the {}", r.worker.label)
            } else {
                String::new()
            };
            match sparkgate_prepare::ship::ship(&config, &head, &r.node, &r.worker, &id, &report).await {
                Ok(shipped) => println!("ship{to}: {shipped:?}"),
                Err(e) => {
                    eprintln!("sparkgate: ship{to}: {e}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `sparkgate pack`: the Engram pack on every node whose packed files are missing.
pub(super) fn pack(config: &Config) -> anyhow::Result<ExitCode> {
    if config.preparation.pack.is_none() {
        eprintln!(
            "sparkgate: profile {} has no Engram pack (DeepSeek only)",
            config.profile
        );
        return Ok(ExitCode::FAILURE);
    }
    let report = sparkgate_prepare::progress::Terminal::new();
    runtime()?.block_on(async {
        let (head, remotes) = sparkgate_prepare::verify::connect(config).await?;
        let nodes = sparkgate_prepare::pack::rank_nodes(config, &head, &remotes);
        match sparkgate_prepare::pack::pack(config, &nodes, &report).await {
            Ok(done) => {
                for (rank, p) in done {
                    println!("rank {rank}: {p:?}");
                }
                println!("the next start mounts the packed files at /engram-packed (DSV41_PACKED_DIR)");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("sparkgate: pack: {e}");
                Ok(ExitCode::FAILURE)
            }
        }
    })
}

/// `sparkgate verify`: what a start would check, without starting — the image on both nodes
/// with the same layers, the head's weights complete, and the image's self-check.
pub(super) fn verify(config: &Config) -> anyhow::Result<ExitCode> {
    let image = &config.serving.image;
    let mut failed = 0;
    let mut check = |ok: bool, text: String| {
        println!("{} {text}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            failed += 1;
        }
    };
    for t in sparkgate_prepare::check(config) {
        let missing = t.missing.join("; ");
        check(
            t.complete(),
            format!("weights {} ({}) {missing}", t.name, t.dir.display()),
        );
    }
    runtime()?.block_on(async {
        let (head, remotes) = sparkgate_prepare::verify::connect(config).await?;
        let head_id = head.image_identity(image).await?;
        check(
            head_id.is_some(),
            format!(
                "image {image} on the head{}",
                head_id
                    .as_ref()
                    .map_or(String::new(), |i| format!(" (identity {})", i.key()))
            ),
        );
        for r in remotes.iter().filter(|_| head_id.is_some()) {
            let h = head_id.as_ref().expect("filtered");
            let w = r.node.image_identity(image).await?;
            check(
                w.as_ref().is_some_and(|w| w.same_image(h)),
                format!(
                    "image on the {} {}",
                    r.worker.label,
                    match &w {
                        None => "missing (run `sparkgate ship`)".to_owned(),
                        Some(w) if w.same_image(h) => "has the head's layers".to_owned(),
                        Some(_) => "differs from the head's (run `sparkgate ship`)".to_owned(),
                    }
                ),
            );
        }
        let argv = &config.supervision.self_check;
        if argv.is_empty() {
            println!("--   self-check: none (SELF_CHECK_CMD empty or SKIP_OVERLAY_VERIFY=1)");
        } else if head_id.is_some() {
            let plan = config.plan();
            let rank0 = plan.ranks.iter().find(|r| r.rank == 0).expect("rank 0");
            let log = config.supervision.log_dir.join("overlay-verify.log");
            let r = sparkgate_prepare::verify::self_check(&head, rank0, argv, &log).await;
            check(
                r.is_ok(),
                format!(
                    "self-check `{}` ({}){}",
                    argv.join(" "),
                    log.display(),
                    r.err().map_or(String::new(), |e| format!(": {e}"))
                ),
            );
        }
        anyhow::Ok(())
    })?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
