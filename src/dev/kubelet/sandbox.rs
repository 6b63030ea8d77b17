//! Pod sandboxes for the dev kubelet: a bare network namespace announced over the in-process
//! NRI runtime endpoint, or a real sandbox through a container runtime's CRI socket
//! (containerd with NRI enabled, which then tells the node daemon's NRI plugin itself).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container as PodContainer, Pod};

use super::cdi::{self, PreparedClaim};
use crate::dev::cri::{self, CriClient, CriError, proto};
use crate::host::netns::{self, NetnsError};
use nri_rs::{Container, NriRuntime, PodSandbox, RuntimeError};

/// Errors of a sandbox operation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The network namespace could not be created or removed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Loopback in the new namespace could not be brought up.
    #[error("bringing up lo in {path}: {message}")]
    Loopback {
        /// The namespace.
        path: PathBuf,
        /// The netlink error.
        message: String,
    },
    /// No NRI plugin is connected, so nobody would attach the pod's interfaces.
    #[error("no NRI plugin is registered on {0} (is the node daemon running?)")]
    NoPlugin(PathBuf),
    /// An NRI plugin refused the event.
    #[error(transparent)]
    Nri(#[from] RuntimeError),
    /// The CRI runtime failed.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// A blocking task panicked.
    #[error("the netns task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// A running sandbox.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Sandbox ID (CRI, or generated for a bare netns).
    pub id: String,
    /// The pod's network namespace.
    pub netns_path: Option<PathBuf>,
    /// What the NRI runtime announced (bare mode).
    nri_pod: Option<PodSandbox>,
    /// The CRI config it was created with (CRI mode; containers need it).
    cri_config: Option<proto::PodSandboxConfig>,
    /// Containers created in it.
    pub containers: Vec<String>,
}

/// Where sandboxes run.
#[derive(Clone)]
pub enum SandboxBackend {
    /// Bare network namespaces pinned under `netns_dir`, announced through `runtime`.
    Bare {
        /// The in-process NRI runtime endpoint the node daemon's plugin connects to.
        runtime: Arc<NriRuntime>,
        /// Where namespaces are pinned.
        netns_dir: PathBuf,
    },
    /// A CRI runtime (containerd with NRI enabled).
    Cri {
        /// The runtime's CRI client.
        client: CriClient,
        /// Parent of the sandboxes' log directories.
        log_dir: PathBuf,
        /// Whether containers get the CDI ids of their claims: only when the runtime reads
        /// the driver's CDI spec dir (else it would refuse the unresolvable ids).
        cdi_devices: bool,
    },
}

impl std::fmt::Debug for SandboxBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bare { netns_dir, .. } => {
                f.debug_struct("Bare").field("netns_dir", netns_dir).finish_non_exhaustive()
            }
            Self::Cri { log_dir, .. } => {
                f.debug_struct("Cri").field("log_dir", log_dir).finish_non_exhaustive()
            }
        }
    }
}

fn pod_field(
    pod: &Pod,
    field: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&String>,
) -> String {
    field(&pod.metadata).cloned().unwrap_or_default()
}

fn containers(pod: &Pod) -> Vec<&PodContainer> {
    pod.spec.iter().flat_map(|s| s.containers.iter()).collect()
}

/// The CRI config of `container`: with the CDI devices of the claims it uses, which the
/// runtime resolves at `CreateContainer` (kubelet passes them the same way).
fn cri_container_config(
    container: &PodContainer,
    claims: &[PreparedClaim],
) -> proto::ContainerConfig {
    let name = container.name.clone();
    proto::ContainerConfig {
        metadata: Some(proto::ContainerMetadata { name: name.clone(), attempt: 0 }),
        image: Some(proto::ImageSpec { image: container.image.clone().unwrap_or_default() }),
        log_path: format!("{name}.log"),
        linux: Some(proto::LinuxContainerConfig::default()),
        cdi_devices: cdi::container_cdi_devices(container, claims)
            .into_iter()
            .map(|name| proto::CdiDevice { name })
            .collect(),
        ..Default::default()
    }
}

