//! Images and volumes on a node: identity by RootFS layers, pull, build, export and load as
//! byte streams (so one daemon's export can feed another's load), NFS-backed volumes, and shell
//! commands on the node's host (locally for the head, over SSH for a worker).

use std::collections::HashMap;

use bollard::auth::DockerCredentials;
use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateImageOptionsBuilder, ImportImageOptionsBuilder, RemoveImageOptionsBuilder,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::{DockerError, Node};

/// How long a load or build may run. The node's client gives up after 120 s without response
/// headers, but the daemon answers a quiet load only once the whole tar is in, and a build of
/// the overlay image can take an hour.
const LONG_OPERATION: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What makes two copies of an image the same image: the digests of its root filesystem's
/// layers, plus its run configuration (env, command, entrypoint, labels, working directory,
/// user — a rebuild that changes only those adds no layer). `docker save | docker load` keeps
/// both, while it drops RepoDigests, and the image Id differs between storage backends
/// (overlay2 vs containerd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageIdentity {
    pub layers: Vec<String>,
    /// FNV-1a hash of the run configuration, 16 hex digits.
    pub config: String,
    /// The image's labels (the recipe stamp of a built image among them).
    pub labels: HashMap<String, String>,
    /// Size in bytes as the daemon reports it (uncompressed; an export is about this large).
    pub size: u64,
}

impl ImageIdentity {
    /// A short stable name for the layer list: 16 hex digits of its FNV-1a hash (file names,
    /// log lines).
    pub fn key(&self) -> String {
        fnv(&format!("{}|{}", self.layers.join(","), self.config))
    }

    /// Same layers and run configuration: the same image, whatever its Id or RepoDigests say.
    pub fn same_image(&self, other: &ImageIdentity) -> bool {
        !self.layers.is_empty() && self.layers == other.layers && self.config == other.config
    }
}

fn fnv(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The run configuration's hash: the fields a container sees, labels sorted.
fn config_hash(c: Option<&bollard::models::ImageConfig>) -> String {
    let Some(c) = c else { return fnv("") };
    let labels: std::collections::BTreeMap<_, _> = c.labels.iter().flatten().collect();
    fnv(&format!(
        "{:?}|{:?}|{:?}|{labels:?}|{:?}|{:?}",
        c.env, c.cmd, c.entrypoint, c.working_dir, c.user
    ))
}

/// The registry host of an image reference as Docker reads it: the first path component when it
/// looks like a host (has a `.` or `:`, or is `localhost`), else Docker Hub.
pub fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// One progress report of a long image operation.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProgress {
    /// The layer a pull report is about (empty for builds).
    pub layer: String,
    /// What the daemon says it is doing (a pull's layer status, a build step).
    pub status: String,
    /// Bytes done and expected, when the daemon reports them.
    pub current: Option<u64>,
    pub total: Option<u64>,
}

