//! Shared by the claim tests and the prepare benchmark: `netclaim dev --api-only` on a free
//! loopback port, claims allocated the way the scheduler writes them, a fixed device
//! inventory, and a DRA v1 client on the plugin's socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use netclaim::claims::metadata::DeviceMetadata;
use netclaim::claims::{ClaimService, ServiceIdentity};
use netclaim::k8s::claims::KubeClaims;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use netclaim::kubelet::{KubeletPlugin, KubeletPluginConfig, KubeletPluginHandle};
use netclaim::store::Store;
use netclaim::testing::devices::{FixedDevices, if_name_attribute};
use netclaim::testing::facts::{FactsBuilder as _, physical_nic};
use serde_json::{Value, json};
use tokio::net::UnixStream;

use super::dev_api::DevApiServer;
use super::kubelet::tonic_channel;

pub use super::DRIVER;
pub const NODE: &str = "node-a";

/// `netclaim dev --api-only` as a child process (stopped on drop) with an admin client.
pub struct DevApi {
    server: DevApiServer,
    pub client: kube::Client,
}

impl DevApi {
    pub async fn start() -> Self {
        let server = DevApiServer::start();
        let client = server.client().await;
        Self { server, client }
    }

    /// The server's temp dir, which the claim tests also use for their state and plugin dirs.
    pub fn dir(&self) -> &Path {
        self.server.dir.path()
    }

    /// Creates a claim with one request per entry of `results`, then writes its allocation
    /// and reservation as the scheduler does (`status` subresource). `results` are
    /// `(request, device, shareID)`; `config` is the claim's own NetworkConfig (applied to
    /// every request) on top of a class entry setting macvlan mode.
    pub async fn allocated_claim(
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

    pub async fn delete_claim(&self, name: &str) {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
}

/// `parameters` with our apiVersion and kind.
pub fn network_config(fields: Value) -> Value {
    let mut config = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
    let Value::Object(fields) = fields else { panic!("a NetworkConfig is an object") };
    config.as_object_mut().unwrap().extend(fields);
    config
}

/// This node's devices: `eth1` exclusive, `eth2` a shared parent, each published with its
/// name as `ifName`.
pub fn fixed_devices() -> FixedDevices {
    FixedDevices::new().device("eth1", physical_nic("eth1"), if_name_attribute("eth1")).device(
        "eth2",
        physical_nic("eth2").shared(),
        if_name_attribute("eth2"),
    )
}

pub type Service = ClaimService<KubeClaims, FixedDevices, Arc<Store>>;

/// The claim service on `state_dir` (reading claims from `api`, devices [`fixed_devices`],
/// device metadata written when `metadata` is given) and its store.
pub fn claim_service(
    api: &DevApi,
    state_dir: &Path,
    metadata: Option<Arc<DeviceMetadata>>,
) -> (Arc<Service>, Arc<Store>) {
    let store = Arc::new(Store::open(state_dir).unwrap());
    let mut service = ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        KubeClaims::new(api.client.clone()),
        fixed_devices(),
        Arc::clone(&store),
    )
    .unwrap();
    if let Some(metadata) = metadata {
        service = service.with_metadata(metadata).unwrap();
    }
    (Arc::new(service), store)
}

/// The kubelet plugin serving a claim service on `state_dir`, sockets under `sockets`.
pub struct Plugin {
    pub handle: KubeletPluginHandle,
    pub service: Arc<Service>,
    /// The service's store (its `syncs` count what a burst cost the disk).
    pub store: Arc<Store>,
}

impl Plugin {
    pub async fn start(api: &DevApi, state_dir: &Path, sockets: &Path) -> Self {
        let (service, store) = claim_service(api, state_dir, None);
        let config =
            KubeletPluginConfig::new(DRIVER, sockets.join("registry"), sockets.join("plugin"));
        let handle = KubeletPlugin::start(config, Arc::clone(&service), std::future::pending())
            .await
            .unwrap();
        Self { handle, service, store }
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.handle.dra_socket().to_owned()
    }

    pub async fn stop(self) {
        self.handle.stop();
        self.handle.wait().await.unwrap();
    }
}

/// A DRA v1 client on `socket`, as kubelet connects.
pub async fn dra_client(
    socket: &Path,
) -> v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
    v1::dra_plugin_client::DraPluginClient::new(tonic_channel(socket).await)
}

/// A DRA client once the plugin's socket accepts connections (a restarted daemon's socket
/// file may still be the dead one's until it registers again), waiting at most `patience`.
pub async fn dra_client_when_listening(
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
pub fn claim_ref(claim: &ResourceClaim) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        name: claim.metadata.name.clone().unwrap(),
        uid: claim.metadata.uid.clone().unwrap(),
    }
}
