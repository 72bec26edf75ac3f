//! How the ranks run and are watched, their containers, and where weights and caches live.

use std::path::PathBuf;

use super::Builder;
use crate::config::{Containers, Storage, Supervision, Weights};
use crate::profile::ProfileId;

impl Builder<'_> {
    pub(super) fn supervision(&mut self) -> Supervision {
        Supervision {
            runtime: self.choice("RUNTIME"),
            docker_socket: self.text("DOCKER_SOCKET"),
            vllm_bin: self.text("VLLM_BIN"),
            log_dir: PathBuf::from(self.text("LOG_DIR")),
            min_free_disk_gib: self.opt_float("MIN_FREE_DISK_GIB"),
            log_keep_epochs: Some(self.num::<usize>("LOG_KEEP_EPOCHS")).filter(|n| *n > 0),
            log_keep_bytes: Some(self.num::<u64>("LOG_KEEP_BYTES")).filter(|n| *n > 0),
            backoff_initial: self.seconds_f64("RESTART_BACKOFF_INITIAL"),
            backoff_max: self.seconds_f64("RESTART_BACKOFF_MAX"),
            healthy_reset: self.seconds_f64("RESTART_HEALTHY_RESET"),
            restart_budget: self.num("RESTART_BUDGET"),
            stop_ranks_on_exit: self.flag("STOP_RANKS_ON_EXIT"),
            progress_timeout: self.seconds_f64("PROGRESS_TIMEOUT"),
            stall_timeout: self.seconds_f64("STALL_TIMEOUT"),
            ready_timeout: self.seconds("READY_TIMEOUT"),
            hang: self.seconds("HANG_SECONDS"),
            mem_guard: self.flag("MEM_GUARD"),
            ready_generate_probe: self.flag("READY_GENERATE_PROBE"),
            boot_shape_warmup: self.flag("BOOT_SHAPE_WARMUP"),
            self_check: if self.flag("SKIP_OVERLAY_VERIFY") {
                Vec::new()
            } else {
                self.words("SELF_CHECK_CMD")
            },
            mem_guard_gib: self.float("MEM_GUARD_GIB"),
            boot_margin_gib: self.opt_float("BOOT_MARGIN_GIB"),
            weights_gib_per_rank: self.opt_float("WEIGHTS_GIB_PER_RANK"),
            meminfo_path: PathBuf::from(self.text("MEMINFO_PATH")),
            node_root: self.text("NODE_ROOT"),
            doctor_versions_cmd: self.words("DOCTOR_VERSIONS_CMD"),
            doctor_max_skew: self.seconds_f64("DOCTOR_MAX_SKEW"),
        }
    }

    pub(super) fn containers(&mut self) -> Containers {
        let head_name = self.text("CONTAINER_HEAD");
        let worker_name = self.text("CONTAINER_WORKER");
        if head_name == worker_name {
            self.fail("CONTAINER_WORKER", "must differ from CONTAINER_HEAD");
        }
        Containers {
            head_name,
            worker_name,
            gpus: self.choice("RANK_GPUS"),
            memlock_unlimited: self.flag("RANK_MEMLOCK_UNLIMITED"),
            devices: self.list("RANK_DEVICES"),
            oom_score_adj: self.opt_num("OOM_SCORE_ADJ"),
        }
    }

    pub(super) fn storage(&mut self) -> Storage {
        let weights = match self.r.profile {
            ProfileId::Glm53Flash => Weights::Glm {
                hf_home: self.text("HF_HOME"),
                worker_hf_home: self.text("WORKER_HF_HOME"),
                model: self.text("MODEL"),
                revision: self.text("MODEL_REVISION"),
                cache_name: self.text("MODEL_CACHE_NAME"),
            },
            ProfileId::DeepSeekV41Flash => Weights::DeepSeek {
                model_host: self.text("MODEL_HOST"),
                engram_dir: self.text("ENGRAM_DIR"),
                engram_src: self.text("ENGRAM_SRC"),
                nfs_volume_model: self.text("NFS_VOLUME_MODEL"),
                nfs_volume_engram: self.text("NFS_VOLUME_ENGRAM"),
                worker_model_dir: self.text("WORKER_MODEL_DIR"),
                worker_engram_dir: self.text("WORKER_ENGRAM_DIR"),
                hf_model_repo: self.text("HF_MODEL_REPO"),
                hf_engram_repo: self.text("HF_ENGRAM_REPO"),
            },
        };
        Storage {
            weight_sync: self.choice("WEIGHT_SYNC"),
            cache_root: self.text("CACHE_ROOT"),
            triton_host_cache: self.text("TRITON_HOST_CACHE"),
            tilelang_host_cache: self.text("TILELANG_HOST_CACHE"),
            worker_vllm_cache: self.text("WORKER_VLLM_CACHE"),
            expected_shards: self.num("EXPECTED_SHARDS"),
            weights,
            auto_download: self.flag("AUTO_DOWNLOAD"),
            force_sync: self.flag("FORCE_SYNC"),
            hf_bin: self.text("HF_BIN"),
        }
    }
}
