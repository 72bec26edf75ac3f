//! What a complete weight tree looks like per profile, and what is missing from the head's copy:
//! DeepSeek — `MODEL_HOST` with `config.json`, EXPECTED_SHARDS `model-*.safetensors` (and every
//! shard its index names) plus the Engram subset (original shards 47 and 48, their index and
//! config); GLM — the pinned revision's snapshot in the HF cache with EXPECTED_SHARDS shards, and
//! the DFlash2 draft model when a dflash mode is configured.

use std::path::{Path, PathBuf};

use sparkgate_config::{Config, SpecMethod, Weights};

/// The Engram files the DeepSeek launcher needs from the original checkpoint.
pub const ENGRAM_FILES: [&str; 4] = [
    "model-00047-of-00048.safetensors",
    "model-00048-of-00048.safetensors",
    "model.safetensors.index.json",
    "config.json",
];

/// How to fetch one tree with the Hugging Face CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub repo: String,
    pub revision: Option<String>,
    /// Only these files (`--include`); empty = the whole repository.
    pub include: Vec<String>,
    /// `--local-dir` (DeepSeek's plain directories); `None` = into the HF cache.
    pub local_dir: Option<PathBuf>,
    /// `HF_HOME` for the command (GLM's cache on the head).
    pub hf_home: Option<PathBuf>,
    pub max_workers: Option<u32>,
}

/// One weight tree on the head and what it lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub name: &'static str,
    pub dir: PathBuf,
    /// Human-readable gaps; empty when complete.
    pub missing: Vec<String>,
    pub fetch: Fetch,
}

impl Tree {
    pub fn complete(&self) -> bool {
        self.missing.is_empty()
    }
}

/// Checks every tree the configuration needs on the head.
pub fn check(config: &Config) -> Vec<Tree> {
    let expected = config.storage.expected_shards as usize;
    match &config.storage.weights {
        Weights::DeepSeek {
            model_host,
            engram_dir,
            hf_model_repo,
            hf_engram_repo,
            ..
        } => vec![
            deepseek_model(PathBuf::from(model_host), hf_model_repo, expected),
            engram(PathBuf::from(engram_dir), hf_engram_repo),
        ],
        Weights::Glm {
            hf_home,
            model,
            revision,
            cache_name,
            ..
        } => {
            let home = PathBuf::from(hf_home);
            let snapshot = home.join("hub").join(cache_name).join("snapshots").join(revision);
            let mut trees = vec![Tree {
                name: "model",
                missing: shard_gaps(&snapshot, "", expected),
                fetch: Fetch {
                    repo: model.clone(),
                    revision: Some(revision.clone()),
                    include: Vec::new(),
                    local_dir: None,
                    hf_home: Some(home.clone()),
                    max_workers: Some(8),
                },
                dir: snapshot,
            }];
            let dflash = config.speculation.modes.iter().any(|m| m.method == SpecMethod::Dflash);
            if let (true, Some(draft)) = (dflash, &config.speculation.dflash) {
                trees.push(dflash_draft(home, &draft.repo));
            }
            trees
        }
    }
}

/// DeepSeek's model directory (MODEL_HOST), fetched whole into it.
fn deepseek_model(model: PathBuf, repo: &str, expected: usize) -> Tree {
    Tree {
        name: "model",
        missing: model_gaps(&model, expected),
        fetch: Fetch {
            repo: repo.to_owned(),
            revision: None,
            include: Vec::new(),
            local_dir: Some(model.clone()),
            hf_home: None,
            max_workers: Some(8),
        },
        dir: model,
    }
}

/// DeepSeek's Engram subset of the original checkpoint (ENGRAM_FILES), fetched file by file.
fn engram(engram: PathBuf, repo: &str) -> Tree {
    Tree {
        name: "engram",
        missing: ENGRAM_FILES
            .iter()
            .filter(|f| !non_empty_file(&engram.join(f)))
            .map(|f| format!("{f} is missing or empty"))
            .collect(),
        fetch: Fetch {
            repo: repo.to_owned(),
            revision: None,
            include: ENGRAM_FILES.iter().map(|f| (*f).to_owned()).collect(),
            local_dir: Some(engram.clone()),
            hf_home: None,
            max_workers: None,
        },
        dir: engram,
    }
}

