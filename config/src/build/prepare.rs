//! Node preparation settings: pulling, building and shipping the image, what `serve` prepares
//! before the first start, and the DeepSeek-only NFS share, ZFS datasets and Engram pack.

use std::path::PathBuf;

use super::Builder;
use crate::config::{EngramPack, NfsShare, Nodes, Preparation, ZfsDatasets};

impl Builder<'_> {
    pub(super) fn preparation(&mut self, nodes: &Nodes) -> Preparation {
        // The DeepSeek-only parts exist where the profile uses their knobs.
        let nfs = self.used("NFS_EXPORT_MODEL").then(|| NfsShare {
            server_ip: match self.opt_text("NFS_SERVER_IP") {
                Some(_) => self.ip("NFS_SERVER_IP"),
                None => nodes.head_ip,
            },
            export_model: self.text("NFS_EXPORT_MODEL"),
            export_engram: self.text("NFS_EXPORT_ENGRAM"),
            clients: self.opt_text("NFS_CLIENTS").unwrap_or_else(|| {
                let ips: Vec<String> = nodes.workers.iter().map(|w| w.ip.to_string()).collect();
                ips.join(",")
            }),
        });
        let zfs = self.used("ZFS_HEAD_MODEL_DS").then(|| ZfsDatasets {
            head_model: self.text("ZFS_HEAD_MODEL_DS"),
            worker_model: self.text("ZFS_WORKER_MODEL_DS"),
        });
        let pack = self.used("PACK_CMD").then(|| EngramPack {
            head_dir: self.text("HEAD_PACKED_DIR"),
            worker_dir: self.text("WORKER_PACKED_DIR"),
            cmd: self.words("PACK_CMD"),
        });
        Preparation {
            pull: self.flag("PULL"),
            ghcr_registry: self.text("GHCR_REGISTRY"),
            build: self.flag("BUILD"),
            skip_pull: self.flag("SKIP_PULL"),
            skip_build: self.flag("SKIP_BUILD"),
            skip_ship: self.flag("SKIP_SHIP"),
            build_context: PathBuf::from(self.text("BUILD_CONTEXT")),
            dockerfile: self.text("DOCKERFILE"),
            ship: self.choice("IMAGE_SHIP"),
            ship_dir: PathBuf::from(self.text("IMAGE_SHIP_DIR")),
            worker_ship_dir: self.text("WORKER_IMAGE_SHIP_DIR"),
            ship_keep: self.flag("IMAGE_SHIP_KEEP"),
            ship_bwlimit_kib: self.num("IMAGE_SHIP_BWLIMIT"),
            skip_download: self.flag("SKIP_DOWNLOAD"),
            skip_sync: self.flag("SKIP_SYNC"),
            nfs,
            zfs,
            pack,
            drop_page_cache: self.used("DSV41_DROP_PAGE_CACHE") && self.flag("DSV41_DROP_PAGE_CACHE"),
        }
    }
}
