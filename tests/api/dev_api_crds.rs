//! `netclaim dev --api-only` serves the project's CustomResourceDefinitions
//! (`deploy/crds/`): they are Established before the kubeconfig appears, PodNetworks and
//! IPBlocks are served with their schemas' defaults, and a PodNetwork with a bad CIDR is
//! refused by its CEL rule, naming the field. Needs no root.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use crate::kit::dev_api::DevApiServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_only_serves_the_project_crds_and_their_rules() {
    let server = DevApiServer::start();
    let client = server.client().await;

    // Both definitions are there and Established before the kubeconfig was written.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["podnetworks.netclaim.dev", "ipblocks.netclaim.dev"] {
        let crd = crds.get(name).await.unwrap();
        let conditions = crd.status.unwrap().conditions.unwrap();
        assert!(
            conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"),
            "{name}"
        );
    }

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("netclaim.dev", "v1alpha1", "PodNetwork"),
        "podnetworks",
    );
    let networks: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let network = |name: &str, subnets: &[&str]| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
            "metadata": {"name": name},
            "spec": {"mode": "macvlan", "parents": ["eth1"], "ipam": {"subnets": subnets}}}))
        .unwrap()
    };
    let created =
        networks.create(&PostParams::default(), &network("good", &["10.10.0.0/16"])).await.unwrap();
    // The schema's defaults were applied.
    assert_eq!(created.data["spec"]["enabled"], true);
    assert_eq!(created.data["spec"]["ipam"]["blockSize"], json!({"ipv4": 26, "ipv6": 120}));

    let refused = networks
        .create(&PostParams::default(), &network("bad", &["10.10.0.0/33"]))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = refused else { panic!("expected an API error, got {refused}") };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{status:?}");
    let causes = status.details.unwrap().causes;
    assert!(
        causes.iter().any(|c| c.field == "spec.ipam.subnets[0]"
            && c.message
                == "Invalid value: \"10.10.0.0/33\": must be a CIDR (10.10.0.0/16, fd00:10::/64)"),
        "{causes:?}"
    );
    assert!(networks.get_opt("bad").await.unwrap().is_none());

    // IPBlocks, with their selectable fields.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("netclaim.dev", "v1alpha1", "IPBlock"),
        "ipblocks",
    );
    let blocks: Api<DynamicObject> = Api::all_with(client, &ar);
    let block: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "IPBlock",
        "metadata": {"name": "good-10-10-0-0-26"},
        "spec": {"podNetwork": "good", "cidr": "10.10.0.0/26", "nodeName": "node-1"}}))
        .unwrap();
    blocks.create(&PostParams::default(), &block).await.unwrap();
    let on_node = blocks.list(&ListParams::default().fields("spec.nodeName=node-1")).await.unwrap();
    assert_eq!(on_node.items.len(), 1);
    drop(server);
}
