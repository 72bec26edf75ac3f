//! The checks that compare nodes (the same kernel, driver, image, interface settings and
//! weights everywhere) and the ones each node passes alone (RoCE GID, clock, memory, disk).

use crate::model::{row, Check, Limits, Row, Seen, Verdict};

/// The nodes whose facts were read.
fn read(nodes: &[Seen]) -> impl Iterator<Item = (&Seen, &crate::facts::Facts)> {
    nodes.iter().filter_map(|n| n.facts.as_ref().map(|f| (n, f)))
}

/// `fact` equal on every node that has it: each node's row says what it has; a node that
/// differs from the head fails.
pub(crate) fn same(check: Check, nodes: &[Seen], fact: &str, fix: &str) -> Vec<Row> {
    let head = nodes.first().and_then(|n| n.facts.as_ref()).and_then(|f| f.get(fact));
    read(nodes)
        .map(|(n, f)| match (f.get(fact), head) {
            (None, _) => row(check, &n.node, Verdict::Skip, format!("no {fact} here"), ""),
            (Some(v), Some(h)) if v != h => row(check, &n.node, Verdict::Fail, format!("{v} (the head has {h})"), fix),
            (Some(v), _) => row(check, &n.node, Verdict::Pass, v, ""),
        })
        .collect()
}

/// The ranks' interface: up, and its MTU and speed the head's.
pub(crate) fn interface(limits: &Limits, nodes: &[Seen]) -> Vec<Row> {
    let head = nodes.first().and_then(|n| n.facts.as_ref());
    let mut rows = Vec::new();
    for (n, f) in read(nodes) {
        let Some(state) = f.get("if_state") else {
            rows.push(if limits.loopback {
                row(
                    Check::Interface,
                    &n.node,
                    Verdict::Skip,
                    "no such interface; the ranks use loopback here",
                    "",
                )
            } else {
                row(
                Check::Interface,
                &n.node,
                Verdict::Fail,
                "the interface does not exist",
                "set the node's interface (HEAD_CX7_IF / WORKER_CX7_IF) to the CX7 port the ranks use (ip -br link)",
            )
            });
            continue;
        };
        let (mtu, speed) = (f.get("if_mtu").unwrap_or("?"), f.get("if_speed").unwrap_or("?"));
        let found = format!("{state}, MTU {mtu}, {speed} Mb/s");
        let differs = |fact: &str| head.and_then(|h| h.get(fact)).is_some_and(|h| Some(h) != f.get(fact));
        let fail = |fix: String| row(Check::Interface, &n.node, Verdict::Fail, found.clone(), fix);
        rows.push(if state != "up" {
            fail("bring the link up (ip link set <if> up; check the cable and the switch port)".into())
        } else if differs("if_mtu") {
            fail(format!(
                "set the same MTU on both ends (ip link set <if> mtu {}; the head has it)",
                head.and_then(|h| h.get("if_mtu")).unwrap_or("?")
            ))
        } else if differs("if_speed") {
            fail("the link trained at another speed than the head's: reseat the cable, check the port's speed (ethtool <if>)".into())
        } else {
            row(Check::Interface, &n.node, Verdict::Pass, found.clone(), "")
        });
        rows.push(match f.get("peer") {
            Some("answers") => row(Check::Peer, &n.node, Verdict::Pass, "the peer answers ping", ""),
            Some("no_ping") => row(Check::Peer, &n.node, Verdict::Skip, "ping is not installed here", ""),
            Some(_) => row(
                Check::Peer,
                &n.node,
                Verdict::Fail,
                "the peer does not answer ping",
                "check the addresses (HEAD_IP, WORKER_IP), the link and any firewall between the nodes",
            ),
            None => row(Check::Peer, &n.node, Verdict::Skip, "no peer (one node)", ""),
        });
    }
    rows
}

/// What each node passes alone: the RoCE GID entry, the clock, memory and disk.
pub(crate) fn node_local(limits: &Limits, nodes: &[Seen]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (n, f) in read(nodes) {
        rows.push(match f.get("gid").filter(|_| nodes.len() > 1) {
            None => row(Check::RoceGid, &n.node, Verdict::Skip, "no RoCE device here", ""),
            Some(g) if g.chars().all(|c| c == '0' || c == ':') => row(
                Check::RoceGid,
                &n.node,
                Verdict::Fail,
                format!("GID entry empty ({g})"),
                "give the RoCE interface its IPv4 address (the GID index follows it) or set the node's NCCL_IB_GID_INDEX",
            ),
            Some(g) => row(Check::RoceGid, &n.node, Verdict::Pass, g, ""),
        });
        if let Some((skew, bound)) = n.clock {
            let found = format!("{:+.3} s (±{:.3} s)", skew, bound);
            rows.push(if skew.abs() - bound > limits.max_skew_s {
                row(
                    Check::Clock,
                    &n.node,
                    Verdict::Fail,
                    found,
                    format!(
                        "sync the clocks (chrony or systemd-timesyncd on both nodes); skew must stay under {} s",
                        limits.max_skew_s
                    ),
                )
            } else {
                row(Check::Clock, &n.node, Verdict::Pass, found, "")
            });
        }
        rows.push(memory(limits, &n.node, f));
        rows.push(disk(limits, &n.node, f));
    }
    rows
}

fn memory(limits: &Limits, node: &str, f: &crate::facts::Facts) -> Row {
    let avail = f.number("mem_available_kib").map(|k| k / (1024.0 * 1024.0));
    match (avail, limits.memory_gib) {
        (None, _) => row(Check::Memory, node, Verdict::Skip, "MemAvailable unreadable", ""),
        (Some(a), Some(need)) if a < need => row(
            Check::Memory,
            node,
            Verdict::Fail,
            format!("{a:.1} GiB available, a rank needs {need:.1} GiB"),
            "stop other workloads on the node (docker ps), or lower BOOT_MARGIN_GIB",
        ),
        (Some(a), _) => row(Check::Memory, node, Verdict::Pass, format!("{a:.1} GiB available"), ""),
    }
}

