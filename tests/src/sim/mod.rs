//! `vllm-sim`: a CPU simulator of one `vllm serve` rank of vLLM 0.33 or 0.34 (`--vllm-version`,
//! default the newest) — same command line, a real TCP rendezvous between ranks, vLLM's HTTP
//! surface, deterministic output paced from the profile's throughput table, and fault
//! injection. See `tests/vllm-sim.md` for where it knowingly differs from vLLM.

mod api;
mod args;
mod bpe;
mod changes;
mod control;
mod count;
mod counting;
mod engine;
mod faults;
mod flags;
mod group;
mod log;
mod markup;
mod memory;
mod metric_families;
mod metrics;
mod model;
mod parser;
mod prefix;
mod prompt;
mod structured;
mod text;
mod tools;
mod vocab;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sparkgate_config::{seeded_throughput, ProfileId, SpecMethod, VllmRelease};

pub use args::{parse as parse_args, ArgError, ServeArgs};

fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn env_secs(name: &str, default: f64) -> Duration {
    Duration::from_secs_f64(env_f64(name).unwrap_or(default).max(0.0))
}

/// The release this process plays, set once from `--vllm-version` before serving.
static RELEASE: std::sync::OnceLock<VllmRelease> = std::sync::OnceLock::new();

/// The vLLM release the simulator plays (the newest unless `--vllm-version` named another).
pub(crate) fn release() -> VllmRelease {
    RELEASE.get().copied().unwrap_or(VllmRelease::NEWEST)
}

/// Takes the simulator's own `--vllm-version V` (or `=V`) out of `argv`: not a vLLM flag, so a
/// plan's EXTRA_ARGS can carry it to every simulated rank.
fn take_release(argv: &[String]) -> Result<(VllmRelease, Vec<String>), String> {
    let mut rest = Vec::with_capacity(argv.len());
    let mut release = VllmRelease::NEWEST;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let value = match a.strip_prefix("--vllm-version") {
            Some("") => it.next().ok_or("argument --vllm-version: expected one argument")?,
            Some(v) if v.starts_with('=') => &v[1..],
            _ => {
                rest.push(a.clone());
                continue;
            }
        };
        release = VllmRelease::parse(value).map_err(|e| format!("argument --vllm-version: {e}"))?;
    }
    Ok((release, rest))
}

/// Runs the simulator with `argv` (without the program name); returns the exit status.
pub fn main(argv: &[String]) -> i32 {
    if argv.first().map(String::as_str) == Some("selfcheck") {
        return selfcheck();
    }
    if argv.first().map(String::as_str) == Some("pack-engram") {
        return pack_engram(&argv[1..]);
    }
    if argv.first().map(String::as_str) == Some("doctor-versions") {
        return doctor_versions();
    }
    let argv = match take_release(argv) {
        Ok((release, rest)) => {
            let _ = RELEASE.set(release);
            rest
        }
        Err(e) => {
            eprintln!("vllm serve: error: {e}");
            return 2;
        }
    };
    let args = match args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{}", e.message);
            return e.status;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(args))
}

/// `vllm-sim selfcheck`: the simulator's stand-in for an image's GPU/overlay self-check scripts
/// (not a vLLM command). SIM_SELFCHECK_FAIL=1 makes it fail the way a broken overlay does.
fn selfcheck() -> i32 {
    println!("self-check: EXL3 overlay installed (simulated)");
    if std::env::var("SIM_SELFCHECK_FAIL").is_ok_and(|v| v == "1") {
        eprintln!("AssertionError: EXL3 GEMM result differs from the reference (max abs err 3.2e-1)");
        return 1;
    }
    println!("self-check: EXL3 GEMM matches the reference (simulated)");
    0
}

/// `vllm-sim doctor-versions`: the stand-in for the line `sparkgate doctor` reads from a real
/// image with python (DOCTOR_VERSIONS_CMD; not a vLLM command): the image's vLLM, torch, NCCL and
/// CUDA versions, from SIM_TORCH_VERSION, SIM_NCCL_VERSION and SIM_CUDA_VERSION when set.
fn doctor_versions() -> i32 {
    let v = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    println!(
        "vllm={} torch={} nccl={} cuda={}",
        release().version(),
        v("SIM_TORCH_VERSION", "2.9.0"),
        v("SIM_NCCL_VERSION", "2.28.9"),
        v("SIM_CUDA_VERSION", "13.0")
    );
    0
}