impl SandboxBackend {
    /// Starts the sandbox of `pod`. Nothing is left behind on error.
    pub async fn run(&self, pod: &Pod) -> Result<Sandbox, SandboxError> {
        match self {
            Self::Bare { runtime, netns_dir } => run_bare(runtime, netns_dir, pod).await,
            Self::Cri { client, log_dir, .. } => run_cri(client, log_dir, pod).await,
        }
    }

    /// Creates (CRI: and starts) every container of `pod` in `sandbox`; in bare mode this
    /// asks the NRI plugins, which may refuse (a pod whose interfaces are missing). CRI
    /// containers get the CDI devices of the prepared `claims` they use (when the backend
    /// passes them); bare mode has no runtime to resolve them.
    pub async fn create_containers(
        &self,
        sandbox: &mut Sandbox,
        pod: &Pod,
        claims: &[PreparedClaim],
    ) -> Result<(), SandboxError> {
        for container in containers(pod).into_iter().skip(sandbox.containers.len()) {
            let name = container.name.clone();
            let id = match self {
                Self::Bare { runtime, .. } => {
                    let Some(nri_pod) = &sandbox.nri_pod else { continue };
                    let container = Container {
                        id: uuid::Uuid::new_v4().simple().to_string(),
                        pod_sandbox_id: sandbox.id.clone(),
                        name: name.clone(),
                    };
                    runtime.create_container(nri_pod, &container).await?;
                    container.id
                }
                Self::Cri { client, cdi_devices, .. } => {
                    let Some(sandbox_config) = &sandbox.cri_config else { continue };
                    let config =
                        cri_container_config(container, if *cdi_devices { claims } else { &[] });
                    let id = client
                        .create_container(&sandbox.id, config, sandbox_config.clone())
                        .await?;
                    client.start_container(&id).await?;
                    id
                }
            };
            sandbox.containers.push(id);
        }
        Ok(())
    }

    /// Stops and removes the sandbox (and its containers) and its network namespace. Errors of
    /// NRI plugins are logged: a stop never fails the runtime.
    pub async fn stop_and_remove(&self, sandbox: &Sandbox) -> Result<(), SandboxError> {
        match self {
            Self::Bare { runtime, .. } => {
                if let Some(nri_pod) = &sandbox.nri_pod {
                    if let Err(err) = runtime.stop_pod_sandbox(nri_pod).await {
                        tracing::warn!(pod = %nri_pod, %err, "NRI StopPodSandbox failed");
                    }
                    if let Err(err) = runtime.remove_pod_sandbox(nri_pod).await {
                        tracing::warn!(pod = %nri_pod, %err, "NRI RemovePodSandbox failed");
                    }
                }
                if let Some(path) = sandbox.netns_path.clone() {
                    tokio::task::spawn_blocking(move || netns::remove(&path))
                        .await
                        .map_err(SandboxError::Task)??;
                }
                Ok(())
            }
            Self::Cri { client, .. } => {
                client.stop_pod_sandbox(&sandbox.id).await?;
                client.remove_pod_sandbox(&sandbox.id).await?;
                Ok(())
            }
        }
    }
}

async fn run_bare(
    runtime: &NriRuntime,
    netns_dir: &std::path::Path,
    pod: &Pod,
) -> Result<Sandbox, SandboxError> {
    if runtime.plugins().is_empty() {
        return Err(SandboxError::NoPlugin(runtime.socket_path().to_owned()));
    }
    let uid = pod_field(pod, |m| m.uid.as_ref());
    let dir = netns_dir.to_owned();
    let name = uid.clone();
    let path = tokio::task::spawn_blocking(move || netns::create(&dir, &name))
        .await
        .map_err(SandboxError::Task)??;
    let announced = async {
        loopback_up(&path).await?;
        let nri_pod = PodSandbox {
            id: uuid::Uuid::new_v4().simple().to_string(),
            uid: uid.clone(),
            name: pod_field(pod, |m| m.name.as_ref()),
            namespace: pod_field(pod, |m| m.namespace.as_ref()),
            netns_path: Some(path.clone()),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            ips: Vec::new(),
        };
        runtime.run_pod_sandbox(&nri_pod).await?;
        Ok::<_, SandboxError>(nri_pod)
    }
    .await;
    match announced {
        Ok(nri_pod) => Ok(Sandbox {
            id: nri_pod.id.clone(),
            netns_path: Some(path),
            nri_pod: Some(nri_pod),
            cri_config: None,
            containers: Vec::new(),
        }),
        Err(err) => {
            let cleanup = path.clone();
            if let Ok(Err(remove_err)) =
                tokio::task::spawn_blocking(move || netns::remove(&cleanup)).await
            {
                tracing::warn!(%remove_err, "removing the namespace of a failed sandbox");
            }
            Err(err)
        }
    }
}

