//! The one pure judge: what each node was seen to be (`Seen`: reached or not, its facts, its
//! clock, its image) in, a row per check and node out — its verdict, what was found and what to
//! do. No I/O here (`gather.rs` does it), so every check is unit-tested with made-up facts.

use crate::model::{row, Check, Limits, Row, Seen, Verdict};

/// Every check's rows: the head is `nodes[0]`.
pub(crate) fn judge(limits: &Limits, nodes: &[Seen]) -> Vec<Row> {
    let mut rows = Vec::new();
    for n in nodes.iter().skip(1) {
        rows.push(match &n.unreachable {
            None => row(Check::Ssh, &n.node, Verdict::Pass, "the session opens", ""),
            Some(why) => row(
                Check::Ssh,
                &n.node,
                Verdict::Fail,
                why.clone(),
                "check WORKER_SSH_KEY, the worker's authorized_keys and SSH_KNOWN_HOSTS_FILE (ssh -o BatchMode=yes to it must work)",
            ),
        });
    }
    rows.extend(crate::compare::images(limits, nodes));
    rows.extend(crate::compare::same(
        Check::Kernel,
        nodes,
        "kernel",
        "install the same kernel on every node (uname -r) and reboot",
    ));
    rows.extend(crate::compare::same(
        Check::Driver,
        nodes,
        "driver",
        "install the same NVIDIA driver on every node (cat /proc/driver/nvidia/version)",
    ));
    // The link and RoCE matter between nodes: a group on one machine does not use them.
    if nodes.len() > 1 {
        rows.extend(crate::compare::interface(limits, nodes));
    }
    rows.extend(crate::compare::node_local(limits, nodes));
    rows.extend(crate::compare::weights(nodes));
    for (name, port, free) in &limits.ports {
        rows.push(if *free {
            row(Check::Ports, "head", Verdict::Pass, format!("{name}={port} free"), "")
        } else {
            row(
                Check::Ports,
                "head",
                Verdict::Fail,
                format!("{name}={port} is in use"),
                format!("stop what holds it (`ss -ltnp 'sport = :{port}'`) or choose another {name}"),
            )
        });
    }
    rows.sort_by_key(|r| r.check);
    rows
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod tests;