/// `vllm-sim pack-engram --model DIR --rank R --tp N --out DIR`: the stand-in for the DeepSeek
/// image's `pack_engram.py` (not a vLLM command). Writes `engram-l{1,14}-r<R>of<N>.bin` (a few
/// bytes naming the rank, instead of 47 GiB per layer) after printing per-layer progress.
fn pack_engram(argv: &[String]) -> i32 {
    let flag = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    let (Some(model), Some(rank), Some(tp), Some(out)) = (flag("--model"), flag("--rank"), flag("--tp"), flag("--out"))
    else {
        eprintln!("usage: pack-engram --model DIR --rank R --tp N --out DIR");
        return 2;
    };
    if !std::path::Path::new(&model).is_dir() {
        eprintln!("pack-engram: --model {model} is not a directory");
        return 1;
    }
    for layer in [1, 14] {
        println!("pack-engram: layer {layer} rank {rank}/{tp}: packing (simulated)");
        let path = format!("{out}/engram-l{layer}-r{rank}of{tp}.bin");
        if let Err(e) = std::fs::write(&path, format!("layer {layer} rank {rank} of {tp}\n")) {
            eprintln!("pack-engram: {path}: {e}");
            return 1;
        }
    }
    println!("pack-engram: rank {rank}/{tp} done");
    0
}

/// The simulated model family, from the reasoning parser (or `SIM_PROFILE`).
fn profile_of(args: &ServeArgs) -> ProfileId {
    match args.reasoning_parser.as_deref() {
        Some(p) if p.starts_with("glm") => ProfileId::Glm53Flash,
        Some(p) if p.starts_with("deepseek") => ProfileId::DeepSeekV41Flash,
        _ => std::env::var("SIM_PROFILE")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(ProfileId::DeepSeekV41Flash),
    }
}

/// Per-position acceptance of each method (GLM's structured measurements for DFlash2).
fn acceptance(method: &str, k: u32) -> Vec<f64> {
    let base: &[f64] = match method {
        "dflash" => &[0.98, 0.98, 0.94, 0.94, 0.91, 0.83, 0.83],
        "dspark" => &[0.75, 0.55, 0.35, 0.2, 0.1],
        "mtp" => &[0.8, 0.55],
        _ => &[0.7, 0.5, 0.3],
    };
    (0..k as usize).map(|i| *base.get(i).unwrap_or(&0.05)).collect()
}

/// Loading weights: progress lines, then done; a hang-at-start fault freezes it midway.
async fn load(component: &str, faults: &faults::Faults, seconds: Duration) {
    let steps = 10u32;
    for i in 0..=steps {
        log::info(
            component,
            "default_loader.py:291",
            &format!(
                "Loading safetensors checkpoint shards: {:3}% Completed | {i}/{steps}",
                i * 100 / steps
            ),
        );
        if faults.hang_at_start && i == 2 {
            faults.hang();
            faults.wait_while_hung().await;
        }
        if i < steps {
            tokio::time::sleep(seconds / steps).await;
        }
    }
    log::info(
        component,
        "default_loader.py:310",
        &format!("Loading weights took {:.2} seconds", seconds.as_secs_f64()),
    );
}

