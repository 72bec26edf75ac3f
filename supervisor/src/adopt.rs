//! Docker: what an earlier gateway left running. Containers of this group are adopted when
//! every rank is there, running, of one epoch and of a mode's configuration (config hash), and
//! rank 0 is ready — the model stays loaded. Anything else is removed, saying why.

use sparkgate_config::{labels, RankPlan, SpecMethod};
use sparkgate_docker::{ContainerInfo, Node};

use crate::start::Starter;

/// What was found.
#[derive(Debug)]
pub(crate) enum Found {
    Nothing,
    /// Leftovers were removed; the next epoch follows `epoch`.
    Stale {
        epoch: u64,
    },
    /// A complete ready group: each rank's plan, node and container id.
    Running {
        epoch: u64,
        mode: SpecMethod,
        containers: Vec<(RankPlan, Node, String)>,
    },
}

/// A container labelled with group and rank, and the node it is on.
type Listed = (u32, Node, ContainerInfo);

/// Every container of `group`, rank by rank; none when a node cannot be reached or listed (then
/// nothing is adopted or removed).
async fn list(starter: &Starter, group: &str) -> Option<Vec<Listed>> {
    let mut found = Vec::new();
    let ranks: Vec<u32> = starter.modes[0].plan.ranks.iter().map(|r| r.rank).collect();
    for rank in ranks {
        let node = match starter.backend.node_for(rank).await {
            Some(Ok(n)) => n,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot reach a node to look for running ranks");
                return None;
            }
            None => return None,
        };
        match node
            .list(&[(labels::GROUP, group), (labels::RANK, &rank.to_string())])
            .await
        {
            Ok(list) => found.extend(list.into_iter().map(|c| (rank, node.clone(), c))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list existing rank containers");
                return None;
            }
        }
    }
    Some(found)
}

/// Removes every container `found`, saying why.
async fn remove(found: &[Listed], reason: String) {
    sparkgate_events::Event::NotAdopted { reason }.emit();
    for (_, node, c) in found {
        let _ = node.kill_and_remove(&c.id).await;
    }
}

/// A standby group's leftovers removed, whatever they are; the last epoch among them.
pub(crate) async fn clear(starter: &Starter, group: &str) -> Option<u64> {
    let found = list(starter, group).await.filter(|f| !f.is_empty())?;
    let epoch = found
        .iter()
        .filter_map(|(_, _, c)| c.labels.get(labels::EPOCH)?.parse::<u64>().ok())
        .max();
    let reason = format!(
        "{} container(s) of group {group}, which is not the model loaded at start",
        found.len()
    );
    remove(&found, reason).await;
    epoch
}

/// Adopts the group's running containers when they are a complete, ready epoch of one mode's
/// configuration; removes them otherwise.
pub(crate) async fn find(starter: &Starter, group: &str) -> Found {
    let found = match list(starter, group).await {
        Some(found) if !found.is_empty() => found,
        _ => return Found::Nothing,
    };
    let epoch = found
        .iter()
        .filter_map(|(_, _, c)| c.labels.get(labels::EPOCH)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let epoch_label = epoch.to_string();
    // A group an operator (or the policy) switched to another mode runs that mode's plan.
    let running_hash = found
        .iter()
        .find(|(r, _, c)| *r == 0 && c.labels.get(labels::EPOCH) == Some(&epoch_label))
        .and_then(|(_, _, c)| c.labels.get(labels::CONFIG_HASH).cloned());
    let mode = starter
        .modes
        .iter()
        .find(|m| Some(&m.plan.config_hash) == running_hash.as_ref())
        .unwrap_or(&starter.modes[0]);
    let of_plan = |rank: u32| {
        found.iter().find(|(r, _, c)| {
            *r == rank
                && c.labels.get(labels::EPOCH) == Some(&epoch_label)
                && c.labels.get(labels::CONFIG_HASH) == Some(&mode.plan.config_hash)
                && c.running
        })
    };
    let complete = mode.plan.ranks.iter().all(|r| of_plan(r.rank).is_some());
    let why_not = if !complete {
        Some(format!(
            "found {} container(s) of group {group} that are not a running epoch of this configuration (config hash {})",
            found.len(),
            mode.plan.config_hash
        ))
    } else if !starter.probe.ready().await {
        Some("rank 0 of the running group is not ready".to_owned())
    } else {
        None
    };
    if let Some(reason) = why_not {
        remove(&found, reason).await;
        return Found::Stale { epoch };
    }
    let containers = mode
        .plan
        .ranks
        .iter()
        .map(|plan| {
            let (_, node, c) = of_plan(plan.rank).expect("checked complete");
            (plan.clone(), node.clone(), c.id.clone())
        })
        .collect();
    Found::Running {
        epoch,
        mode: mode.mode,
        containers,
    }
}