impl Node {
    /// The image's identity, or `None` when it is not on this daemon.
    pub async fn image_identity(&self, image: &str) -> Result<Option<ImageIdentity>, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(i) => Ok(Some(ImageIdentity {
                layers: i.root_fs.and_then(|r| r.layers).unwrap_or_default(),
                config: config_hash(i.config.as_ref()),
                labels: i.config.and_then(|c| c.labels).unwrap_or_default(),
                size: i.size.unwrap_or(0).max(0) as u64,
            })),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(e) => Err(self.api(format!("inspect image {image}"))(e)),
        }
    }

    /// Pulls `image` from its registry (with credentials when given), reporting progress.
    pub async fn pull(
        &self,
        image: &str,
        credentials: Option<(String, String)>,
        mut progress: impl FnMut(ImageProgress),
    ) -> Result<(), DockerError> {
        let opts = CreateImageOptionsBuilder::default().from_image(image).build();
        let creds = credentials.map(|(username, password)| DockerCredentials {
            username: Some(username),
            password: Some(password),
            serveraddress: Some(registry_host(image).to_owned()),
            ..Default::default()
        });
        let mut stream = self.docker.create_image(Some(opts), None, creds);
        while let Some(item) = stream.next().await {
            let info = item.map_err(self.api(format!("pull {image}")))?;
            let detail = info.progress_detail.unwrap_or_default();
            progress(ImageProgress {
                layer: info.id.unwrap_or_default(),
                status: info.status.unwrap_or_default(),
                current: detail.current.map(|c| c.max(0) as u64),
                total: detail.total.map(|t| t.max(0) as u64),
            });
        }
        Ok(())
    }

    /// Builds `tag` from a build context (a tar with the Dockerfile at `dockerfile`), with
    /// `labels` and `build_args`; each output line goes to `progress`.
    pub async fn build(
        &self,
        context_tar: Bytes,
        dockerfile: &str,
        tag: &str,
        labels: &HashMap<String, String>,
        build_args: &HashMap<String, String>,
        mut progress: impl FnMut(ImageProgress),
    ) -> Result<(), DockerError> {
        let opts = BuildImageOptionsBuilder::default()
            .dockerfile(dockerfile)
            .t(tag)
            .rm(true)
            .labels(labels)
            .buildargs(build_args)
            .build();
        let docker = self.docker.clone().with_timeout(LONG_OPERATION);
        let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context_tar)));
        while let Some(item) = stream.next().await {
            let info = item.map_err(self.api(format!("build {tag}")))?;
            if let Some(err) = info.error_detail.and_then(|e| e.message) {
                return Err(DockerError::Failed {
                    node: self.name.clone(),
                    what: format!("build {tag}"),
                    detail: err,
                });
            }
            if let Some(line) = info.stream.or(info.status) {
                let line = line.trim_end();
                if !line.is_empty() {
                    progress(ImageProgress {
                        layer: String::new(),
                        status: line.to_owned(),
                        current: None,
                        total: None,
                    });
                }
            }
        }
        Ok(())
    }

    /// The image as a `docker save` tar, streamed.
    pub fn export_image(&self, image: &str) -> impl Stream<Item = Result<Bytes, DockerError>> + Send + use<> {
        let node = self.name.clone();
        let what = format!("export {image}");
        self.docker.export_image(image).map(move |r| {
            r.map_err(|source| DockerError::Api {
                node: node.clone(),
                what: what.clone(),
                source,
            })
        })
    }

    /// Loads a `docker save` tar from a byte stream (`docker load`).
    pub async fn load_image<S, E>(&self, tar: S) -> Result<(), DockerError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        let opts = ImportImageOptionsBuilder::default().quiet(true).build();
        let docker = self.docker.clone().with_timeout(LONG_OPERATION);
        let mut stream = docker.import_image_stream(opts, tar, None);
        while let Some(item) = stream.next().await {
            let info = item.map_err(self.api("load image"))?;
            if let Some(err) = info.error_detail.and_then(|e| e.message) {
                return Err(DockerError::Failed {
                    node: self.name.clone(),
                    what: "load image".into(),
                    detail: err,
                });
            }
        }
        Ok(())
    }

    /// Removes an image (tests and re-ships); absent is fine.
    pub async fn remove_image(&self, image: &str) -> Result<(), DockerError> {
        let opts = RemoveImageOptionsBuilder::default().force(true).build();
        match self.docker.remove_image(image, Some(opts), None).await {
            Ok(_) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(e) => Err(self.api(format!("remove image {image}"))(e)),
        }
    }

    /// Makes sure a volume named `name` exists with exactly `driver_opts` (local driver):
    /// an existing one with other options is removed and created again. Returns whether it was
    /// (re)created.
    pub async fn ensure_volume(&self, name: &str, driver_opts: &HashMap<String, String>) -> Result<bool, DockerError> {
        match self.docker.inspect_volume(name).await {
            Ok(v) if v.driver == "local" && &v.options == driver_opts => return Ok(false),
            Ok(_) => {
                self.docker
                    .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                    .await
                    .map_err(self.api(format!("remove volume {name} (to recreate it with new options)")))?;
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(self.api(format!("inspect volume {name}"))(e)),
        }
        let req = VolumeCreateRequest {
            name: Some(name.to_owned()),
            driver: Some("local".into()),
            driver_opts: Some(driver_opts.clone()),
            ..Default::default()
        };
        self.docker
            .create_volume(req)
            .await
            .map_err(self.api(format!("create volume {name}")))?;
        Ok(true)
    }

    /// Runs a POSIX shell script on the node's host — the head's locally, a worker's over its
    /// SSH session — and returns its stdout; a failure carries its stderr.
    pub async fn shell(&self, script: &str) -> Result<String, DockerError> {
        let failed = |detail: String| DockerError::Failed {
            node: self.name.clone(),
            what: format!("`{}`", first_line(script)),
            detail,
        };
        match &self.tunnel {
            Some(t) => t.run("sh", &["-c", script]).await.map_err(failed),
            None => {
                let out = tokio::process::Command::new("sh")
                    .args(["-c", script])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                if out.status.success() {
                    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
                } else {
                    Err(failed(String::from_utf8_lossy(&out.stderr).trim().to_owned()))
                }
            }
        }
    }

    /// Where the daemon keeps images (`docker info`'s DockerRootDir), when it says.
    pub async fn docker_root_dir(&self) -> Result<Option<String>, DockerError> {
        let info = self.docker.info().await.map_err(self.api("docker info"))?;
        Ok(info.docker_root_dir.filter(|d| !d.is_empty()))
    }

    /// Whether the node is reached over SSH (a worker) rather than on this machine.
    pub fn is_remote(&self) -> bool {
        self.tunnel.is_some()
    }
}

