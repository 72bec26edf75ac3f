//! The Engram pack (DeepSeek, optional): the image's packer run once per node as a throwaway
//! container with that node's rank (`--rank R --tp TP`), reading the Engram shards and writing
//! `engram-l{1,14}-r<R>of<TP>.bin` into the node's packed directory. A rank whose files exist is
//! skipped; when they exist the launch plan mounts them (see [`packed_ranks`]).

use futures_util::StreamExt;
use sparkgate_config::{Config, ContainerSpec, EngramPack, LaunchPlan, Mount, NodeRole, WeightSync, Weights};
use sparkgate_docker::Node;

use crate::progress::Report;
use crate::sync::quote;
use crate::verify::Remote;
use crate::PrepareError;

/// What [`pack`] did for one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packed {
    AlreadyPacked,
    Packed,
}

/// The packed layers a rank's files cover.
const PACKED_LAYERS: [u32; 2] = [1, 14];

fn packed_file(dir: &str, layer: u32, rank: u32, tp: u32) -> String {
    format!("{}/engram-l{layer}-r{rank}of{tp}.bin", dir.trim_end_matches('/'))
}

/// Present while `sparkgate pack` runs a rank: a pack cut half-way (one layer written, or one
/// partly) is not taken for a finished one.
fn in_progress(dir: &str, rank: u32, tp: u32) -> String {
    format!("{}/.sparkgate-packing-r{rank}of{tp}", dir.trim_end_matches('/'))
}

/// Where `rank`'s packed files live: HEAD_PACKED_DIR for rank 0, WORKER_PACKED_DIR on its worker.
fn packed_dir(config: &Config, rank: u32) -> Option<String> {
    let pack = config.preparation.pack.as_ref()?;
    Some(match config.nodes.worker(rank) {
        None => pack.head_dir.clone(),
        Some(w) => w.path(&pack.worker_dir),
    })
}

/// Every layer's file is there and no pack of this rank was cut short.
async fn is_packed(node: &Node, dir: &str, rank: u32, tp: u32) -> Result<bool, PrepareError> {
    let files: Vec<String> = PACKED_LAYERS
        .iter()
        .map(|l| format!("[ -s {} ]", quote(&packed_file(dir, *l, rank, tp))))
        .collect();
    let out = node
        .shell(&format!(
            "if {} && [ ! -e {} ]; then echo yes; else echo no; fi",
            files.join(" && "),
            quote(&in_progress(dir, rank, tp))
        ))
        .await?;
    Ok(out.trim() == "yes")
}

/// Each rank with its role and the node it runs on: rank 0 on the head, rank r on its worker's
/// daemon (`remotes`) — or on the head too when that worker is this machine.
pub fn rank_nodes<'a>(config: &Config, head: &'a Node, remotes: &'a [Remote]) -> Vec<(u32, NodeRole, &'a Node)> {
    let mut nodes = vec![(0, NodeRole::Head, head)];
    for w in &config.nodes.workers {
        let node = remotes
            .iter()
            .find(|r| r.worker.rank == w.rank)
            .map_or(head, |r| &r.node);
        nodes.push((w.rank, NodeRole::Worker, node));
    }
    nodes
}

/// Ranks (with their node's packed directory) whose packed files exist: the plan mounts those.
pub async fn packed_ranks(
    config: &Config,
    nodes: &[(u32, NodeRole, &Node)],
) -> Result<Vec<(u32, String)>, PrepareError> {
    let mut out = Vec::new();
    for (rank, _, node) in nodes {
        if let Some(dir) = packed_dir(config, *rank) {
            if is_packed(node, &dir, *rank, config.serving.tp).await? {
                out.push((*rank, dir));
            }
        }
    }
    Ok(out)
}

/// Packs every rank whose files are missing, all nodes at once; the packer's output is relayed
/// line by line with the node's name.
pub async fn pack(
    config: &Config,
    nodes: &[(u32, NodeRole, &Node)],
    report: &dyn Report,
) -> Result<Vec<(u32, Packed)>, PrepareError> {
    let Some(pack) = &config.preparation.pack else {
        return Err(PrepareError::Local(format!(
            "profile {} has no Engram pack",
            config.profile
        )));
    };
    let run = PackRun {
        config,
        plan: config.plan(),
        pack,
        report,
    };
    let jobs = nodes.iter().map(|(rank, role, node)| run.rank(*rank, *role, node));
    futures_util::future::join_all(jobs).await.into_iter().collect()
}

/// What every rank's pack shares: the configuration, its launch plan (whose rank containers
/// the packer's containers copy), the packer command, and where progress is reported.
struct PackRun<'a> {
    config: &'a Config,
    plan: LaunchPlan,
    pack: &'a EngramPack,
    report: &'a dyn Report,
}

