//! IMAGE on the head: use it when present, pull it from its registry (PULL=1, or missing), or
//! build it from BUILD_CONTEXT (BUILD=1, or missing and not pullable) with a recipe-stamp label so
//! an unchanged recipe is never rebuilt.

use std::collections::HashMap;
use std::path::PathBuf;

use sparkgate_config::Config;
use sparkgate_docker::{registry_host, ImageIdentity, Node};

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

/// Where IMAGE can come from when the head lacks it.
struct Sources {
    dockerfile: PathBuf,
    /// A registry name (`host/…` or `org/…`) and SKIP_PULL=0.
    can_pull: bool,
    /// The Dockerfile exists and SKIP_BUILD=0.
    can_build: bool,
}

impl Sources {
    fn of(config: &Config) -> Sources {
        let p = &config.preparation;
        let dockerfile = p.build_context.join(&p.dockerfile);
        Sources {
            can_pull: config.serving.image.contains('/') && !p.skip_pull,
            can_build: !p.skip_build && dockerfile.is_file(),
            dockerfile,
        }
    }

    /// The error for an image the head lacks and that can be neither pulled nor built.
    fn none_error(&self, config: &Config) -> PrepareError {
        let p = &config.preparation;
        PrepareError::NoImage {
            image: config.serving.image.clone(),
            why: format!(
                "the head's daemon does not have it, it cannot be pulled ({}) and there is nothing to build it from ({})",
                if p.skip_pull { "SKIP_PULL=1" } else { "no registry in the name" },
                if p.skip_build { "SKIP_BUILD=1".to_owned() } else { format!("no {}", self.dockerfile.display()) }
            ),
        }
    }
}

/// Preflight: fails when IMAGE is missing on the head and can be neither pulled (SKIP_PULL=1 or
/// no registry in the name) nor built (SKIP_BUILD=1 or no Dockerfile) — a start could not succeed.
pub async fn obtainable_on_head(config: &Config, head: &Node) -> Result<(), PrepareError> {
    let sources = Sources::of(config);
    if sources.can_pull || sources.can_build || head.image_identity(&config.serving.image).await?.is_some() {
        return Ok(());
    }
    Err(sources.none_error(config))
}

/// Makes IMAGE present on the head and returns its identity.
pub async fn ensure_on_head(config: &Config, head: &Node, report: &dyn Report) -> Result<ImageIdentity, PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    let present = head.image_identity(image).await?;
    let sources = Sources::of(config);
    let outcome = if p.build && !p.skip_build {
        if !sources.can_build {
            return Err(PrepareError::Recipe(format!(
                "BUILD=1 but {} does not exist; set BUILD_CONTEXT/DOCKERFILE",
                sources.dockerfile.display()
            )));
        }
        build_unless_stamped(config, head, present.as_ref(), report).await?
    } else if sources.can_pull && (p.pull || present.is_none()) {
        pull(config, head, present.is_some(), &sources, report).await?
    } else if present.is_none() {
        // Not pullable here (the branch above takes every pullable missing image).
        if !sources.can_build {
            return Err(sources.none_error(config));
        }
        build_from_recipe(config, head, report).await?
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

/// BUILD=1: builds IMAGE unless the head's copy (`present`) carries this recipe's stamp.
async fn build_unless_stamped(
    config: &Config,
    head: &Node,
    present: Option<&ImageIdentity>,
    report: &dyn Report,
) -> Result<HeadImage, PrepareError> {
    let recipe = Recipe::of(config);
    let stamp = recipe.stamp()?;
    match present {
        Some(id) if id.labels.get(RECIPE_STAMP_LABEL) == Some(&stamp) => {
            report.line(&format!(
                "image {}: built from this recipe already (stamp {stamp}); not rebuilding",
                config.serving.image
            ));
            Ok(HeadImage::Present)
        }
        _ => build(config, head, &recipe, &stamp, report).await,
    }
}

/// Pulls IMAGE on the head, its layers' progress reported; when the pull fails, the head's
/// copy (`present`) or a build stands in.
async fn pull(
    config: &Config,
    head: &Node,
    present: bool,
    sources: &Sources,
    report: &dyn Report,
) -> Result<HeadImage, PrepareError> {
    let image = &config.serving.image;
    report.line(&format!("image {image}: pulling on the head"));
    // The GHCR token goes only to the registry it is for, never to whatever IMAGE names.
    let creds = config
        .secrets
        .ghcr_token
        .as_ref()
        .filter(|_| registry_host(image) == config.preparation.ghcr_registry)
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
        Ok(()) => Ok(HeadImage::Pulled),
        // A registry outage must not replace the head's copy with a local build.
        Err(e) if present => {
            report.line(&format!("image {image}: pull failed ({e}); using the head's copy"));
            Ok(HeadImage::Present)
        }
        Err(e) if sources.can_build => {
            report.line(&format!("image {image}: pull failed ({e}); building it instead"));
            build_from_recipe(config, head, report).await
        }
        Err(e) => Err(PrepareError::NoImage {
            image: image.clone(),
            why: format!(
                "{e}; if the registry needs a login, set GHCR_USER and GHCR_TOKEN (a token with read:packages) \
                 and GHCR_REGISTRY to its host, or build it (BUILD=1) / load it on the head yourself"
            ),
        }),
    }
}

/// Builds from BUILD_CONTEXT's recipe, stamped.
async fn build_from_recipe(config: &Config, head: &Node, report: &dyn Report) -> Result<HeadImage, PrepareError> {
    let recipe = Recipe::of(config);
    let stamp = recipe.stamp()?;
    build(config, head, &recipe, &stamp, report).await
}

async fn build(
    config: &Config,
    head: &Node,
    recipe: &Recipe,
    stamp: &str,
    report: &dyn Report,
) -> Result<HeadImage, PrepareError> {
    let p = &config.preparation;
    let image = &config.serving.image;
    report.line(&format!(
        "image {image}: building from {} (recipe stamp {stamp})",
        p.build_context.join(&p.dockerfile).display()
    ));
    let tar = recipe.tar()?;
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
