//! `netclaim dev` (the whole single-node cluster, bare netns mode) driven like a user would:
//! objects created through the API, pods watched until they settle, then deleted.
//!
//! The binary runs inside a throwaway netns holding a veth pair as the node's only NICs; an
//! `nri_logger` example plugin refuses the containers of one pod. Checks: claims are made
//! from the template with the pod as controller owner and recorded in the pod status; the
//! allocated claim is reserved for its pod; the accepted pod goes Running/Ready with a pinned
//! netns; the refused pod ends Failed with a condition naming `CreateContainer` and the
//! plugin's message (after retries); kubectl shows kubectl-like columns; deleting the pods
//! tears everything down (netns unpinned, generated claims deleted); SIGTERM stops the
//! process and removes its run dir.
//!
//! Needs root: `#[ignore]`d, run by `make test` as root.

#![allow(clippy::unwrap_used, reason = "a failed step fails the test")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::kit;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const WAIT: Duration = Duration::from_mins(1);

/// The `nri_logger` example, built with the tests (or named by `NETCLAIM_NRI_LOGGER`).
fn nri_logger() -> PathBuf {
    if let Some(path) = std::env::var_os("NETCLAIM_NRI_LOGGER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let built = exe.parent().and_then(Path::parent).unwrap().join("examples/nri_logger");
    if !built.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "nri-rs", "--example", "nri_logger"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "building the nri_logger example failed");
    }
    built
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn wait_async<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn objects(parent: &str) -> Vec<serde_json::Value> {
    let pod = |name: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "containers": [{"name": "app", "image": "pause"}],
                "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "mv"}],
            },
        })
    };
    vec![
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "nc"},
            "spec": {"selectors": [{"cel": {"expression": format!(
                "device.driver == \"netclaim.dev\" && device.attributes[\"netclaim.dev\"].ifName == \"{parent}\""
            )}}]},
        }),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "mv", "namespace": "default"},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "net", "exactly": {"deviceClassName": "nc"}}],
                "config": [{"opaque": {"driver": "netclaim.dev", "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                    "mode": "macvlan", "ipam": {"pool": {"subnet": "10.10.7.0/24"}},
                }}}],
            }}},
        }),
        // KEP-5004: a class that pods can ask for as an extended resource, its config the
        // only config of the implicit claim.
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "nc-ext"},
            "spec": {
                "extendedResourceName": "netclaim.dev/macvlan",
                "selectors": [{"cel": {"expression": format!(
                    "device.driver == \"netclaim.dev\" && device.attributes[\"netclaim.dev\"].ifName == \"{parent}\""
                )}}],
                "config": [{"opaque": {"driver": "netclaim.dev", "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                    "mode": "macvlan", "ipam": {"pool": {"subnet": "10.10.8.0/24"}},
                }}}],
            },
        }),
        pod("accepted"),
        pod("refused"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "extended", "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "pause",
                "resources": {"limits": {"netclaim.dev/macvlan": "1"}}}]},
        }),
    ]
}

fn condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