impl PackRun<'_> {
    /// Packs `rank` on `node` unless its files are there: the in-progress marker first, the
    /// packer's container, then the marker removed once every file is.
    async fn rank(&self, rank: u32, role: NodeRole, node: &Node) -> Result<(u32, Packed), PrepareError> {
        let (config, tp) = (self.config, self.config.serving.tp);
        let dir = &packed_dir(config, rank).expect("pack is configured");
        if is_packed(node, dir, rank, tp).await? {
            self.report.line(&format!(
                "pack rank {rank} ({}): {} exists; skipped",
                node.name(),
                packed_file(dir, PACKED_LAYERS[0], rank, tp)
            ));
            return Ok((rank, Packed::AlreadyPacked));
        }
        node.shell(&format!(
            "mkdir -p {d} && : > {p}",
            d = quote(dir),
            p = quote(&in_progress(dir, rank, tp))
        ))
        .await?;
        if role == NodeRole::Worker && config.storage.weight_sync == WeightSync::Nfs {
            // Docker would create a missing volume empty and the packer would read nothing.
            crate::share::ensure_worker_volumes(config, node).await?;
        }
        let spec = self.packer(rank, dir)?;
        self.report.line(&format!(
            "pack rank {rank} ({}): running {}",
            node.name(),
            self.pack.cmd.join(" ")
        ));
        let (status, tail) = self.run_packer(node, &spec).await?;
        if status == "exit status: 0" {
            node.shell(&format!("rm -f {}", quote(&in_progress(dir, rank, tp))))
                .await?;
        }
        if status != "exit status: 0" || !is_packed(node, dir, rank, tp).await? {
            return Err(PrepareError::Local(format!(
                "pack rank {rank} ({}) failed ({status}); last lines:\n{}",
                node.name(),
                tail.iter().rev().take(20).rev().cloned().collect::<Vec<_>>().join("\n")
            )));
        }
        self.report.line(&format!("pack rank {rank} ({}): done", node.name()));
        Ok((rank, Packed::Packed))
    }

    /// The packer's container for `rank`: the rank's own container (image, devices,
    /// environment) running the pack command over the Engram shards, writing into `dir`.
    fn packer(&self, rank: u32, dir: &str) -> Result<ContainerSpec, PrepareError> {
        let (config, tp) = (self.config, self.config.serving.tp);
        let rank_plan = self
            .plan
            .ranks
            .iter()
            .find(|r| r.rank == rank)
            .ok_or_else(|| PrepareError::Local(format!("the launch plan has no rank {rank}")))?;
        let mut spec = rank_plan.container.clone();
        spec.name = format!("{}-pack", spec.name);
        spec.labels.clear();
        spec.entrypoint = self.pack.cmd[..1].to_vec();
        spec.cmd = self.pack.cmd[1..].to_vec();
        spec.cmd.extend(
            [
                "--model",
                "/models",
                "--rank",
                &rank.to_string(),
                "--tp",
                &tp.to_string(),
                "--out",
                "/engram",
            ]
            .map(str::to_owned),
        );
        let source = engram_source(config, rank)
            .ok_or_else(|| PrepareError::Local(format!("profile {} has no Engram shards", config.profile)))?;
        spec.mounts = vec![
            source,
            Mount::Bind {
                source: dir.to_owned(),
                target: "/engram".into(),
                read_only: false,
            },
        ];
        spec.env.retain(|(k, _)| k != "DSV41_PACKED_DIR");
        Ok(spec)
    }

    /// Runs the packer's container to its end, relaying its output line by line: its exit
    /// status and every line it wrote.
    async fn run_packer(&self, node: &Node, spec: &ContainerSpec) -> Result<(String, Vec<String>), PrepareError> {
        let id = node.run(spec, &[]).await?;
        let mut logs = std::pin::pin!(node.logs(&id, None));
        let name = node.name().to_owned();
        let relay = async {
            let mut pending = Vec::new();
            let mut tail = Vec::new();
            while let Some(chunk) = logs.next().await {
                pending.extend_from_slice(&chunk);
                while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=pos).collect();
                    let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                    self.report.line(&format!("  [{name}] {line}"));
                    tail.push(line);
                }
            }
            tail
        };
        let (status, tail) = tokio::join!(node.wait_exit(&id), relay);
        let _ = node.kill_and_remove(&id).await;
        Ok((status.status, tail))
    }
}

/// The Engram shards as the node's packer reads them at /models.
fn engram_source(config: &Config, rank: u32) -> Option<Mount> {
    let Weights::DeepSeek {
        engram_src,
        nfs_volume_engram,
        worker_engram_dir,
        ..
    } = &config.storage.weights
    else {
        return None;
    };
    Some(match config.nodes.worker(rank) {
        None => Mount::Bind {
            source: engram_src.clone(),
            target: "/models".into(),
            read_only: true,
        },
        Some(_) if config.storage.weight_sync == WeightSync::Nfs => Mount::Volume {
            name: nfs_volume_engram.clone(),
            target: "/models".into(),
            read_only: true,
        },
        Some(w) => Mount::Bind {
            source: w.path(worker_engram_dir),
            target: "/models".into(),
            read_only: true,
        },
    })
}
