//! IMAGE on the head: use it when present, pull it from its registry (PULL=1, or missing), or
//! build it from BUILD_CONTEXT (BUILD=1, or missing and not pullable) with a recipe-stamp label so
//! an unchanged recipe is never rebuilt.

use sparkgate_config::Config;
use sparkgate_docker::{ImageIdentity, Node};
use std::collections::HashMap;

use crate::progress::{human_bytes, Report};
use crate::recipe::Recipe;
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

/// Whether IMAGE names a registry (`host/…` or `org/…`), which `docker pull` can fetch.
fn pullable(image: &str) -> bool {
    image.contains('/')
}

/// The registry host of an image reference as Docker reads it: the first path component when it
/// looks like a host (has a `.` or `:`, or is `localhost`), else Docker Hub.
pub fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
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
        let stamp = Recipe::of(config).stamp()?;
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
        // The GHCR token goes only to the registry it is for, never to whatever IMAGE names.
        let creds = config
            .secrets
            .ghcr_token
            .as_ref()
            .filter(|_| registry_host(image) == p.ghcr_registry)
            .map(|t| (config.secrets.ghcr_user.clone(), t.expose().to_owned()));
        let mut layers: HashMap<String, (u64, u64)> = HashMap::new();
        let pulled = head
            .pull(image, creds, |pr| {
                if let (Some(c), Some(t)) = (pr.current, pr.total) {
                    layers.insert(pr.layer.clone(), (c, t));
                    let (done, total) = layers.values().fold((0, 0), |(d, t), (c, n)| (d + c, t + n));
                    report.bytes("pull", done, Some(total));
                }
            })
            .await;
        match pulled {
            Ok(()) => HeadImage::Pulled,
            // A registry outage must not replace the head's copy with a local build.
            Err(e) if present.is_some() => {
                report.line(&format!("image {image}: pull failed ({e}); using the head's copy"));
                HeadImage::Present
            }
            Err(e) if can_build => {
                report.line(&format!("image {image}: pull failed ({e}); building it instead"));
                let stamp = Recipe::of(config).stamp()?;
                build(config, head, &stamp, report).await?
            }
            Err(e) => {
                return Err(PrepareError::NoImage {
                    image: image.clone(),
                    why: format!(
                        "{e}; if the registry needs a login, set GHCR_USER and GHCR_TOKEN (a token with read:packages) \
                         and GHCR_REGISTRY to its host, or build it (BUILD=1) / load it on the head yourself"
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
        let stamp = Recipe::of(config).stamp()?;
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
    let tar = Recipe::of(config).tar()?;
    let labels = HashMap::from([(RECIPE_STAMP_LABEL.to_owned(), stamp.to_owned())]);
    let args = HashMap::from([("SPARKGATE_RECIPE_STAMP".to_owned(), stamp.to_owned())]);
    let log_path = config.supervision.log_dir.join("build.log");
    let mut log = String::new();
    let built = head
        .build(tar.into(), &p.dockerfile, image, &labels, &args, |pr| {
            // Steps are shown as they start, so a long or stuck build is visible.
            if pr.status.starts_with("Step ") {
                report.line(&format!("  {}", pr.status));
            }
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
    fn registry_hosts_are_read_as_docker_reads_them() {
        assert_eq!(registry_host("ghcr.io/miaai-lab/glm:exl3"), "ghcr.io");
        assert_eq!(registry_host("127.0.0.1:5000/x/y:1"), "127.0.0.1:5000");
        assert_eq!(registry_host("localhost/x"), "localhost");
        assert_eq!(registry_host("miaai-lab/glm:exl3"), "docker.io");
        assert_eq!(registry_host("ubuntu"), "docker.io");
    }
}
