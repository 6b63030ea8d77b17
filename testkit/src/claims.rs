//! Shared by the claim tests and the prepare benchmark: `netclaim dev --api-only` on a free
//! loopback port, claims allocated the way the scheduler writes them, a fixed device
//! inventory, and a DRA v1 client on the plugin's socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use netclaim::claims::metadata::DeviceMetadata;
use netclaim::claims::{ClaimService, DeviceLookup, LookupError, ServiceIdentity};
use netclaim::k8s::claims::KubeClaims;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use netclaim::kubelet::{KubeletPlugin, KubeletPluginConfig, KubeletPluginHandle};
use netclaim::model::network_config::{DeviceFacts, Sharing};
use netclaim::store::Store;
use serde_json::{Value, json};
use tokio::net::UnixStream;

use super::devices::physical_nic;
use super::kubelet::tonic_channel;

pub(crate) use super::DRIVER;
pub(crate) const NODE: &str = "node-a";
pub(crate) const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");

/// `netclaim dev --api-only` as a child process, killed on drop.
pub(crate) struct DevApi {
    child: Child,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) client: kube::Client,
}

impl DevApi {
    pub(crate) async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let log = std::fs::File::create(dir.path().join("api.log")).unwrap();
        let child = Command::new(NETCLAIM)
            .args(["dev", "--api-only", "--listen", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kubeconfig.exists() {
            assert!(Instant::now() < deadline, "the dev API server wrote no kubeconfig");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
        Self { child, dir, client }
    }

    /// Creates a claim with one request per entry of `results`, then writes its allocation
    /// and reservation as the scheduler does (`status` subresource). `results` are
    /// `(request, device, shareID)`; `config` is the claim's own NetworkConfig (applied to
    /// every request) on top of a class entry setting macvlan mode.
    pub(crate) async fn allocated_claim(
        &self,
        name: &str,
        results: &[(&str, &str, Option<&str>)],
        config: Option<Value>,
    ) -> ResourceClaim {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        let requests: Vec<Value> = results
            .iter()
            .map(|(request, _, _)| json!({"name": request, "exactly": {"deviceClassName": "netclaim"}}))
            .collect();
        let mut claim_config = Vec::new();
        if let Some(parameters) = &config {
            claim_config.push(json!({"opaque": {"driver": DRIVER, "parameters": parameters}}));
        }
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": requests, "config": claim_config}},
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &claim).await.unwrap();
        let mut snapshot = vec![json!({
            "source": "FromClass",
            "opaque": {"driver": DRIVER, "parameters": network_config(json!({"mode": "macvlan"}))},
        })];
        if let Some(parameters) = config {
            snapshot.push(json!({
                "source": "FromClaim",
                "opaque": {"driver": DRIVER, "parameters": parameters},
            }));
        }
        let allocated: Vec<Value> = results
            .iter()
            .map(|(request, device, share)| {
                let mut result =
                    json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device});
                if let Some(share) = share {
                    result["shareID"] = json!(share);
                }
                result
            })
            .collect();
        let status = json!({"status": {
            "allocation": {
                "devices": {"results": allocated, "config": snapshot},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}
                ]}]},
            },
            "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": format!("pod-uid-{name}")}],
        }});
        let _ = created;
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap()
    }

    pub(crate) async fn delete_claim(&self, name: &str) {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
}

impl Drop for DevApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `parameters` with our apiVersion and kind.
pub(crate) fn network_config(fields: Value) -> Value {
    let mut config = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
    let Value::Object(fields) = fields else { panic!("a NetworkConfig is an object") };
    config.as_object_mut().unwrap().extend(fields);
    config
}

/// This node's devices: `eth1` exclusive, `eth2` a shared parent.
pub(crate) struct FixedDevices;

impl DeviceLookup for FixedDevices {
    async fn facts(&self, name: &str) -> Result<DeviceFacts, LookupError> {
        let sharing = match name {
            "eth1" => Sharing::Exclusive,
            "eth2" => Sharing::Shared,
            _ => return Err(LookupError::NotFound(name.to_owned())),
        };
        Ok(physical_nic(name, sharing))
    }

    async fn attributes(
        &self,
        name: &str,
    ) -> Result<
        std::collections::BTreeMap<String, netclaim::model::device::AttributeValue>,
        LookupError,
    > {
        Ok([(
            "netclaim.dev/ifName".to_owned(),
            netclaim::model::device::AttributeValue::String(name.to_owned()),
        )]
        .into())
    }
}

pub(crate) type Service = ClaimService<KubeClaims, FixedDevices, Arc<Store>>;

/// The claim service on `state_dir` (reading claims from `api`, devices [`FixedDevices`],
/// device metadata written when `metadata` is given) and its store.
pub(crate) fn claim_service(
    api: &DevApi,
    state_dir: &Path,
    metadata: Option<Arc<DeviceMetadata>>,
) -> (Arc<Service>, Arc<Store>) {
    let store = Arc::new(Store::open(state_dir).unwrap());
    let mut service = ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        KubeClaims::new(api.client.clone()),
        FixedDevices,
        Arc::clone(&store),
    )
    .unwrap();
    if let Some(metadata) = metadata {
        service = service.with_metadata(metadata).unwrap();
    }
    (Arc::new(service), store)
}

/// The kubelet plugin serving a claim service on `state_dir`, sockets under `sockets`.
pub(crate) struct Plugin {
    pub(crate) handle: KubeletPluginHandle,
    pub(crate) service: Arc<Service>,
}

impl Plugin {
    pub(crate) async fn start(api: &DevApi, state_dir: &Path, sockets: &Path) -> Self {
        let (service, _store) = claim_service(api, state_dir, None);
        let config =
            KubeletPluginConfig::new(DRIVER, sockets.join("registry"), sockets.join("plugin"));
        let handle = KubeletPlugin::start(config, Arc::clone(&service), std::future::pending())
            .await
            .unwrap();
        Self { handle, service }
    }

    pub(crate) fn dra_socket(&self) -> PathBuf {
        self.handle.dra_socket().to_owned()
    }

    pub(crate) async fn stop(self) {
        self.handle.stop();
        self.handle.wait().await.unwrap();
    }
}

/// A DRA v1 client on `socket`, as kubelet connects.
pub(crate) async fn dra_client(
    socket: &Path,
) -> v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
    v1::dra_plugin_client::DraPluginClient::new(tonic_channel(socket).await)
}

/// A DRA client once the plugin's socket accepts connections (a restarted daemon's socket
/// file may still be the dead one's until it registers again), waiting at most `patience`.
pub(crate) async fn dra_client_when_listening(
    socket: &Path,
    patience: Duration,
) -> v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
    let deadline = Instant::now() + patience;
    while UnixStream::connect(socket).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {}", socket.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dra_client(socket).await
}

/// kubelet's reference to a claim.
pub(crate) fn claim_ref(claim: &ResourceClaim) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        name: claim.metadata.name.clone().unwrap(),
        uid: claim.metadata.uid.clone().unwrap(),
    }
}
