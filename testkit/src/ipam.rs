//! Shared by `tests/api/podnetwork_ipam.rs` and `benches/ipam_blocks.rs`: the in-process API
//! server with the CRDs and one PodNetwork, claim services as "nodes" on it (the real
//! `IPBlock` adapter, counted, and the real PodNetwork watch), claims made up from their
//! names, and a shared parent.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use ipnetwork::IpNetwork;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use netclaim::claims::networks::{
    BlockApiError, Created, Deleted, IpBlockApi, NetworkPorts, PodNetworkSource,
};
use netclaim::claims::{ClaimPreparer, ClaimService, ServiceIdentity};
use netclaim::ipam::{Clock, ManualClock};
use netclaim::k8s::ip_blocks::{KubeIpBlocks, WatchedPodNetworks};
use netclaim::model::ClaimRef;
use netclaim::model::pod_network::{IpBlock, PodNetwork};
use netclaim::store::Store;
use netclaim::testing::claims::MapClaims;
use netclaim::testing::devices::FixedDevices;
use netclaim::testing::facts::{FactsBuilder as _, physical_nic};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::api_server::client_for;
pub use super::api_server::install_crds;

pub use super::DRIVER;
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Each claim's own NetworkConfig by claim name (none: `{}`), for [`made_up_claims`].
pub type Configs = Arc<std::sync::Mutex<HashMap<String, Value>>>;

/// Claims made up from their names: `<node>--<claim>` allocated `medianet-eth2` (a share of
/// `eth2`) on `<node>`, its class naming `medianet`, its own config from `configs` by claim
/// name (none: `{}`); a name without `--` is not found.
pub fn made_up_claims(configs: Configs) -> Arc<MapClaims> {
    Arc::new(MapClaims::made_by(move |namespace, name| made_up_claim(&configs, namespace, name)))
}

fn made_up_claim(configs: &Configs, namespace: &str, name: &str) -> Option<ResourceClaim> {
    let (node, claim) = name.split_once("--")?;
    let own = configs.lock().unwrap().get(claim).cloned().unwrap_or_else(|| json!({}));
    let params = |body: Value| {
        let mut v = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
        v.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        v
    };
    Some(
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}")},
            "spec": {},
            "status": {"allocation": {"devices": {
                "results": [{"request": "net", "driver": DRIVER, "pool": node, "device": "medianet-eth2",
                             "shareID": "3f1c0c3e-0000-4000-8000-000000000001"}],
                "config": [
                    {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params(json!({"podNetwork": "medianet"}))}},
                    {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params(own)}}
                ]
            }}}
        }))
        .unwrap(),
    )
}

/// Every device is `medianet-eth2`'s parent: `eth2`, shared, published without attributes.
pub fn parent() -> FixedDevices {
    FixedDevices::any(physical_nic("eth2").shared(), BTreeMap::new())
}

/// The real adapter, counting its calls.
pub struct Counted {
    inner: KubeIpBlocks,
    pub creates: AtomicUsize,
    pub lost_races: AtomicUsize,
    pub lists: AtomicUsize,
    pub deletes: AtomicUsize,
}

impl Counted {
    /// Every request this node made to the API for its blocks (a lost race is a create and a
    /// get).
    pub fn requests(&self) -> usize {
        [&self.creates, &self.lost_races, &self.lists, &self.deletes]
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }
}

impl IpBlockApi for Counted {
    fn list_node(&self, node: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list_node(node)
    }

    fn list_network(&self, network: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list_network(network)
    }

    fn create(&self, block: IpBlock) -> BoxFuture<'_, Result<Created, BlockApiError>> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let answer = self.inner.create(block).await?;
            if matches!(answer, Created::Exists(_)) {
                self.lost_races.fetch_add(1, Ordering::SeqCst);
            }
            Ok(answer)
        })
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Deleted, BlockApiError>> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(name, uid)
    }
}