/// Creates the objects, waits for both pods to settle, checks them and deletes them.
async fn scenario(kubeconfig_in: PathBuf, parent_in: String, netns_dir_in: PathBuf) {
    let client = netclaim::k8s::client(Some(&kubeconfig_in)).await.unwrap();
    for object in objects(&parent_in) {
        let resource: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        let gvk = kube::api::GroupVersionKind::try_from(resource.types.as_ref().unwrap()).unwrap();
        let (ar, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
        let api: Api<kube::api::DynamicObject> = match &resource.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        api.create(&PostParams::default(), &resource).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");

    let accepted = wait_async("the accepted pod to run", async || {
        let pod = pods.get("accepted").await.ok()?;
        let ready = condition(&pod, "Ready").is_some_and(|c| c.status == "True");
        (pod.status.as_ref()?.phase.as_deref() == Some("Running") && ready).then_some(pod)
    })
    .await;
    let refused = wait_async("the refused pod to fail", async || {
        let pod = pods.get("refused").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(pod)
    })
    .await;
    let ready = condition(&refused, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("CreateContainerError"), "{ready:?}");
    let message = ready.message.as_deref().unwrap();
    assert!(
        message.starts_with("CreateContainer: NRI plugin 60-refuser failed CreateContainer")
            && message.contains("refuses containers of pod default/refused"),
        "{message}"
    );

    // The retries are Warning Events on the pod, visible to `kubectl describe pod` (core v1,
    // field selector on involvedObject).
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let selector = format!(
        "involvedObject.name=refused,involvedObject.uid={}",
        refused.metadata.uid.as_deref().unwrap()
    );
    let warnings = events.list(&ListParams::default().fields(&selector)).await.unwrap().items;
    assert!(
        warnings.iter().any(|e| e.type_.as_deref() == Some("Warning")
            && e.reason.as_deref() == Some("CreateContainerError")
            && e.message.as_deref().is_some_and(|m| m.contains("refuses containers"))),
        "{warnings:#?}"
    );

    // The accepted pod's claim: generated, owned, recorded, allocated, reserved.
    let statuses = accepted.status.as_ref().unwrap().resource_claim_statuses.clone().unwrap();
    let claim_name = statuses[0].resource_claim_name.clone().unwrap();
    assert!(claim_name.starts_with("accepted-net-"), "{claim_name}");
    let claim = claims.get(&claim_name).await.unwrap();
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", "accepted"));
    assert_eq!(owner.uid, accepted.metadata.uid.clone().unwrap());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()["resource.kubernetes.io/pod-claim-name"],
        "net"
    );
    let status = claim.status.as_ref().unwrap();
    assert!(status.allocation.is_some());
    let reserved = status.reserved_for.as_ref().unwrap();
    assert_eq!(reserved.len(), 1);
    assert_eq!(reserved[0].uid, accepted.metadata.uid.clone().unwrap());
    let pinned = netns_dir_in.join(accepted.metadata.uid.as_deref().unwrap());
    assert!(pinned.exists(), "no pinned netns for the running pod");
    // The failed pod released its claim's reservation and its netns.
    let refused_netns = netns_dir_in.join(refused.metadata.uid.as_deref().unwrap());
    assert!(!refused_netns.exists());

    // The extended-resource pod: an implicit claim made, recorded, allocated with the
    // class config only, prepared and attached.
    let extended = wait_async("the extended-resource pod to run", async || {
        let pod = pods.get("extended").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await;
    let recorded =
        extended.status.as_ref().unwrap().extended_resource_claim_status.clone().unwrap();
    assert_eq!(recorded.request_mappings.len(), 1);
    assert_eq!(recorded.request_mappings[0].request_name, "container-0-request-0");
    assert_eq!(recorded.request_mappings[0].resource_name, "netclaim.dev/macvlan");
    let implicit = claims.get(&recorded.resource_claim_name).await.unwrap();
    assert!(recorded.resource_claim_name.starts_with("extended-extended-resources-"));
    assert_eq!(
        implicit.metadata.annotations.as_ref().unwrap()["resource.kubernetes.io/extended-resource-claim"],
        "true"
    );
    let allocation = implicit.status.as_ref().unwrap().allocation.as_ref().unwrap();
    let config = allocation.devices.as_ref().unwrap().config.clone().unwrap_or_default();
    assert!(config.iter().all(|c| c.source == "FromClass"), "{config:?}");
    assert!(netns_dir_in.join(extended.metadata.uid.as_deref().unwrap()).exists());

    // Deleting tears everything down and the generated claims go with the pods.
    for name in ["accepted", "refused", "extended"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_async("the pods to go", async || {
        pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    wait_async("the generated claims to go", async || {
        claims.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    assert!(!pinned.exists(), "the pod netns is still pinned");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn dev_cluster_runs_accepts_refuses_and_tears_down_pods() {
    if !kit::netns::require_root("dev_kubelet") {
        return;
    }
    let ns = kit::netns::Netns::new();
    let parent = ns.ifname("p");
    let peer = ns.ifname("q");
    ns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
    ns.ip(&["link", "set", &parent, "up"]);
    ns.ip(&["link", "set", &peer, "up"]);
    let dir = tempfile::Builder::new().prefix("ncdevk").tempdir_in("/tmp").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let run_parent = dir.path().join("run");
    std::fs::create_dir(&run_parent).unwrap();
    let args: Vec<String> = [
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--node-name",
        "dev-node",
        "--include-interfaces",
        &parent,
        "--shared-parents",
        &parent,
        "--kubeconfig-out",
        kubeconfig.to_str().unwrap(),
        "--run-dir",
        run_parent.to_str().unwrap(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut dev = ns.spawn(NETCLAIM, &arg_refs, &dir.path().join("dev.log"));
    wait_for("the kubeconfig", || kubeconfig.exists());
    let run_dir = std::fs::read_dir(&run_parent).unwrap().flatten().next().unwrap().path();
    let nri_socket = run_dir.join("nri.sock");
    wait_for("the NRI socket", || nri_socket.exists());
    let logger_log = std::fs::File::create(dir.path().join("refuser.log")).unwrap();
    let logger = Command::new(nri_logger())
        .arg("--socket")
        .arg(&nri_socket)
        .args(["--index", "60", "--name", "refuser", "--refuse-pod", "refused"])
        .stdout(logger_log.try_clone().unwrap())
        .stderr(logger_log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let _logger = kit::netns::Child { child: logger };

    let kubeconfig_in = kubeconfig.clone();
    let parent_in = parent.clone();
    let netns_dir = run_dir.join("netns");
    let netns_dir_in = netns_dir.clone();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ns.block_on(move || scenario(kubeconfig_in, parent_in, netns_dir_in));
    }));
    if let Err(panic) = result {
        eprintln!(
            "netclaim dev log:\n{}",
            std::fs::read_to_string(dir.path().join("dev.log")).unwrap_or_default()
        );
        std::panic::resume_unwind(panic);
    }
    let took = dev.terminate(Duration::from_secs(30));
    assert!(took.is_some(), "netclaim dev did not stop on SIGTERM");
    assert!(!run_dir.exists(), "the run dir {} was left behind", run_dir.display());
    assert!(!kubeconfig.exists(), "the kubeconfig was left behind");
}