/// A rank's life: the start-up log, then a headless worker's rendezvous with its head, or the
/// head's group, engine and API server until the process ends.
async fn run(args: ServeArgs) -> i32 {
    let faults = Arc::new(faults::Faults::from_env());
    let started = Instant::now();
    let load_time = env_secs("SIM_LOAD_SECONDS", 1.0);
    let ready_timeout = env_secs("VLLM_ENGINE_READY_TIMEOUT_S", 600.0);
    arm_timed_faults(&faults);
    log_start(&args);
    if args.headless {
        log::info(
            "APIServer",
            "serve.py:216",
            &format!(
                "Launching vLLM (v{}) headless multiproc executor, with head node address {}:{} for torch.distributed process group.",
                release(), args.master_addr, args.master_port
            ),
        );
        load("Worker_TP1", &faults, load_time).await;
        return group::run_headless(
            &args.master_addr,
            args.master_port,
            args.node_rank,
            args.nnodes,
            args.tensor_parallel_size,
            ready_timeout,
            faults,
        )
        .await;
    }
    let rendezvous = group::Group::rendezvous(
        &args.master_addr,
        args.master_port,
        args.nnodes,
        args.tensor_parallel_size,
        ready_timeout,
    );
    let (group, ()) = tokio::join!(rendezvous, load("EngineCore_DP0", &faults, load_time));
    let group = match group {
        Ok(g) => g,
        Err(e) => {
            log::error("EngineCore_DP0", "core_client.py:742", &format!("TimeoutError: {e}"));
            return 1;
        }
    };
    let profile = profile_of(&args);
    let (engine, metrics) = start_engine(&args, profile, faults.clone(), group);
    let listener = match tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await {
        Ok(l) => l,
        Err(e) => {
            log::error(
                "APIServer",
                "api_server.py:1850",
                &format!("OSError: [Errno 98] could not bind on {}:{}: {e}", args.host, args.port),
            );
            return 1;
        }
    };
    let app = app(args, profile, engine.clone(), metrics);
    log_ready(listener.local_addr().expect("bound"), started);
    if let Some(port) = env_f64("SIM_CONTROL_PORT") {
        sparkgate_task::spawn("sim-control", control::serve(port as u16, faults.clone(), engine));
    }
    api::serve(listener, app, faults).await;
    0
}

/// The faults that strike a set time after start (SIM_FAULT_CRASH_AFTER_S, …_HANG_AFTER_S).
fn arm_timed_faults(faults: &Arc<faults::Faults>) {
    if let Some(after) = faults.crash_after {
        let f = faults.clone();
        sparkgate_task::spawn("sim-crash-after", async move {
            tokio::time::sleep(after).await;
            f.crash();
        });
    }
    if let Some(after) = faults.hang_after {
        let f = faults.clone();
        sparkgate_task::spawn("sim-hang-after", async move {
            tokio::time::sleep(after).await;
            f.hang();
        });
    }
}

/// vLLM's first lines: its version, its start-up quirks, the non-default arguments.
fn log_start(args: &ServeArgs) {
    log::info(
        "APIServer",
        "api_server.py:1893",
        &format!("vLLM API server version {}", release()),
    );
    faults::startup_quirks();
    let given: serde_json::Map<String, serde_json::Value> = args
        .given
        .iter()
        .map(|(k, v)| (k.replace('-', "_"), serde_json::Value::from(v.join(" "))))
        .collect();
    log::info(
        "APIServer",
        "utils.py:327",
        &format!("non-default args: {}", serde_json::Value::Object(given)),
    );
}

/// The pacing of `profile`'s speculation mode from the command line: its throughput table
/// scaled by SIM_SPEED (instant when 0), prefill speed, and per-position acceptance.
fn pacing(args: &ServeArgs, profile: ProfileId) -> engine::Pacing {
    let method = args.speculative.as_ref().map(|s| s.method.as_str()).unwrap_or("none");
    let spec_method = method.parse::<SpecMethod>().unwrap_or(SpecMethod::None);
    let table = seeded_throughput(profile, spec_method)
        .or_else(|| seeded_throughput(profile, SpecMethod::None))
        .expect("every profile has a none mode");
    let k = args.speculative.as_ref().map(|s| s.num_speculative_tokens);
    let speed = match std::env::var("SIM_SPEED").ok().as_deref().map(str::trim) {
        Some("instant") | Some("0") => None,
        Some(v) => Some(v.parse::<f64>().ok().filter(|s| *s > 0.0).unwrap_or(1.0)),
        None => Some(1.0),
    };
    engine::Pacing {
        table,
        speed,
        prefill_chunk: args.max_num_batched_tokens as usize,
        prefill_cap: args.long_prefill_token_threshold as usize,
        prefill_tps: if profile == ProfileId::Glm53Flash {
            1500.0
        } else {
            970.0
        },
        // SIM_DRAFT_ACCEPTANCE scales every position's acceptance (0: one token per step, as the
        // reference fixture's engine emits).
        acceptance: k
            .map(|k| {
                let scale = env_f64("SIM_DRAFT_ACCEPTANCE").unwrap_or(1.0).clamp(0.0, 1.0);
                acceptance(method, k).into_iter().map(|p| p * scale).collect()
            })
            .unwrap_or_default(),
    }
}

