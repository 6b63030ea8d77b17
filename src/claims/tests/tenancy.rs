//! Who may use a PodNetwork, at prepare ([`crate::claims::tenancy`]): a network's device
//! serves only claims naming that network; a network's `namespaceSelector` is judged on the
//! namespace's labels from the node's watch, failing closed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::networks::{FakeBlocks, FakeNetworks, medianet};
use super::*;
use crate::claims::networks::{IpBlockApi, NetworkPorts, PodNetworkSource};
use crate::claims::ports::{NamespaceReadError, NamespaceSource};
use crate::model::device::AttributeValue;

/// Namespaces by name with their labels; `None`: the watch has not synced.
#[derive(Default)]
struct FakeNamespaces(Mutex<Option<BTreeMap<String, BTreeMap<String, String>>>>);

impl FakeNamespaces {
    fn synced(namespaces: &[(&str, &[(&str, &str)])]) -> Self {
        let map = namespaces
            .iter()
            .map(|(name, labels)| {
                let labels =
                    labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
                ((*name).to_owned(), labels)
            })
            .collect();
        FakeNamespaces(Mutex::new(Some(map)))
    }
}

impl NamespaceSource for FakeNamespaces {
    fn labels(
        &self,
        name: &str,
    ) -> BoxFuture<'_, Result<BTreeMap<String, String>, NamespaceReadError>> {
        let answer = match &*self.0.lock().unwrap() {
            None => Err(NamespaceReadError::NotSynced),
            Some(all) => all.get(name).cloned().ok_or(NamespaceReadError::NotFound),
        };
        Box::pin(async move { answer })
    }
}

/// `eth2` a plain shared parent; `medianet-eth2` and `othernet-eth2` the devices of two
/// networks on it, published with their `podNetwork` attribute.
fn devices() -> FixedDevices {
    let tagged = |network: &str| {
        let mut attributes = if_name_attribute("eth2");
        attributes.insert("netclaim.dev/podNetwork".into(), AttributeValue::String(network.into()));
        attributes
    };
    FixedDevices::new()
        .device("eth2", physical_nic("eth2").shared(), if_name_attribute("eth2"))
        .device("medianet-eth2", physical_nic("eth2").shared(), tagged("medianet"))
        .device("othernet-eth2", physical_nic("eth2").shared(), tagged("othernet"))
}

fn networks_service(
    api: &Arc<MapClaims>,
    dir: &std::path::Path,
    networks: &Arc<FakeNetworks>,
    namespaces: Option<Arc<FakeNamespaces>>,
) -> ClaimService<Arc<MapClaims>, FixedDevices, Arc<Store>> {
    let store = Arc::new(Store::open(dir).unwrap());
    let service = ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(api),
        devices(),
        store,
    )
    .unwrap()
    .with_pod_networks(NetworkPorts {
        networks: Arc::clone(networks) as Arc<dyn PodNetworkSource>,
        blocks: Arc::new(FakeBlocks::default()) as Arc<dyn IpBlockApi>,
        release_grace: Duration::from_mins(10),
    });
    match namespaces {
        Some(source) => service.with_namespaces(source as Arc<dyn NamespaceSource>),
        None => service,
    }
}

/// A claim in `namespace` allocated `device`, its class config `class` (none: no entry).
fn tenant_claim(namespace: &str, name: &str, device: &str, class: Option<Value>) -> ResourceClaim {
    let mut claim = claim(
        name,
        &format!("uid-{name}"),
        vec![result("net", DRIVER, NODE, device)],
        class.into_iter().map(|c| config("FromClass", DRIVER, &[], params(c))).collect(),
    );
    claim.metadata.namespace = Some(namespace.into());
    claim
}

async fn prepare_in(
    service: &impl ClaimPreparer,
    namespace: &str,
    name: &str,
) -> Result<(), String> {
    let claim =
        ClaimRef { namespace: namespace.into(), name: name.into(), uid: format!("uid-{name}") };
    let mut answers = service.prepare(vec![claim]).await;
    answers.remove(&format!("uid-{name}")).unwrap().map(|_| ()).map_err(|e| e.message)
}

