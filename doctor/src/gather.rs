//! The doctor's effects: each node's facts by one script (the head's in a local shell, a
//! worker's over the SSH connection the supervisor uses), its clock by a second, timed round
//! trip, its daemon and image (RUNTIME=docker), and the head's ports — every node at once, each
//! bounded in time, so one unreachable node is a failed row, never a hang.

use std::net::{IpAddr, TcpListener};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sparkgate_config::{Config, Runtime};
use sparkgate_docker::Node;

use crate::facts::{Ask, Facts, CLOCK, SCRIPT};
use crate::model::{Limits, Seen};
use crate::Depth;

/// How long one node's reading may take.
const NODE_LIMIT: Duration = Duration::from_secs(20);

/// The root a node's facts are read under (NODE_ROOT).
fn root(config: &Config, node: &str) -> String {
    config.supervision.node_root(node)
}

/// Where a node keeps the weights the ranks load: DeepSeek's model directory, GLM's pinned
/// snapshot in the Hugging Face cache (its files are links into the cache's blobs, followed).
fn weights_dir(config: &Config, worker: Option<&sparkgate_config::Worker>) -> String {
    use sparkgate_config::Weights;
    match (&config.storage.weights, worker) {
        (Weights::DeepSeek { model_host, .. }, None) => model_host.clone(),
        (Weights::DeepSeek { worker_model_dir, .. }, Some(w)) => w.path(worker_model_dir),
        (
            Weights::Glm {
                hf_home,
                worker_hf_home,
                cache_name,
                revision,
                ..
            },
            worker,
        ) => {
            let home = worker.map_or_else(|| hf_home.clone(), |w| w.path(worker_hf_home));
            format!("{}/hub/{cache_name}/snapshots/{revision}", home.trim_end_matches('/'))
        }
    }
}

fn ask(config: &Config, node: &str, worker: Option<&sparkgate_config::Worker>) -> Ask {
    let nic = worker.map_or(&config.nodes.head_nic, |w| &w.nic);
    let peer = match worker {
        Some(_) => config.nodes.head_ip.to_string(),
        None => config
            .nodes
            .remote_workers()
            .next()
            .map(|w| w.ip.to_string())
            .unwrap_or_default(),
    };
    let root = root(config, node);
    // The head's memory as memguard and preflight read it (MEMINFO_PATH) unless a root is given.
    let meminfo = match (worker, root.is_empty()) {
        (None, true) => config.supervision.meminfo_path.display().to_string(),
        _ => format!("{root}/proc/meminfo"),
    };
    Ask {
        meminfo,
        root,
        ifname: nic.ifname.clone(),
        hca: nic.hca.clone(),
        gid_index: nic.gid_index,
        weights: weights_dir(config, worker),
        peer,
        log_dir: config.supervision.log_dir.display().to_string(),
    }
}

fn args(a: &Ask) -> Vec<String> {
    vec![
        a.root.clone(),
        a.ifname.clone(),
        a.hca.clone(),
        a.gid_index.to_string(),
        a.weights.clone(),
        a.peer.clone(),
        a.log_dir.clone(),
        a.meminfo.clone(),
    ]
}

