//! NodePrepareResources / NodeUnprepareResources through the real DRA socket against
//! `netclaim dev --api-only` (no root): claims allocated as the scheduler writes them,
//! idempotency, config errors naming the field, 50 claims in one request, a restarted
//! preparer on the same state dir, and unprepare releasing the address.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use netclaim::dev::kubelet::pod_status::Step;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use serde_json::json;

use crate::kit::claims::{DevApi, NODE, Plugin, claim_ref, dra_client, network_config};

const SHARE: &str = "3f1c0c3e-0000-4000-8000-000000000001";

fn pool_config() -> serde_json::Value {
    network_config(json!({"ipam": {"pool": {"subnet": "10.42.0.0/24", "gateway": "10.42.0.1"}}}))
}

async fn prepare(
    client: &mut v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    claims: Vec<v1::Claim>,
) -> v1::NodePrepareResourcesResponse {
    client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_is_idempotent_names_bad_fields_and_unprepare_releases_the_address() {
    let api = DevApi::start().await;
    let plugin = Plugin::start(&api, &api.dir().join("state"), api.dir()).await;
    let mut client = dra_client(&plugin.dra_socket()).await;

    let shared =
        api.allocated_claim("shared", &[("nic", "eth2", Some(SHARE))], Some(pool_config())).await;
    let first = prepare(&mut client, vec![claim_ref(&shared)]).await;
    let uid = shared.metadata.uid.clone().unwrap();
    let answer = &first.claims[&uid];
    assert_eq!(answer.error, "");
    assert_eq!(
        answer.devices,
        vec![v1::Device {
            request_names: vec!["nic".into()],
            pool_name: NODE.into(),
            device_name: "eth2".into(),
            cdi_device_ids: vec![],
            share_id: Some(SHARE.into()),
        }]
    );
    let prepared = plugin.service.prepared(&uid).unwrap();
    assert_eq!(
        prepared.devices[0].addresses,
        vec!["10.42.0.2/24".parse().unwrap()],
        "gateway skipped"
    );

    // The same call again: the same answer.
    let second = prepare(&mut client, vec![claim_ref(&shared)]).await;
    assert_eq!(first, second);

    // A config error names the field path and the value.
    let long = api
        .allocated_claim(
            "long",
            &[("nic", "eth2", Some(SHARE))],
            Some(network_config(json!({"interface": {"name": "this-name-is-far-too-long"}}))),
        )
        .await;
    let response = prepare(&mut client, vec![claim_ref(&long)]).await;
    let error = &response.claims[long.metadata.uid.as_ref().unwrap()].error;
    assert!(error.starts_with("request nic, device eth2: interface.name:"), "{error}");
    assert!(error.contains("this-name-is-far-too-long"), "{error}");
    // kubelet names the claim in front of the driver's message ("NodePrepareResources failed
    // for ResourceClaim <name>: <message>", pkg/kubelet/cm/dra/manager.go): not again here.
    assert!(!error.contains("default/long"), "{error}");
    // The dev kubelet's pod condition for it names the call and the claim once each.
    let dev_kubelet = netclaim::dev::kubelet::dra_client::DraClient::connect_lazy(
        &plugin.dra_socket(),
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    let reference = netclaim::model::ClaimRef {
        namespace: "default".into(),
        name: "long".into(),
        uid: long.metadata.uid.clone().unwrap(),
    };
    let refused = dev_kubelet.prepare(&[reference]).await.unwrap_err();
    let message = format!("{}: {refused}", Step::Prepare.describe());
    assert!(message.starts_with("NodePrepareResources: ResourceClaim default/long: "), "{message}");
    assert_eq!(message.matches("NodePrepareResources").count(), 1, "{message}");
    assert_eq!(message.matches("long:").count(), 1, "{message}");

    // A stale UID (claim re-created under the same name) is refused.
    let mut stale = claim_ref(&shared);
    stale.uid = "00000000-0000-0000-0000-000000000000".into();
    let response = prepare(&mut client, vec![stale.clone()]).await;
    assert!(response.claims[&stale.uid].error.starts_with("uid mismatch"));

    // Unprepare releases the address, which is quarantined for 30 s (DESIGN §4): the next
    // claim gets the one after it; unknown claims succeed.
    let unprepared = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref(&shared), stale.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims.len(), 2);
    assert!(unprepared.claims.values().all(|c| c.error.is_empty()), "{unprepared:?}");
    assert!(plugin.service.prepared(&uid).is_none());
    let next =
        api.allocated_claim("next", &[("nic", "eth2", Some(SHARE))], Some(pool_config())).await;
    let response = prepare(&mut client, vec![claim_ref(&next)]).await;
    assert_eq!(response.claims[next.metadata.uid.as_ref().unwrap()].error, "");
    let next_uid = next.metadata.uid.clone().unwrap();
    assert_eq!(
        plugin.service.prepared(&next_uid).unwrap().devices[0].addresses,
        vec!["10.42.0.3/24".parse().unwrap()],
        "the released address is not handed out again at once"
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_claims_in_one_request() {
    let api = DevApi::start().await;
    let plugin = Plugin::start(&api, &api.dir().join("state"), api.dir()).await;
    let mut client = dra_client(&plugin.dra_socket()).await;
    let mut refs = Vec::new();
    for i in 0..50 {
        let share = format!("3f1c0c3e-0000-4000-8000-{i:012}");
        let claim = api
            .allocated_claim(
                &format!("c{i}"),
                &[("nic", "eth2", Some(&share))],
                Some(pool_config()),
            )
            .await;
        refs.push(claim_ref(&claim));
    }
    let response = prepare(&mut client, refs.clone()).await;
    assert_eq!(response.claims.len(), 50);
    let mut addresses = Vec::new();
    for (i, claim) in refs.iter().enumerate() {
        let answer = &response.claims[&claim.uid];
        assert_eq!(answer.error, "", "claim {i}");
        assert_eq!(
            answer.devices[0].share_id.as_deref(),
            Some(format!("3f1c0c3e-0000-4000-8000-{i:012}").as_str())
        );
        addresses.extend(plugin.service.prepared(&claim.uid).unwrap().devices[0].addresses.clone());
    }
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), 50, "every claim has its own address");
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_preparer_still_knows_the_claim() {
    let api = DevApi::start().await;
    let state = api.dir().join("state");
    let plugin = Plugin::start(&api, &state, api.dir()).await;
    let mut client = dra_client(&plugin.dra_socket()).await;
    let claim = api
        .allocated_claim(
            "keep",
            &[("nic", "eth1", None)],
            Some(network_config(json!({"mode": "host-device"}))),
        )
        .await;
    let first = prepare(&mut client, vec![claim_ref(&claim)]).await;
    assert_eq!(first.claims[claim.metadata.uid.as_ref().unwrap()].error, "");
    plugin.stop().await;

    // The claim is gone from the API: only the state dir can answer now.
    api.delete_claim("keep").await;
    let plugin = Plugin::start(&api, &state, api.dir()).await;
    let mut client = dra_client(&plugin.dra_socket()).await;
    let again = prepare(&mut client, vec![claim_ref(&claim)]).await;
    assert_eq!(first, again);
    let unprepared = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref(&claim)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unprepared.claims.values().all(|c| c.error.is_empty()));
    plugin.stop().await;
    let plugin = Plugin::start(&api, &state, api.dir()).await;
    assert!(plugin.service.prepared_uids().is_empty(), "unprepare was durable");
    plugin.stop().await;
}