pub type Service = ClaimService<Arc<MapClaims>, FixedDevices, Arc<Store>>;

pub struct Cluster {
    pub server: ApiServer,
    pub client: kube::Client,
    pub networks: Arc<WatchedPodNetworks>,
    pub claims: Arc<MapClaims>,
    /// The claims' own configs ([`made_up_claims`]).
    pub configs: Configs,
    pub clock: Arc<ManualClock>,
    pub stop: CancellationToken,
}

pub struct Node {
    pub name: String,
    pub service: Arc<Service>,
    pub blocks: Arc<Counted>,
}

impl Cluster {
    pub async fn start(network: Value) -> Cluster {
        let server = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
        let client = client_for(&server);
        install_crds(&client).await;
        let networks: Api<PodNetwork> = Api::all(client.clone());
        let object: PodNetwork = serde_json::from_value(
            json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
                "metadata": {"name": "medianet"}, "spec": network}),
        )
        .unwrap();
        networks.create(&PostParams::default(), &object).await.unwrap();
        let stop = CancellationToken::new();
        let receiver = netclaim::k8s::pod_networks::spawn_watch(client.clone(), stop.clone());
        let configs = Configs::default();
        Cluster {
            server,
            client,
            networks: Arc::new(WatchedPodNetworks::new(receiver, PATIENCE)),
            claims: made_up_claims(Arc::clone(&configs)),
            configs,
            clock: Arc::new(ManualClock::at(1_700_000_000_000)),
            stop,
        }
    }

    pub fn node(&self, name: &str, state_dir: &Path) -> Node {
        let blocks = Arc::new(Counted {
            inner: KubeIpBlocks::new(self.client.clone()),
            creates: AtomicUsize::new(0),
            lost_races: AtomicUsize::new(0),
            lists: AtomicUsize::new(0),
            deletes: AtomicUsize::new(0),
        });
        let service = ClaimService::load_with_clock(
            ServiceIdentity { driver: DRIVER.into(), node: name.into() },
            Arc::clone(&self.claims),
            parent(),
            Arc::new(Store::open(state_dir).unwrap()),
            Arc::clone(&self.clock) as Arc<dyn Clock>,
        )
        .unwrap()
        .with_pod_networks(NetworkPorts {
            networks: Arc::clone(&self.networks) as Arc<dyn PodNetworkSource>,
            blocks: Arc::clone(&blocks) as Arc<dyn IpBlockApi>,
            release_grace: Duration::from_mins(10),
        });
        Node { name: name.into(), service: Arc::new(service), blocks }
    }

    pub async fn blocks(&self) -> Vec<IpBlock> {
        let api: Api<IpBlock> = Api::all(self.client.clone());
        api.list(&ListParams::default()).await.unwrap().items
    }

    pub async fn stop(self) {
        self.stop.cancel();
        self.server.shutdown().await.unwrap();
    }
}

pub fn claim_ref(node: &str, claim: &str) -> ClaimRef {
    let name = format!("{node}--{claim}");
    ClaimRef { namespace: "default".into(), uid: format!("uid-{name}"), name }
}

/// Prepares `claims` on `node` in batches of 8 (as kubelet sends a pod's claims); the
/// addresses each got.
pub async fn prepare_all(node: &Node, claims: &[String]) -> Vec<(String, Vec<IpNetwork>)> {
    let mut out = Vec::new();
    for batch in claims.chunks(8) {
        let refs: Vec<ClaimRef> = batch.iter().map(|c| claim_ref(&node.name, c)).collect();
        let results = node.service.prepare(refs.clone()).await;
        for claim in refs {
            if let Err(failure) = &results[&claim.uid] {
                panic!("{}: {}", claim.name, failure.message);
            }
            let prepared = node.service.prepared(&claim.uid).unwrap();
            out.push((claim.name, prepared.devices[0].addresses.clone()));
        }
    }
    out
}
