//! Each node's MemAvailable read on demand, whatever the group's state (a stopped group has no
//! watch): what a swap between models compares before a load and after an unload.

use std::path::PathBuf;
use std::sync::Arc;

use crate::rank::Backend;
use crate::status::NodeMemory;

/// The nodes of a group, as their memory is read.
#[derive(Debug)]
pub(crate) struct Nodes {
    backend: Arc<Backend>,
    /// MEMINFO_PATH: the head's (a worker's is read over SSH from its /proc/meminfo).
    meminfo: PathBuf,
}

impl Nodes {
    pub(crate) fn new(backend: Arc<Backend>, meminfo: PathBuf) -> Self {
        Self { backend, meminfo }
    }

    /// The head first, then each worker on another machine; `None` where it could not be read.
    pub(crate) async fn read(&self) -> Vec<NodeMemory> {
        let mut out = vec![NodeMemory {
            node: "head".to_owned(),
            mem_available_gib: crate::preflight::mem_available_gib(&self.meminfo),
        }];
        for link in self.backend.workers() {
            let read = match link.node().await {
                Ok(node) => node.mem_available_gib(&self.meminfo).await,
                Err(_) => None,
            };
            out.push(NodeMemory {
                node: link.label.clone(),
                mem_available_gib: read,
            });
        }
        out
    }
}
