//! Docker access for sparkgate's nodes: the only crate that talks to a Docker daemon (bollard)
//! or opens an SSH session (openssh). A `Node` is a daemon you can reach: the head's local
//! socket, or a worker's socket forwarded over SSH (`ssh.rs`) — one code path for both. Images
//! and volumes (identity, pull, build, export/load, NFS volumes) are in `image.rs`.

mod image;
mod ssh;

pub use image::{registry_host, run_script, ImageIdentity, ImageProgress};
pub use ssh::{mem_available_gib, RemoteProcess, SshTarget};

/// How a container or a remote process ended: in words, and its kind when that is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub status: String,
    pub kind: Option<ExitKind>,
}

/// The kind of an exit: a code (Docker reports a signal death as 128 + n), or a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    Code(i64),
    Signal,
}

impl Exit {
    fn unknown(status: String) -> Exit {
        Exit { status, kind: None }
    }
}

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use bollard::Docker;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use sparkgate_config::{ContainerSpec, Gpus, Mount, RankEnvValue};

/// Errors of Docker operations, saying which node and what failed.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("{node}: cannot reach the Docker daemon at {socket}: {source}")]
    Unreachable {
        node: String,
        socket: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("{node} ({destination}): cannot reach it over SSH: {detail}")]
    Ssh {
        node: String,
        destination: String,
        detail: String,
    },
    #[error("{node}: {what}: {source}")]
    Api {
        node: String,
        what: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("{node}: {what} failed: {detail}")]
    Failed { node: String, what: String, detail: String },
}

/// A container as the supervisor sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub labels: HashMap<String, String>,
    pub running: bool,
}

/// A Docker daemon sparkgate runs rank containers on.
#[derive(Debug, Clone)]
pub struct Node {
    name: String,
    docker: Docker,
    /// The SSH session behind a worker's forwarded socket; dropped with the last clone.
    tunnel: Option<std::sync::Arc<ssh::Tunnel>>,
}