/// `script` run by `sh` with `args` as its positional parameters on `node`'s host — a worker's
/// over its SSH session — or on this machine when `node` is `None`; its standard output. On this
/// machine the exit status is not judged: the callers' scripts print the facts they found and
/// read an absent one as absent.
pub async fn run_script(node: Option<&Node>, script: &str, args: &[impl AsRef<str>]) -> Result<String, DockerError> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    if let Some(node) = node {
        let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
        return node.shell(&format!("set -- {}\n{script}", quoted.join(" "))).await;
    }
    let out = tokio::process::Command::new("sh")
        .args(["-c", script, "sh"])
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| DockerError::Failed {
            node: "this machine".into(),
            what: format!("`{}`", first_line(script)),
            detail: e.to_string(),
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn first_line(script: &str) -> &str {
    let line = script.lines().next().unwrap_or_default();
    line.get(..60).unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(layers: &[&str]) -> ImageIdentity {
        ImageIdentity {
            layers: layers.iter().map(|s| (*s).to_owned()).collect(),
            config: config_hash(None),
            labels: HashMap::new(),
            size: 0,
        }
    }

    #[test]
    fn registry_hosts_are_read_as_docker_reads_them() {
        assert_eq!(registry_host("ghcr.io/miaai-lab/glm:exl3"), "ghcr.io");
        assert_eq!(registry_host("127.0.0.1:5000/x/y:1"), "127.0.0.1:5000");
        assert_eq!(registry_host("localhost/x"), "localhost");
        assert_eq!(registry_host("miaai-lab/glm:exl3"), "docker.io");
        assert_eq!(registry_host("ubuntu"), "docker.io");
    }

    #[test]
    fn identity_is_the_layer_list() {
        let a = id(&["sha256:aa", "sha256:bb"]);
        assert!(a.same_image(&id(&["sha256:aa", "sha256:bb"])));
        assert!(!a.same_image(&id(&["sha256:aa"])));
        assert!(!id(&[]).same_image(&id(&[])), "no layers proves nothing");
        assert_eq!(a.key(), id(&["sha256:aa", "sha256:bb"]).key());
        assert_ne!(a.key(), id(&["sha256:bb", "sha256:aa"]).key());
        assert_eq!(a.key().len(), 16);
    }

    #[test]
    fn a_changed_run_configuration_is_another_image() {
        let with_env = |env: &str| bollard::models::ImageConfig {
            env: Some(vec![env.to_owned()]),
            ..Default::default()
        };
        let mut a = id(&["sha256:aa"]);
        let mut b = id(&["sha256:aa"]);
        a.config = config_hash(Some(&with_env("A=1")));
        b.config = config_hash(Some(&with_env("A=2")));
        assert!(!a.same_image(&b), "same layers, different env");
        assert_ne!(a.key(), b.key());
        b.config = config_hash(Some(&with_env("A=1")));
        assert!(a.same_image(&b));
    }
}
