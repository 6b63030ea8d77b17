//! Who may use a PodNetwork and what may change on a live one (DESIGN §4, decision 0017),
//! against the in-process API server, which evaluates the CRD's CEL rules as Kubernetes does:
//! `staticRanges` are immutable, inside a subnet and whole blocks; a gateway added to a live
//! network must lie inside `staticRanges`, a removed one is fine; `exclude` changes freely.
//! The shipped generic DeviceClasses leave a network's devices out, and the node's Namespace
//! cache follows the namespaces' labels.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube_inmemory::apiserver::{ServerOptions, start};
use netclaim::model::pod_network::PodNetwork;
use serde_json::{Value, json};

use crate::kit::api_server::{client_for, install_crds};

fn network(name: &str, ipam: &Value) -> PodNetwork {
    serde_json::from_value(json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
        "metadata": {"name": name},
        "spec": {"parents": ["eth1"], "ipam": ipam}}))
    .unwrap()
}

/// The field and message of a 422, or `None` when the write was accepted.
fn refusal(result: Result<PodNetwork, kube::Error>) -> Option<(String, String)> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) if status.code == 422 => {
            let cause = status.details.unwrap().causes.into_iter().next().unwrap();
            Some((cause.field, cause.message))
        }
        Err(other) => panic!("not a validation error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_ranges_are_immutable_and_gateways_are_added_only_inside_them() {
    let server = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let client = client_for(&server);
    install_crds(&client).await;
    let api: Api<PodNetwork> = Api::all(client);
    let base = json!({"subnets": ["10.10.0.0/16"], "gateways": ["10.10.0.1"],
        "exclude": ["10.10.0.0/24"], "staticRanges": ["10.10.1.0/24"]});
    api.create(&PostParams::default(), &network("medianet", &base)).await.unwrap();

    // At create: inside a subnet, whole blocks.
    let outside =
        network("n2", &json!({"subnets": ["10.20.0.0/16"], "staticRanges": ["10.21.0.0/24"]}));
    let (field, message) = refusal(api.create(&PostParams::default(), &outside).await).unwrap();
    assert_eq!(field, "spec.ipam.staticRanges", "{message}");
    assert!(message.contains("inside one of the subnets"), "{message}");
    let split =
        network("n3", &json!({"subnets": ["10.30.0.0/16"], "staticRanges": ["10.30.1.0/28"]}));
    let (field, message) = refusal(api.create(&PostParams::default(), &split).await).unwrap();
    assert_eq!(field, "spec.ipam.staticRanges", "{message}");
    assert!(message.contains("whole blocks"), "{message}");

    let edit = |ipam: Value| {
        let api = api.clone();
        async move {
            let patch = json!({"spec": {"ipam": ipam}});
            api.patch("medianet", &PatchParams::default(), &Patch::Merge(&patch)).await
        }
    };
    // Immutable: changed, added to, or removed.
    for ranges in [json!(["10.10.2.0/24"]), json!(["10.10.1.0/24", "10.10.2.0/24"]), Value::Null] {
        let (field, message) = refusal(edit(json!({"staticRanges": ranges.clone()})).await)
            .unwrap_or_else(|| panic!("staticRanges {ranges} accepted"));
        assert_eq!(field, "spec.ipam.staticRanges", "{message}");
        assert!(message.contains("immutable"), "{message}");
    }
    // A gateway outside staticRanges added to the live network: refused (a pod may hold it).
    let (field, message) =
        refusal(edit(json!({"gateways": ["10.10.0.1", "fd00::1"]})).await).unwrap();
    assert_eq!(field, "spec.ipam.gateways", "{message}");
    let (field, _) = refusal(edit(json!({"gateways": ["10.10.5.1"]})).await).unwrap();
    assert_eq!(field, "spec.ipam.gateways");
    // Inside a static range: accepted; removing a gateway: accepted.
    assert_eq!(refusal(edit(json!({"gateways": ["10.10.1.1"]})).await), None);
    assert_eq!(refusal(edit(json!({"gateways": null})).await), None);
    // exclude: free both ways.
    assert_eq!(refusal(edit(json!({"exclude": ["10.10.0.0/24", "10.10.9.0/26"]})).await), None);
    assert_eq!(refusal(edit(json!({"exclude": null})).await), None);
    let now = api.get("medianet").await.unwrap();
    let ipam = now.spec.ipam.unwrap();
    assert_eq!(ipam.static_ranges, ["10.10.1.0/24"]);
    assert!(ipam.gateways.is_empty() && ipam.exclude.is_empty());
}