#[tokio::test]
async fn a_networks_device_serves_only_claims_naming_that_network() {
    let api = Arc::new(MapClaims::default());
    let dir = tempfile::tempdir().unwrap();
    let networks = Arc::new(FakeNetworks::default());
    networks.put(medianet(json!({})));
    let service = networks_service(&api, dir.path(), &networks, None);
    // A plain macvlan claim (a generic class) that the scheduler gave the network's device:
    // before, it got a node-local address on the network's L2.
    let plain = json!({"mode": "macvlan", "ipam": {"pool": {"subnet": "10.9.0.0/24"}}});
    api.put(tenant_claim("default", "plain", "medianet-eth2", Some(plain.clone())));
    let err = prepare_in(&service, "default", "plain").await.unwrap_err();
    assert!(
        err.starts_with("request ")
            && err.contains("device medianet-eth2 belongs to PodNetwork medianet")
            && err.contains("names no PodNetwork"),
        "{err}"
    );
    // A claim naming another network on this network's device.
    api.put(tenant_claim(
        "default",
        "other",
        "medianet-eth2",
        Some(json!({"podNetwork": "othernet"})),
    ));
    let err = prepare_in(&service, "default", "other").await.unwrap_err();
    assert!(
        err.starts_with("request ")
            && err.contains("belongs to PodNetwork medianet")
            && err.contains("names PodNetwork othernet"),
        "{err}"
    );
    assert!(service.prepared_uids().is_empty(), "refused claims keep nothing");
    // The network's own claim on its device, and the plain claim on the plain parent.
    api.put(tenant_claim(
        "default",
        "own",
        "medianet-eth2",
        Some(json!({"podNetwork": "medianet"})),
    ));
    prepare_in(&service, "default", "own").await.unwrap();
    api.put(tenant_claim("default", "plain2", "eth2", Some(plain)));
    prepare_in(&service, "default", "plain2").await.unwrap();
    // The attributes read for the check are not kept where device metadata is off.
    assert!(service.prepared("uid-own").unwrap().devices[0].attributes.is_empty());
}

#[tokio::test]
async fn a_namespace_selector_admits_only_selected_namespaces_and_fails_closed() {
    let api = Arc::new(MapClaims::default());
    let networks = Arc::new(FakeNetworks::default());
    networks.put(medianet(json!({"namespaceSelector": {
        "matchLabels": {"team": "media"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["sandbox"]}]
    }})));
    let namespaces = Arc::new(FakeNamespaces::synced(&[
        ("media", &[("team", "media")]),
        ("media-sandbox", &[("team", "media"), ("tier", "sandbox")]),
        ("web", &[("team", "web")]),
    ]));
    let dir = tempfile::tempdir().unwrap();
    let service = networks_service(&api, dir.path(), &networks, Some(Arc::clone(&namespaces)));
    let named = Some(json!({"podNetwork": "medianet"}));
    for namespace in ["media", "media-sandbox", "web", "unknown"] {
        api.put(tenant_claim(namespace, &format!("c-{namespace}"), "medianet-eth2", named.clone()));
    }
    prepare_in(&service, "media", "c-media").await.unwrap();
    for (namespace, why) in [
        (
            "media-sandbox",
            "namespace media-sandbox is not selected by the PodNetwork's spec.namespaceSelector",
        ),
        ("web", "namespace web is not selected"),
        ("unknown", "namespace unknown: no Namespace of this name is known to the node"),
    ] {
        let err = prepare_in(&service, namespace, &format!("c-{namespace}")).await.unwrap_err();
        assert!(err.contains("podNetwork medianet") && err.contains(why), "{namespace}: {err}");
    }
    // The watch not synced yet (a daemon that just started): refused, kubelet retries.
    *namespaces.0.lock().unwrap() = None;
    api.put(tenant_claim("media", "c-late", "medianet-eth2", named.clone()));
    let err = prepare_in(&service, "media", "c-late").await.unwrap_err();
    assert!(err.contains("podNetwork medianet") && err.contains("not synced"), "{err}");
    // A node without a namespace watch refuses every claim of a network with a selector,
    // and still serves a network without one.
    let dir = tempfile::tempdir().unwrap();
    let unwatched = networks_service(&api, dir.path(), &networks, None);
    let err = prepare_in(&unwatched, "media", "c-media").await.unwrap_err();
    assert!(err.contains("does not watch Namespaces"), "{err}");
    networks.put(medianet(json!({"namespaceSelector": {}})));
    prepare_in(&unwatched, "web", "c-web").await.unwrap();
}