/// GLM's DFlash2 draft model in the HF cache under `home`: complete when any snapshot holds
/// its `model.safetensors`.
fn dflash_draft(home: PathBuf, repo: &str) -> Tree {
    let snapshots = home.join("hub").join(cache_dir_name(repo)).join("snapshots");
    let has_model = std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| non_empty_file(&e.path().join("model.safetensors")));
    Tree {
        name: "dflash draft",
        missing: if has_model {
            Vec::new()
        } else {
            vec!["no snapshot holds model.safetensors".to_owned()]
        },
        fetch: Fetch {
            repo: repo.to_owned(),
            revision: None,
            include: Vec::new(),
            local_dir: None,
            hf_home: Some(home),
            max_workers: None,
        },
        dir: snapshots,
    }
}

/// `models--org--name`, the HF cache's directory for a repository.
pub fn cache_dir_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

fn non_empty_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > 0)
}

/// DeepSeek's model directory: config, shard count, and the shards its index names.
fn model_gaps(dir: &Path, expected: usize) -> Vec<String> {
    let mut gaps = Vec::new();
    if !non_empty_file(&dir.join("config.json")) {
        gaps.push("config.json is missing or empty".to_owned());
    }
    gaps.extend(shard_gaps(dir, "model-", expected));
    if let Ok(index) = std::fs::read_to_string(dir.join("model.safetensors.index.json")) {
        let mut named: Vec<String> = index_shards(&index);
        named.sort();
        named.dedup();
        let absent: Vec<&String> = named.iter().filter(|f| !non_empty_file(&dir.join(f))).collect();
        if !absent.is_empty() {
            gaps.push(format!(
                "{} shard(s) named by model.safetensors.index.json are missing or empty (first: {})",
                absent.len(),
                absent[0]
            ));
        }
    }
    gaps
}

/// Counts `PREFIX*.safetensors` files (non-empty) against the expected number.
fn shard_gaps(dir: &Path, prefix: &str, expected: usize) -> Vec<String> {
    let entries: Vec<std::fs::DirEntry> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.flatten().collect(),
        Err(_) => {
            return vec![format!(
                "{} does not exist (0 of {expected} {prefix}*.safetensors shards present)",
                dir.display()
            )]
        }
    };
    let shards = entries
        .iter()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(prefix) && name.ends_with(".safetensors") && non_empty_file(&e.path())
        })
        .count();
    if shards < expected {
        vec![format!("{shards} of {expected} {prefix}*.safetensors shards present")]
    } else {
        Vec::new()
    }
}

/// The shard file names in a safetensors index's `weight_map` (values), without a JSON parser:
/// every quoted string ending in `.safetensors`.
fn index_shards(index: &str) -> Vec<String> {
    index
        .split('"')
        .filter(|s| s.ends_with(".safetensors") && !s.contains(['/', '\\']))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_shards_are_the_quoted_safetensors_names() {
        let index = r#"{"metadata":{"total_size":1},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
        assert_eq!(
            index_shards(index),
            ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        );
    }

    #[test]
    fn a_shard_count_below_the_expected_one_is_a_gap_and_empty_files_do_not_count() {
        let dir = tempfile::tempdir().unwrap();
        for i in 1..=3 {
            std::fs::write(dir.path().join(format!("model-{i:05}.safetensors")), b"x").unwrap();
        }
        std::fs::write(dir.path().join("model-00004.safetensors"), b"").unwrap();
        assert_eq!(
            shard_gaps(dir.path(), "model-", 4),
            ["3 of 4 model-*.safetensors shards present"]
        );
        assert!(shard_gaps(dir.path(), "model-", 3).is_empty());
        assert_eq!(
            shard_gaps(&dir.path().join("absent"), "", 1),
            [format!(
                "{} does not exist (0 of 1 *.safetensors shards present)",
                dir.path().join("absent").display()
            )]
        );
    }

    #[test]
    fn cache_dir_names_follow_the_hub_layout() {
        assert_eq!(
            cache_dir_name("incoai/GLM-5.3-Flash-DFlash2"),
            "models--incoai--GLM-5.3-Flash-DFlash2"
        );
    }
}