impl Node {
    /// Connects to the daemon behind a local unix socket and checks that it answers.
    pub async fn local(name: &str, socket: &str) -> Result<Node, DockerError> {
        let unreachable = |source| DockerError::Unreachable {
            node: name.to_owned(),
            socket: socket.to_owned(),
            source,
        };
        let docker = Docker::connect_with_unix(socket, 120, bollard::API_DEFAULT_VERSION).map_err(unreachable)?;
        let docker = docker.negotiate_version().await.map_err(unreachable)?;
        docker.ping().await.map_err(unreachable)?;
        Ok(Node {
            name: name.to_owned(),
            docker,
            tunnel: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn api(&self, what: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> DockerError + '_ {
        let what = what.into();
        move |source| DockerError::Api {
            node: self.name.clone(),
            what,
            source,
        }
    }

    /// Whether `image` is present on this daemon.
    pub async fn has_image(&self, image: &str) -> Result<bool, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
            Err(e) => Err(self.api(format!("inspect image {image}"))(e)),
        }
    }

    /// Creates and starts a container from the plan's spec plus `extra_labels`, replacing any
    /// container of the same name. Returns its id.
    pub async fn run(&self, spec: &ContainerSpec, extra_labels: &[(String, String)]) -> Result<String, DockerError> {
        self.remove_named(&spec.name).await?;
        let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        labels.extend(extra_labels.iter().cloned());
        let env = spec
            .env
            .iter()
            .map(|(k, v)| match v {
                RankEnvValue::Plain(p) => format!("{k}={p}"),
                RankEnvValue::Secret(s) => format!("{k}={}", s.expose()),
            })
            .collect();
        let binds: Vec<String> = spec.mounts.iter().map(Mount::bind_spec).collect();
        let host = HostConfig {
            network_mode: Some(spec.network_mode.to_owned()),
            ipc_mode: Some(spec.ipc_mode.to_owned()),
            shm_size: Some(spec.shm_size_bytes as i64),
            oom_score_adj: spec.oom_score_adj.map(i64::from),
            ulimits: Some(
                spec.ulimits
                    .iter()
                    .map(|u| ResourcesUlimits {
                        name: Some(u.name.to_owned()),
                        soft: Some(u.soft),
                        hard: Some(u.hard),
                    })
                    .collect(),
            ),
            device_requests: (spec.gpus == Gpus::All).then(|| {
                vec![DeviceRequest {
                    driver: Some(String::new()),
                    count: Some(-1),
                    capabilities: Some(vec![vec!["gpu".to_owned()]]),
                    ..Default::default()
                }]
            }),
            devices: Some(
                spec.devices
                    .iter()
                    .map(|d| DeviceMapping {
                        path_on_host: Some(d.clone()),
                        path_in_container: Some(d.clone()),
                        cgroup_permissions: Some("rwm".into()),
                    })
                    .collect(),
            ),
            cap_add: Some(spec.cap_add.iter().map(|c| (*c).to_owned()).collect()),
            binds: Some(binds),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            entrypoint: Some(spec.entrypoint.clone()),
            cmd: Some(spec.cmd.clone()),
            env: Some(env),
            labels: Some(labels),
            stop_timeout: Some(i64::from(spec.stop_timeout_s)),
            host_config: Some(host),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default().name(&spec.name).build();
        let created = self
            .docker
            .create_container(Some(opts), body)
            .await
            .map_err(self.api(format!("create {}", spec.name)))?;
        self.docker
            .start_container(&created.id, None)
            .await
            .map_err(self.api(format!("start {}", spec.name)))?;
        Ok(created.id)
    }

    async fn remove_named(&self, name: &str) -> Result<(), DockerError> {
        let opts = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(name, Some(opts)).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(e) => Err(self.api(format!("remove {name}"))(e)),
        }
    }

    /// Containers (running or not) carrying every `label=value`.
    pub async fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, DockerError> {
        let filters: HashMap<String, Vec<String>> = HashMap::from([(
            "label".to_owned(),
            labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        )]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_containers(Some(opts))
            .await
            .map_err(self.api("list containers"))?;
        Ok(list
            .into_iter()
            .map(|c| ContainerInfo {
                id: c.id.unwrap_or_default(),
                name: c
                    .names
                    .and_then(|n| n.first().cloned())
                    .unwrap_or_default()
                    .trim_start_matches('/')
                    .to_owned(),
                labels: c.labels.unwrap_or_default(),
                running: c.state.is_some_and(|s| s.to_string() == "running"),
            })
            .collect())
    }

    /// SIGKILL and remove (the group is replaced as a unit).
    pub async fn kill_and_remove(&self, id: &str) -> Result<(), DockerError> {
        let _ = self
            .docker
            .kill_container(id, Some(KillContainerOptionsBuilder::default().signal("KILL").build()))
            .await;
        self.remove_named(id).await
    }

    /// Resolves when the container stops: its exit code (or why it could not be read).
    pub async fn wait_exit(&self, id: &str) -> Exit {
        let opts = WaitContainerOptionsBuilder::default().condition("not-running").build();
        let mut stream = self.docker.wait_container(id, Some(opts));
        let code = match stream.next().await {
            Some(Ok(r)) => r.status_code,
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
            Some(Err(e)) => return Exit::unknown(format!("wait failed: {e}")),
            None => return Exit::unknown("container gone".into()),
        };
        // The exit code alone cannot tell the kernel's OOM killer from `docker kill`.
        let oom = self
            .docker
            .inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>)
            .await
            .ok()
            .and_then(|c| c.state?.oom_killed)
            .unwrap_or(false);
        let status = if oom {
            format!("exit status: {code} (OOM-killed)")
        } else {
            format!("exit status: {code}")
        };
        // The OOM killer's SIGKILL is a signal death whatever code the daemon reports.
        let kind = if oom { ExitKind::Signal } else { ExitKind::Code(code) };
        Exit {
            status,
            kind: Some(kind),
        }
    }

    /// Runs `cmd` inside the container (diagnostics); its combined output, or why it could not run.
    pub async fn exec(&self, id: &str, cmd: &[&str]) -> String {
        let opts = bollard::exec::CreateExecOptions {
            cmd: Some(cmd.to_vec()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let exec = match self.docker.create_exec(id, opts).await {
            Ok(e) => e,
            Err(e) => return format!("exec failed: {e}"),
        };
        match self.docker.start_exec(&exec.id, None).await {
            Ok(bollard::exec::StartExecResults::Attached { mut output, .. }) => {
                let mut text = String::new();
                while let Some(Ok(chunk)) = output.next().await {
                    text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
                }
                text
            }
            Ok(bollard::exec::StartExecResults::Detached) => String::new(),
            Err(e) => format!("exec failed: {e}"),
        }
    }

    /// The container's output (stdout and stderr), following it from `tail` lines back.
    pub fn logs(&self, id: &str, tail: Option<usize>) -> impl Stream<Item = Bytes> + Send + use<> {
        let opts = LogsOptionsBuilder::default()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .tail(&tail.map_or("all".to_owned(), |t| t.to_string()))
            .build();
        self.docker
            .logs(id, Some(opts))
            .filter_map(|item| async move { item.ok().map(|o| o.into_bytes()) })
    }
}
