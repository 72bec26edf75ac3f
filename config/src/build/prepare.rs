//! Node preparation settings: pulling, building and shipping the image, what `serve` prepares
//! before the first start, and the DeepSeek-only NFS share, ZFS datasets and Engram pack.

use std::path::PathBuf;

use super::words::shell_words;
use super::Builder;
use crate::config::{EngramPack, ImageShip, NfsShare, Nodes, Preparation, ZfsDatasets};
use crate::profile::ProfileId;

impl Builder<'_> {
    pub(super) fn preparation(&mut self, profile: ProfileId, nodes: &Nodes) -> Preparation {
        let deepseek = profile == ProfileId::DeepSeekV41Flash;
        let ship = match self.one_of("IMAGE_SHIP", &["auto", "stream", "staged"]) {
            "stream" => ImageShip::Stream,
            "staged" => ImageShip::Staged,
            _ => ImageShip::Auto,
        };
        let worker_ship_dir = self.non_empty("WORKER_IMAGE_SHIP_DIR");
        if !worker_ship_dir.starts_with('/') {
            self.fail("WORKER_IMAGE_SHIP_DIR", "must be an absolute path on the worker");
        }
        let nfs = deepseek.then(|| NfsShare {
            server_ip: match self.optional("NFS_SERVER_IP") {
                Some(_) => self.ip("NFS_SERVER_IP"),
                None => nodes.head_ip,
            },
            export_model: self.non_empty("NFS_EXPORT_MODEL"),
            export_engram: self.non_empty("NFS_EXPORT_ENGRAM"),
            clients: self
                .optional("NFS_CLIENTS")
                .unwrap_or_else(|| nodes.worker_ip.to_string()),
        });
        let zfs = deepseek.then(|| ZfsDatasets {
            head_model: self.non_empty("ZFS_HEAD_MODEL_DS"),
            worker_model: self.non_empty("ZFS_WORKER_MODEL_DS"),
        });
        let pack = deepseek.then(|| {
            let raw = self.non_empty("PACK_CMD");
            let cmd = shell_words(&raw).unwrap_or_else(|| {
                self.fail("PACK_CMD", "has an unterminated quote");
                Vec::new()
            });
            EngramPack {
                head_dir: self.non_empty("HEAD_PACKED_DIR"),
                worker_dir: self.non_empty("WORKER_PACKED_DIR"),
                cmd,
            }
        });
        Preparation {
            pull: self.flag("PULL"),
            ghcr_registry: self.non_empty("GHCR_REGISTRY"),
            build: self.flag("BUILD"),
            skip_pull: self.flag("SKIP_PULL"),
            skip_build: self.flag("SKIP_BUILD"),
            skip_ship: self.flag("SKIP_SHIP"),
            build_context: PathBuf::from(self.non_empty("BUILD_CONTEXT")),
            dockerfile: self.non_empty("DOCKERFILE"),
            ship,
            ship_dir: PathBuf::from(self.non_empty("IMAGE_SHIP_DIR")),
            worker_ship_dir,
            ship_keep: self.flag("IMAGE_SHIP_KEEP"),
            ship_bwlimit_kib: self.int("IMAGE_SHIP_BWLIMIT", 0..=100_000_000),
            skip_download: self.flag("SKIP_DOWNLOAD"),
            skip_sync: self.flag("SKIP_SYNC"),
            nfs,
            zfs,
            pack,
            drop_page_cache: deepseek && self.flag("DSV41_DROP_PAGE_CACHE"),
        }
    }
}
