//! IMAGE on the head: use it when present, pull it from its registry (PULL=1, or missing), or
//! build it from BUILD_CONTEXT (BUILD=1, or missing and not pullable) with a recipe-stamp label so
//! an unchanged recipe is never rebuilt.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sparkgate_config::Config;
use sparkgate_docker::{ImageIdentity, Node};

use crate::progress::{human_bytes, Report};
use crate::PrepareError;

/// The label a built image carries: the hash of the recipe it was built from.
pub const RECIPE_STAMP_LABEL: &str = "sparkgate.recipe.stamp";

/// What [`ensure_on_head`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadImage {
    Present,
    Pulled,
    Built { stamp: String },
}

/// Files that never belong to a recipe (caches, compiled artefacts, VCS data).
fn ignored(rel: &Path) -> bool {
    rel.components().any(|c| {
        let c = c.as_os_str().to_string_lossy();
        matches!(c.as_ref(), ".git" | "__pycache__" | "target" | "logs") || c.ends_with(".pyc") || c.ends_with(".so")
    })
}

/// Every regular file under `dir` (relative paths, sorted), ignored files left out.
fn recipe_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            if ignored(&rel) {
                continue;
            }
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(rel);
            } else if kind.is_file() {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// sha256 over each file's relative path and content hash, in path order: any edit, addition or
/// removal in the build context changes it, and nothing else does (not mtimes, not caches).
pub fn recipe_stamp(context: &Path) -> Result<String, PrepareError> {
    let io = |e: std::io::Error| PrepareError::Recipe(format!("{}: {e}", context.display()));
    let mut all = Sha256::new();
    for rel in recipe_files(context).map_err(io)? {
        let content = std::fs::read(context.join(&rel)).map_err(io)?;
        all.update(rel.to_string_lossy().as_bytes());
        all.update([0]);
        all.update(Sha256::digest(&content));
    }
    Ok(hex(&all.finalize())[..16].to_owned())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The build context as a tar (the Docker API's build input).
fn context_tar(context: &Path) -> Result<Vec<u8>, PrepareError> {
    let io = |e: std::io::Error| PrepareError::Recipe(format!("{}: {e}", context.display()));
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(true);
    for rel in recipe_files(context).map_err(io)? {
        builder.append_path_with_name(context.join(&rel), &rel).map_err(io)?;
    }
    builder.into_inner().map_err(io)
}

/// Whether IMAGE names a registry (`host/…` or `org/…`), which `docker pull` can fetch.
fn pullable(image: &str) -> bool {
    image.contains('/')
}

/// Preflight: fails when IMAGE is missing on the head and can be neither pulled (SKIP_PULL=1 or
/// no registry in the name) nor built (SKIP_BUILD=1 or no Dockerfile) — a start could not succeed.
pub async fn obtainable_on_head(config: &Config, head: &Node) -> Result<(), PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    let dockerfile = p.build_context.join(&p.dockerfile);
    let can_pull = pullable(image) && !p.skip_pull;
    let can_build = !p.skip_build && dockerfile.is_file();
    if can_pull || can_build || head.image_identity(image).await?.is_some() {
        return Ok(());
    }
    Err(PrepareError::NoImage {
        image: image.clone(),
        why: format!(
            "the head's daemon does not have it, it cannot be pulled ({}) and there is nothing to build it from ({})",
            if p.skip_pull {
                "SKIP_PULL=1"
            } else {
                "no registry in the name"
            },
            if p.skip_build {
                "SKIP_BUILD=1".to_owned()
            } else {
                format!("no {}", dockerfile.display())
            }
        ),
    })
}

/// Makes IMAGE present on the head and returns its identity.
pub async fn ensure_on_head(config: &Config, head: &Node, report: &dyn Report) -> Result<ImageIdentity, PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    let present = head.image_identity(image).await?;
    let dockerfile = p.build_context.join(&p.dockerfile);
    let can_build = !p.skip_build && dockerfile.is_file();
    let outcome = if p.build && !p.skip_build {
        if !dockerfile.is_file() {
            return Err(PrepareError::Recipe(format!(
                "BUILD=1 but {} does not exist; set BUILD_CONTEXT/DOCKERFILE",
                dockerfile.display()
            )));
        }
        let stamp = recipe_stamp(&p.build_context)?;
        match &present {
            Some(id) if id.labels.get(RECIPE_STAMP_LABEL) == Some(&stamp) => {
                report.line(&format!(
                    "image {image}: built from this recipe already (stamp {stamp}); not rebuilding"
                ));
                HeadImage::Present
            }
            _ => build(config, head, &stamp, report).await?,
        }
    } else if pullable(image) && !p.skip_pull && (p.pull || present.is_none()) {
        report.line(&format!("image {image}: pulling on the head"));
        let creds = config
            .secrets
            .ghcr_token
            .as_ref()
            .map(|t| (config.secrets.ghcr_user.clone(), t.expose().to_owned()));
        let pulled = head
            .pull(image, creds, |pr| {
                if let (Some(c), Some(t)) = (pr.current, pr.total) {
                    report.bytes(&format!("pull {}", pr.status), c, Some(t));
                }
            })
            .await;
        match pulled {
            Ok(()) => HeadImage::Pulled,
            Err(e) if can_build => {
                report.line(&format!("image {image}: pull failed ({e}); building it instead"));
                let stamp = recipe_stamp(&p.build_context)?;
                build(config, head, &stamp, report).await?
            }
            Err(e) if present.is_some() => {
                report.line(&format!("image {image}: pull failed ({e}); using the head's copy"));
                HeadImage::Present
            }
            Err(e) => {
                return Err(PrepareError::NoImage {
                    image: image.clone(),
                    why: format!(
                    "{e}; if the registry needs a login, set GHCR_USER and GHCR_TOKEN (a token with read:packages), \
                         or build it (BUILD=1) / load it on the head yourself"
                ),
                })
            }
        }
    } else if present.is_none() {
        if !can_build {
            return Err(PrepareError::NoImage {
                image: image.clone(),
                why: if p.skip_pull || !pullable(image) {
                    format!(
                        "it is not pullable (SKIP_PULL=1 or no registry in the name) and there is no {} to build from{}",
                        dockerfile.display(),
                        if p.skip_build { " (SKIP_BUILD=1)" } else { "" }
                    )
                } else {
                    "SKIP_BUILD=1".into()
                },
            });
        }
        let stamp = recipe_stamp(&p.build_context)?;
        build(config, head, &stamp, report).await?
    } else {
        HeadImage::Present
    };
    let id = head.image_identity(image).await?.ok_or_else(|| PrepareError::NoImage {
        image: image.clone(),
        why: format!("the head's daemon does not list it after {outcome:?}"),
    })?;
    if outcome == HeadImage::Present {
        report.line(&format!(
            "image {image}: on the head (identity {}, {})",
            id.key(),
            human_bytes(id.size)
        ));
    }
    Ok(id)
}

async fn build(config: &Config, head: &Node, stamp: &str, report: &dyn Report) -> Result<HeadImage, PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    report.line(&format!(
        "image {image}: building from {} (recipe stamp {stamp})",
        p.build_context.join(&p.dockerfile).display()
    ));
    let tar = context_tar(&p.build_context)?;
    let labels = HashMap::from([(RECIPE_STAMP_LABEL.to_owned(), stamp.to_owned())]);
    let args = HashMap::from([("SPARKGATE_RECIPE_STAMP".to_owned(), stamp.to_owned())]);
    let log_path = config.supervision.log_dir.join("build.log");
    let mut log = String::new();
    let built = head
        .build(tar.into(), &p.dockerfile, image, &labels, &args, |pr| {
            log.push_str(&pr.status);
            log.push('\n');
        })
        .await;
    let _ = std::fs::create_dir_all(&config.supervision.log_dir);
    let _ = std::fs::write(&log_path, &log);
    match built {
        Ok(()) => {
            report.line(&format!("image {image}: built (log {})", log_path.display()));
            Ok(HeadImage::Built {
                stamp: stamp.to_owned(),
            })
        }
        Err(e) => {
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            Err(PrepareError::Build {
                error: e.to_string(),
                log: log_path.display().to_string(),
                tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_follows_content_and_names_not_caches() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::create_dir_all(dir.path().join("overlay/__pycache__")).unwrap();
        std::fs::write(dir.path().join("overlay/a.py"), "x = 1\n").unwrap();
        let first = recipe_stamp(dir.path()).unwrap();
        std::fs::write(dir.path().join("overlay/__pycache__/a.pyc"), "cache").unwrap();
        assert_eq!(recipe_stamp(dir.path()).unwrap(), first, "caches are not the recipe");
        std::fs::write(dir.path().join("overlay/a.py"), "x = 2\n").unwrap();
        let edited = recipe_stamp(dir.path()).unwrap();
        assert_ne!(edited, first);
        std::fs::rename(dir.path().join("overlay/a.py"), dir.path().join("overlay/b.py")).unwrap();
        assert_ne!(recipe_stamp(dir.path()).unwrap(), edited, "a rename changes the recipe");
    }

    #[test]
    fn the_context_tar_holds_the_recipe_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join(".git/HEAD"), "ref").unwrap();
        let tar = context_tar(dir.path()).unwrap();
        let mut archive = tar::Archive::new(&tar[..]);
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["Dockerfile"]);
    }
}