fn disk(limits: &Limits, node: &str, f: &crate::facts::Facts) -> Row {
    let free = f.number("disk_free_kib").map(|k| k / (1024.0 * 1024.0));
    match (free, limits.min_free_disk_gib) {
        (None, _) => row(Check::Disk, node, Verdict::Skip, "free space unreadable", ""),
        (Some(g), Some(min)) if g < min => row(
            Check::Disk,
            node,
            Verdict::Fail,
            format!("{g:.1} GiB free, MIN_FREE_DISK_GIB is {min}"),
            "free space under LOG_DIR (old epochs: LOG_KEEP_EPOCHS) or move LOG_DIR",
        ),
        (Some(g), _) => row(Check::Disk, node, Verdict::Pass, format!("{g:.1} GiB free"), ""),
    }
}

/// The weights: the same files with the same sizes as the head's.
pub(crate) fn weights(nodes: &[Seen]) -> Vec<Row> {
    let Some(head) = nodes.first().and_then(|n| n.facts.as_ref()) else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for (n, f) in read(nodes) {
        match f.get("weights") {
            None => continue,
            Some("absent") => {
                rows.push(row(
                    Check::Weights,
                    &n.node,
                    Verdict::Fail,
                    "the weights directory is missing",
                    "download the weights (sparkgate download) and sync them (sparkgate sync)",
                ));
                continue;
            }
            Some(_) => {}
        }
        let missing: Vec<&String> = head.weights.keys().filter(|p| !f.weights.contains_key(*p)).collect();
        let differ: Vec<&String> = head
            .weights
            .iter()
            .filter(|(p, size)| f.weights.get(*p).is_some_and(|s| s != *size))
            .map(|(p, _)| p)
            .collect();
        let bytes: u64 = f.weights.values().sum();
        rows.push(match (missing.first(), differ.first()) {
            (None, None) => row(
                Check::Weights,
                &n.node,
                Verdict::Pass,
                format!("{} files, {bytes} bytes", f.weights.len()),
                "",
            ),
            (Some(first), _) => row(
                Check::Weights,
                &n.node,
                Verdict::Fail,
                format!("{} of the head's files missing (first: {first})", missing.len()),
                "sync the weights to this node (sparkgate sync)",
            ),
            (None, Some(first)) => row(
                Check::Weights,
                &n.node,
                Verdict::Fail,
                format!("{} files differ in size from the head's (first: {first})", differ.len()),
                "sync the weights again (sparkgate sync --force): a copy was cut short",
            ),
        });
    }
    rows
}

/// The image: on every node (its daemon answers) with the head's digest, and the same versions
/// inside it.
pub(crate) fn images(limits: &Limits, nodes: &[Seen]) -> Vec<Row> {
    let head = nodes
        .first()
        .and_then(|n| n.image.as_ref())
        .and_then(|i| i.as_ref().ok());
    let mut rows = Vec::new();
    for n in nodes {
        let Some(image) = &n.image else { continue };
        match image {
            Err(why) if why.starts_with("daemon: ") => rows.push(row(
                Check::DockerDaemon,
                &n.node,
                Verdict::Fail,
                why.trim_start_matches("daemon: ").to_owned(),
                "start Docker on the node (systemctl start docker) and check its socket (DOCKER_SOCKET, WORKER_DOCKER_SOCKET)",
            )),
            Err(why) => {
                rows.push(row(Check::DockerDaemon, &n.node, Verdict::Pass, "answers", ""));
                rows.push(row(
                    Check::ImageDigest,
                    &n.node,
                    Verdict::Fail,
                    why.clone(),
                    format!("build or load {} on the node (sparkgate ship)", limits.image),
                ));
            }
            Ok(id) => {
                rows.push(row(Check::DockerDaemon, &n.node, Verdict::Pass, "answers", ""));
                let short = id.trim_start_matches("sha256:").chars().take(12).collect::<String>();
                rows.push(match head {
                    Some(h) if h != id => row(
                        Check::ImageDigest,
                        &n.node,
                        Verdict::Fail,
                        format!("{short} (the head has {})", h.trim_start_matches("sha256:").chars().take(12).collect::<String>()),
                        format!("ship the head's {} to the node (sparkgate ship)", limits.image),
                    ),
                    _ => row(Check::ImageDigest, &n.node, Verdict::Pass, short, ""),
                });
            }
        }
    }
    rows.extend(versions(nodes));
    rows
}

fn versions(nodes: &[Seen]) -> Vec<Row> {
    let head = nodes
        .first()
        .and_then(|n| n.versions.as_ref())
        .and_then(|v| v.as_ref().ok());
    nodes
        .iter()
        .filter_map(|n| n.versions.as_ref().map(|v| (n, v)))
        .map(|(n, v)| match (v, head) {
            (Err(why), _) => row(
                Check::ImageVersions,
                &n.node,
                Verdict::Fail,
                why.clone(),
                "check the image runs (docker run --rm <image> python3 -c 'import vllm')",
            ),
            (Ok(v), Some(h)) if v != h => row(
                Check::ImageVersions,
                &n.node,
                Verdict::Fail,
                format!("{v} (the head's: {h})"),
                "use one image everywhere (sparkgate ship); mismatched NCCL builds hang the group",
            ),
            (Ok(v), _) => row(Check::ImageVersions, &n.node, Verdict::Pass, v.clone(), ""),
        })
        .collect()
}