/// `ip link set lo up` in the new namespace, as a CNI runtime does for every pod.
async fn loopback_up(path: &std::path::Path) -> Result<(), SandboxError> {
    let error = |message: String| SandboxError::Loopback { path: path.to_owned(), message };
    crate::host::netlink::loopback_up(path).await.map_err(|e| error(e.to_string()))
}

async fn run_cri(
    client: &CriClient,
    log_dir: &std::path::Path,
    pod: &Pod,
) -> Result<Sandbox, SandboxError> {
    let name = pod_field(pod, |m| m.name.as_ref());
    let namespace = pod_field(pod, |m| m.namespace.as_ref());
    let uid = pod_field(pod, |m| m.uid.as_ref());
    let pod_log_dir = log_dir.join(format!("{namespace}_{name}_{uid}"));
    // containerd needs the directory to exist only when containers log; best effort.
    let _ignored = std::fs::create_dir_all(&pod_log_dir);
    let config = proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: name.clone(),
            uid,
            namespace,
            attempt: 0,
        }),
        hostname: name,
        log_directory: pod_log_dir.display().to_string(),
        labels: pod.metadata.labels.clone().unwrap_or_default().into_iter().collect(),
        annotations: pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect(),
        linux: Some(proto::LinuxPodSandboxConfig {
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(proto::NamespaceOption {
                    network: proto::NamespaceMode::Pod.into(),
                    pid: proto::NamespaceMode::Container.into(),
                    ipc: proto::NamespaceMode::Pod.into(),
                    target_id: String::new(),
                }),
                privileged: false,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = client.run_pod_sandbox(config.clone(), "").await?;
    let netns_path = match client.pod_sandbox_status(&id, true).await {
        Ok(status) => cri::netns_path_from_verbose_info(&status),
        Err(err) => {
            tracing::warn!(sandbox = %id, %err, "reading the sandbox's netns path failed");
            None
        }
    };
    Ok(Sandbox { id, netns_path, nri_pod: None, cri_config: Some(config), containers: Vec::new() })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ResourceClaim as ClaimReference, ResourceRequirements};

    use super::*;
    use crate::dev::kubelet::cdi::ClaimUse;
    use crate::dev::kubelet::dra_client::PreparedDevice;

    #[test]
    fn create_container_carries_the_cdi_ids_of_the_claims_the_container_uses() {
        let prepared = [PreparedClaim {
            usage: ClaimUse::Entry("net".into()),
            devices: vec![PreparedDevice {
                requests: vec!["net".into()],
                pool: "node-a".into(),
                device: "eth2".into(),
                share_id: None,
                cdi_device_ids: vec!["netclaim.dev/metadata=u1_net".into()],
            }],
        }];
        let app = PodContainer {
            name: "app".into(),
            image: Some("pause".into()),
            resources: Some(ResourceRequirements {
                claims: Some(vec![ClaimReference { name: "net".into(), request: None }]),
                ..ResourceRequirements::default()
            }),
            ..PodContainer::default()
        };
        let config = cri_container_config(&app, &prepared);
        assert_eq!(
            config.cdi_devices,
            [proto::CdiDevice { name: "netclaim.dev/metadata=u1_net".into() }]
        );
        assert_eq!(config.metadata.map(|m| m.name).as_deref(), Some("app"));
        assert_eq!(config.image.map(|i| i.image).as_deref(), Some("pause"));
        // A container that does not list the claim does not get its devices.
        let sidecar = PodContainer {
            name: "sidecar".into(),
            image: Some("pause".into()),
            ..PodContainer::default()
        };
        assert!(cri_container_config(&sidecar, &prepared).cdi_devices.is_empty());
    }
}