/// The engine of the head rank (and its metrics), its loop and the stats line running.
fn start_engine(
    args: &ServeArgs,
    profile: ProfileId,
    faults: Arc<faults::Faults>,
    group: Arc<group::Group>,
) -> (Arc<engine::Engine>, Arc<metrics::Metrics>) {
    let k = args.speculative.as_ref().map(|s| s.num_speculative_tokens);
    let metrics = Arc::new(metrics::Metrics::new(args.served_name(), args.max_num_seqs, k));
    let settings = engine::EngineSettings {
        max_num_seqs: args.max_num_seqs,
        max_queued: args.max_num_queued_reqs,
        pacing: pacing(args, profile),
        execute_timeout: env_secs("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", 300.0),
        watchdog: env_secs("SIM_WATCHDOG_S", 5.0),
    };
    let engine = engine::Engine::new(settings, metrics.clone(), faults, group);
    sparkgate_task::spawn("sim-engine", engine.clone().run());
    sparkgate_task::spawn(
        "sim-stats",
        stats_logger(metrics.clone(), env_secs("VLLM_LOG_STATS_INTERVAL", 10.0)),
    );
    (engine, metrics)
}

/// What the API server's handlers share: the arguments, the chat template, the engine, the
/// model's fingerprint and creation time, and the prefix cache.
fn app(
    args: ServeArgs,
    profile: ProfileId,
    engine: Arc<engine::Engine>,
    metrics: Arc<metrics::Metrics>,
) -> Arc<api::App> {
    let template = if profile == ProfileId::Glm53Flash {
        text::Template::Glm
    } else {
        text::Template::DeepSeek
    };
    let fingerprint = format!(
        "vllm-{}-tp{}-{:08x}",
        release(),
        args.tensor_parallel_size,
        args.served_name()
            .bytes()
            .fold(0u32, |h, b| h.rotate_left(5) ^ u32::from(b))
    );
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // The KV cache's blocks: --num-gpu-blocks-override, else 1M tokens' worth (a Spark's
    // share of it, about); none when prefix caching is off.
    let prefix = prefix::PrefixCache::new(
        args.block_size,
        match (args.prefix_caching, args.gpu_blocks) {
            (false, _) => 0,
            (true, Some(blocks)) => blocks,
            (true, None) => (1 << 20) / args.block_size,
        },
    );
    Arc::new(api::App {
        args,
        template,
        engine,
        metrics,
        created,
        fingerprint,
        prefix,
    })
}

/// vLLM's lines once the API server listens on `addr`, ending with the one that says ready.
fn log_ready(addr: std::net::SocketAddr, started: Instant) {
    log::info("APIServer", "api_server.py:1925", "Supported tasks: ['generate']");
    log::info(
        "APIServer",
        "api_server.py:1931",
        &format!("Starting vLLM server on http://{addr}"),
    );
    log::info("APIServer", "launcher.py:37", "Available routes are:");
    for (route, methods) in [
        ("/health", "GET"),
        ("/ping", "GET, POST"),
        ("/version", "GET"),
        ("/metrics", "GET"),
        ("/tokenize", "POST"),
        ("/detokenize", "POST"),
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
        ("/v1/responses", "POST"),
    ] {
        log::info(
            "APIServer",
            "launcher.py:45",
            &format!("Route: {route}, Methods: {methods}"),
        );
    }
    let pid = std::process::id();
    log::info("APIServer", "server.py:83", &format!("Started server process [{pid}]"));
    log::info("APIServer", "on.py:48", "Waiting for application startup.");
    log::info("APIServer", "on.py:62", "Application startup complete.");
    log::info(
        "APIServer",
        "api_server.py:1950",
        &format!("vllm-sim ready in {:.2}s", started.elapsed().as_secs_f64()),
    );
}

/// vLLM's periodic stats line, printed while there is work.
async fn stats_logger(metrics: Arc<metrics::Metrics>, every: Duration) {
    use std::sync::atomic::Ordering::SeqCst;
    let mut last_tokens = metrics.generation_tokens_total();
    let every = every.max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        let tokens = metrics.generation_tokens_total();
        let (running, waiting) = (metrics.running.load(SeqCst), metrics.waiting.load(SeqCst));
        if tokens == last_tokens && running == 0 && waiting == 0 {
            continue;
        }
        let tps = (tokens - last_tokens) as f64 / every.as_secs_f64();
        last_tokens = tokens;
        log::info(
            "EngineCore_DP0",
            "loggers.py:248",
            &format!(
                "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: {tps:.1} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%"
            ),
        );
    }
}