/// The selectors of the generic DeviceClasses the project ships (deploy/examples, the dev
/// example), as the in-process allocator evaluates them.
fn shipped_generic_selectors() -> Vec<(String, kube_inmemory::allocator::selector::Selector)> {
    let root = crate::kit::repo();
    let mut selectors = Vec::new();
    for file in [
        "deploy/examples/deviceclass-macvlan.yaml",
        "deploy/examples/deviceclass-host-device.yaml",
        "examples/dev/macvlan-pod.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        // The class is the first document of each file.
        let first = text.split("\n---").next().unwrap();
        let class: k8s_openapi::api::resource::v1::DeviceClass =
            yaml_serde::from_str(first).unwrap();
        for selector in class.spec.unwrap().selectors.unwrap() {
            let expression = selector.cel.unwrap().expression;
            let compiled = kube_inmemory::allocator::selector::Selector::compile(&expression)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            selectors.push((file.to_owned(), compiled));
        }
    }
    selectors
}

/// A device of netclaim.dev as the node publishes it (unqualified names of its domain).
fn device(
    name: &str,
    sharing: &str,
    pod_network: Option<&str>,
) -> k8s_openapi::api::resource::v1::Device {
    use k8s_openapi::api::resource::v1::DeviceAttribute;
    let text = |s: &str| DeviceAttribute { string: Some(s.to_owned()), ..Default::default() };
    let mut attributes = std::collections::BTreeMap::from([
        ("sharing".to_owned(), text(sharing)),
        ("type".to_owned(), text("physical")),
        ("operState".to_owned(), text("up")),
        ("ifName".to_owned(), text("eth1")),
    ]);
    if let Some(network) = pod_network {
        attributes.insert("podNetwork".to_owned(), text(network));
    }
    k8s_openapi::api::resource::v1::Device {
        name: name.to_owned(),
        attributes: Some(attributes),
        ..Default::default()
    }
}

#[test]
fn the_shipped_generic_classes_do_not_select_a_pod_networks_devices() {
    let selectors = shipped_generic_selectors();
    assert_eq!(selectors.len(), 3);
    for (file, selector) in &selectors {
        let sharing = if file.contains("host-device") { "exclusive" } else { "shared" };
        let plain = device("eth1", sharing, None);
        assert!(selector.matches("netclaim.dev", &plain).unwrap(), "{file}: the plain device");
        let tagged = device("medianet-eth1", sharing, Some("medianet"));
        assert!(
            !selector.matches("netclaim.dev", &tagged).unwrap(),
            "{file} selects a PodNetwork's device: {}",
            selector.expression()
        );
    }
}

/// The node's Namespace cache (`k8s::namespaces`) against the in-process API server: labels
/// from the list, changes from the watch; an unknown namespace and a watch that never syncs
/// are errors (the prepare then fails closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_cache_follows_labels_and_fails_closed() {
    use k8s_openapi::api::core::v1::Namespace;
    use netclaim::claims::ports::{NamespaceReadError, NamespaceSource};
    use netclaim::k8s::namespaces::spawn_watch;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    let server = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let client = client_for(&server);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let media: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "media", "labels": {"team": "media"}}}))
            .unwrap();
    namespaces.create(&PostParams::default(), &media).await.unwrap();
    let stop = CancellationToken::new();
    let cache = spawn_watch(client.clone(), stop.clone(), Duration::from_secs(20));
    let labels = cache.labels("media").await.unwrap();
    assert_eq!(labels.get("team").map(String::as_str), Some("media"), "{labels:?}");
    // As a real API server does, every namespace carries its name as a label, which the
    // example network's namespaceSelector relies on.
    let example: netclaim::model::pod_network::PodNetwork = yaml_serde::from_str(
        &std::fs::read_to_string(crate::kit::repo().join("deploy/examples/podnetwork.yaml"))
            .unwrap(),
    )
    .unwrap();
    let selector = example.spec.namespace_selector.as_ref();
    for (namespace, selected) in [("default", true), ("media", true), ("kube-system", false)] {
        let labels = cache.labels(namespace).await.unwrap();
        assert_eq!(labels.get("kubernetes.io/metadata.name").map(String::as_str), Some(namespace));
        let verdict = netclaim::inventory::networks::selector_matches(selector, &labels);
        assert_eq!(verdict.unwrap(), selected, "{namespace}");
    }
    assert!(matches!(cache.labels("nope").await, Err(NamespaceReadError::NotFound)));
    // A label change arrives through the watch.
    let patch = json!({"metadata": {"labels": {"team": "web"}}});
    namespaces.patch("media", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let mut seen = None;
    for _ in 0..2000 {
        seen = cache.labels("media").await.unwrap().get("team").cloned();
        if seen.as_deref() == Some("web") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.as_deref(), Some("web"));
    stop.cancel();
    // A watch that never lists (no API server there): not synced once the patience is over.
    let nowhere =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let never = spawn_watch(nowhere, CancellationToken::new(), Duration::from_millis(50));
    assert!(matches!(never.labels("media").await, Err(NamespaceReadError::NotSynced)));
}