/// `script` with `args` on `node` (over its SSH session), or on the head when `None`.
async fn run(node: Option<&Node>, script: &str, args: &[String]) -> Result<String, String> {
    sparkgate_docker::run_script(node, script, args)
        .await
        .map_err(|e| e.to_string())
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The worker's clock against the head's: (offset, half the round trip).
async fn clock(node: &Node, root: &str) -> Option<(f64, f64)> {
    let sent = now();
    let text = run(Some(node), CLOCK, &[root.to_owned()]).await.ok()?;
    let back = now();
    let theirs: f64 = text.trim().parse().ok()?;
    Some((theirs - (sent + back) / 2.0, (back - sent) / 2.0))
}

/// The image on `node`: its identity (layers and run configuration), or why not.
async fn image(node: &Node, image: &str) -> Result<String, String> {
    match node.image_identity(image).await {
        Ok(Some(id)) => Ok(format!("{}/{}", id.layers.last().map_or("", String::as_str), id.config)),
        Ok(None) => Err(format!("{image} is not on this node")),
        Err(e) => Err(format!("daemon: {e}")),
    }
}

/// The daemons and the image are read by `sparkgate doctor`, not before a start (its
/// preparation ships the image; the backend connects to the daemons itself).
fn images(config: &Config, depth: Depth) -> bool {
    depth == Depth::All && config.supervision.runtime == Runtime::Docker
}

/// The image's versions line, from a throwaway container of rank 0's spec without its mounts,
/// devices or GPUs (the line needs none), running DOCTOR_VERSIONS_CMD.
async fn versions(config: &Config, node: &Node) -> Result<String, String> {
    use futures_util::StreamExt as _;
    let argv = &config.supervision.doctor_versions_cmd;
    let rank0 = config.plan().ranks.into_iter().find(|r| r.rank == 0);
    let (Some(rank0), Some((program, rest))) = (rank0, argv.split_first()) else {
        return Err("no rank 0 or no DOCTOR_VERSIONS_CMD".into());
    };
    let mut spec = rank0.container;
    spec.name = format!("{}-doctor-{}", spec.name, std::process::id());
    spec.labels.clear();
    spec.mounts.clear();
    spec.devices.clear();
    spec.gpus = sparkgate_config::Gpus::None;
    spec.entrypoint = vec![program.clone()];
    spec.cmd = rest.to_vec();
    let id = node.run(&spec, &[]).await.map_err(|e| e.to_string())?;
    let exit = node.wait_exit(&id).await;
    let out: Vec<_> = node.logs(&id, None).collect().await;
    let _ = node.kill_and_remove(&id).await;
    let text: String = out.iter().map(|b| String::from_utf8_lossy(b)).collect();
    let line = text.lines().rev().find(|l| l.contains("nccl=")).map(str::trim);
    match (exit.kind, line) {
        (Some(sparkgate_docker::ExitKind::Code(0)), Some(l)) => Ok(l.to_owned()),
        _ => Err(format!(
            "`{}` gave no versions line ({}): {}",
            argv.join(" "),
            exit.status,
            text.lines().last().unwrap_or("")
        )),
    }
}

/// The node's image and its versions (RUNTIME=docker, `sparkgate doctor`).
async fn image_and_versions(
    config: &Config,
    daemon: Result<Node, String>,
) -> (Result<String, String>, Option<Result<String, String>>) {
    let node = match daemon {
        Ok(n) => n,
        Err(e) => return (Err(format!("daemon: {e}")), None),
    };
    let id = image(&node, &config.serving.image).await;
    let v = match &id {
        Ok(_) => Some(versions(config, &node).await),
        Err(_) => None,
    };
    (id, v)
}

async fn head(config: &Config, depth: Depth) -> Seen {
    let facts = run(None, SCRIPT, &args(&ask(config, "head", None))).await;
    let (image, versions) = match images(config, depth) {
        true => {
            let daemon = Node::local("head", &config.supervision.docker_socket).await;
            let (i, v) = image_and_versions(config, daemon.map_err(|e| e.to_string())).await;
            (Some(i), v)
        }
        false => (None, None),
    };
    Seen {
        node: "head".into(),
        unreachable: facts.as_ref().err().cloned(),
        facts: facts.ok().map(|t| Facts::parse(&t)),
        image,
        versions,
        ..Seen::default()
    }
}

async fn worker(config: &Config, w: &sparkgate_config::Worker, depth: Depth) -> Seen {
    let target = sparkgate_prepare::verify::ssh_target(config, w);
    let mut seen = Seen {
        node: w.label.clone(),
        ..Seen::default()
    };
    let node = match Node::ssh_only(&w.label, &target).await {
        Ok(n) => n,
        Err(e) => {
            seen.unreachable = Some(e.to_string());
            return seen;
        }
    };
    let a = ask(config, &w.label, Some(w));
    seen.facts = run(Some(&node), SCRIPT, &args(&a)).await.ok().map(|t| Facts::parse(&t));
    seen.clock = clock(&node, &a.root).await;
    if images(config, depth) {
        let daemon = Node::over_ssh(&w.label, &target).await.map_err(|e| e.to_string());
        let (i, v) = image_and_versions(config, daemon).await;
        seen.image = Some(i);
        seen.versions = v;
    }
    seen
}

/// `read`, or a node that did not answer within NODE_LIMIT.
async fn bounded(label: String, read: impl std::future::Future<Output = Seen>) -> Seen {
    tokio::time::timeout(NODE_LIMIT, read).await.unwrap_or_else(|_| Seen {
        node: label,
        unreachable: Some(format!("no answer within {} s", NODE_LIMIT.as_secs())),
        ..Seen::default()
    })
}

/// Every node, read at once (the head first).
pub(crate) async fn nodes(config: &Config, depth: Depth) -> Vec<Seen> {
    let head = bounded("head".into(), head(config, depth));
    let workers = config
        .nodes
        .remote_workers()
        .map(|w| bounded(w.label.clone(), worker(config, w, depth)));
    let (head, workers) = tokio::join!(head, futures_util::future::join_all(workers));
    std::iter::once(head).chain(workers).collect()
}

/// What the rows are judged against.
pub(crate) fn limits(config: &Config) -> Limits {
    let s = &config.supervision;
    let head = config.nodes.head_ip;
    let mut ports = vec![
        ("PORT".to_owned(), config.ports.public, IpAddr::from([0, 0, 0, 0])),
        ("VLLM_PORT".to_owned(), config.ports.vllm, IpAddr::from([127, 0, 0, 1])),
    ];
    if config.serving.nnodes > 1 {
        let ip = if head.is_loopback() {
            head
        } else {
            IpAddr::from([0, 0, 0, 0])
        };
        ports.push(("MASTER_PORT".to_owned(), config.ports.master, ip));
    }
    Limits {
        memory_gib: s.weights_gib_per_rank.zip(s.boot_margin_gib).map(|(w, m)| w + m),
        min_free_disk_gib: s.min_free_disk_gib,
        max_skew_s: s.doctor_max_skew.as_secs_f64(),
        ports: ports
            .into_iter()
            .map(|(name, port, ip)| {
                let free = TcpListener::bind((ip, port)).is_ok();
                (name, port, free)
            })
            .collect(),
        image: config.serving.image.clone(),
        loopback: head.is_loopback(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glm(dir: &std::path::Path) -> Config {
        let env = [
            ("DEPLOY_DIR", dir.to_str().unwrap()),
            ("HF_HOME", "/srv/hf/"),
            ("HEAD_IP", "127.0.0.1"),
            ("WORKER_IP", "127.0.0.1"),
        ];
        Config::load(&sparkgate_config::LoadOptions {
            profile: Some("glm-5.3-flash".into()),
            process_env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            working_dir: dir.to_path_buf(),
            ..Default::default()
        })
        .expect("a GLM configuration")
    }

    #[test]
    fn glm_weights_are_its_pinned_snapshot_and_the_links_into_the_blobs_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let config = glm(dir.path());
        let head = weights_dir(&config, None);
        assert!(
            head.starts_with("/srv/hf/hub/models--")
                && head.ends_with("/snapshots/25a44fdbf16862a46b7cc9921142c6c81350af2f"),
            "{head}"
        );
        // A Hugging Face cache: the snapshot's files are links into the blobs.
        let snapshot = dir.path().join("snapshot");
        std::fs::create_dir_all(dir.path().join("blobs")).unwrap();
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(dir.path().join("blobs/abc"), vec![0u8; 4096]).unwrap();
        std::os::unix::fs::symlink("../blobs/abc", snapshot.join("model-00001.safetensors")).unwrap();
        let ask = Ask {
            weights: snapshot.display().to_string(),
            ..ask(&config, "head", None)
        };
        let text = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(None, SCRIPT, &args(&ask)))
            .unwrap();
        assert!(text.contains("weight=model-00001.safetensors\t4096\n"), "{text}");
    }
}
