//! Root tests of device health against the kernel, in throwaway network namespaces with
//! generated names (removed on drop, with every link in them; nothing outside them is
//! touched):
//!
//! - the health monitor with the real pod link watcher (`host::pod_links`): a NIC "moved into
//!   a pod" (a veth inside a throwaway netns) is watched by a netlink socket opened in that
//!   netns; link down there → Unhealthy within 2 s, link deleted → removed;
//! - the real `netclaim node` in a throwaway node netns (with `netclaim dev --api-only` and
//!   our NRI runtime): a published veth is Healthy on the `v1.DRAResourceHealth` stream read
//!   from `dra.sock` as kubelet reads it, link down → Unhealthy within 2 s; the same NIC moved
//!   into a pod by a host-device claim, link down inside the pod → Unhealthy within 2 s.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimConsumerReference};
use kube::Api;
use kube::api::PostParams;
use kube_inmemory::allocator::{AllocatorController, reserve_for};
use netclaim::health::{
    HealthReport, HealthStatus, MonitorInputs, MonitorSettings, MovedNic, run as monitor,
};
use netclaim::host::pod_links::PodLinkWatcher;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1 as dra;
use netclaim::kubelet::proto::v1;
use netclaim::model::device::{Device, DeviceKind, HostInterface, Sharing};
use nri_rs::{NriRuntime, PodSandbox, RuntimeOptions};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::kit;
use crate::kit::netns::{Child, Netns, node_daemon_args, require_root, start_api_server};

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
/// How fast a link change must reach the stream (the bound).
const HEALTH_LATENCY: Duration = Duration::from_secs(2);
/// Bound for setup steps; only keeps a broken build from hanging.
const PATIENCE: Duration = Duration::from_secs(20);

/// A host without interfaces: the NIC under test lives only "in the pod".
struct NoHostInterfaces;

#[derive(Debug, thiserror::Error)]
#[error("never fails")]
struct Never;

impl netclaim::inventory::publish::InterfaceSource for NoHostInterfaces {
    type Error = Never;

    async fn discover(&self) -> Result<Vec<HostInterface>, Never> {
        Ok(Vec::new())
    }
}

async fn wait_for_report(
    reports: &mut watch::Receiver<HealthReport>,
    what: &str,
    limit: Duration,
    check: impl Fn(&HealthReport) -> bool,
) -> (HealthReport, Duration) {
    let started = Instant::now();
    let mut waiting = reports.clone();
    let found = tokio::time::timeout(limit, waiting.wait_for(|r| check(r))).await;
    let Ok(found) = found else {
        panic!("{what}: not within {limit:?}; last report {:?}", *reports.borrow());
    };
    let found = found.unwrap().clone();
    reports.mark_unchanged();
    (found, started.elapsed())
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_nic_inside_a_pod_is_watched_in_its_netns() {
    if !require_root("a_nic_inside_a_pod_is_watched_in_its_netns") {
        return;
    }
    let pod = Netns::new();
    let (nic, peer) = (pod.ifname("a"), pod.ifname("b"));
    pod.ip(&["link", "add", &nic, "type", "veth", "peer", "name", &peer]);
    pod.ip(&["link", "set", &peer, "up"]);
    pod.ip(&["link", "set", &nic, "up"]);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let device = Device {
            name: "eth9".into(),
            if_name: "eth9".into(),
            kind: DeviceKind::Physical,
            sharing: Sharing::Exclusive,
            shared_capacity: None,
            bandwidth: None,
            slot_index: None,
            attributes: BTreeMap::new(),
        };
        let moved_nic = MovedNic {
            netns: Path::new("/run/netns").join(&pod.name),
            pod: "default/web".into(),
            if_name: nic.clone(),
        };
        let (_devices_tx, devices) = watch::channel(vec![device]);
        let (moved_tx, moved) = watch::channel(BTreeMap::from([("eth9".to_owned(), moved_nic)]));
        let (_links_tx, link_changes) = mpsc::channel(1);
        let (stop_tx, stop) = watch::channel(false);
        let (out, mut reports) = watch::channel(HealthReport::default());
        let task = tokio::spawn(monitor(
            MonitorSettings::new("node-a"),
            NoHostInterfaces,
            PodLinkWatcher::current().unwrap(),
            MonitorInputs { devices, moved, link_changes, stop },
            out,
        ));
        let status = |r: &HealthReport| r.devices.first().map(|d| (d.status, d.message.clone()));
        let (report, _) = wait_for_report(&mut reports, "Healthy in the pod", PATIENCE, |r| {
            status(r).is_some_and(|(s, _)| s == HealthStatus::Healthy)
        })
        .await;
        assert_eq!(
            report.devices[0].message,
            format!("eth9 ({nic} in pod default/web) is up with carrier")
        );

        pod.ip(&["link", "set", &nic, "down"]);
        let (report, took) =
            wait_for_report(&mut reports, "Unhealthy after link down", HEALTH_LATENCY, |r| {
                status(r).is_some_and(|(s, _)| s == HealthStatus::Unhealthy)
            })
            .await;
        assert_eq!(
            report.devices[0].message,
            format!("eth9 ({nic} in pod default/web) is administratively down (operstate down)")
        );
        println!("link down inside the pod → Unhealthy {took:?} after `ip` returned");

        pod.ip(&["link", "del", &nic]);
        let (_, took) = wait_for_report(&mut reports, "removed", HEALTH_LATENCY, |r| {
            status(r).is_some_and(|(_, m)| m.contains("was removed"))
        })
        .await;
        println!("link deleted inside the pod → removed {took:?} after `ip` returned");

        // The NIC leaves the pod: the watch is dropped; the host does not have it either.
        moved_tx.send(BTreeMap::new()).unwrap();
        let (report, _) = wait_for_report(&mut reports, "no longer in a pod", PATIENCE, |r| {
            status(r).is_some_and(|(_, m)| m == "eth9 was removed: the interface is gone")
        })
        .await;
        assert_eq!(report.devices.len(), 1);
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    });
}

// --- the daemon ---

/// The node: API server, NRI runtime socket, state and kubelet dirs, all in a throwaway netns.
struct Node {
    netns: Netns,
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    nri: Option<NriRuntime>,
    _api: Child,
}

impl Node {
    fn start() -> Self {
        let netns = Netns::new();
        let dir = tempfile::tempdir().unwrap();
        let api = start_api_server(&netns, NETCLAIM, dir.path(), &[]);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let socket = dir.path().join("nri.sock");
        let nri =
            runtime.block_on(async { NriRuntime::bind(RuntimeOptions::new(socket)).unwrap() });
        Self { netns, dir, runtime, nri: Some(nri), _api: api }
    }

    fn nri(&self) -> &NriRuntime {
        self.nri.as_ref().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default()
    }

    fn start_daemon(&self, include: &str) -> Child {
        let mut args = node_daemon_args(self.dir.path());
        args.extend([
            "--nri-socket".to_owned(),
            self.dir.path().join("nri.sock").to_str().unwrap().to_owned(),
            "--nri-plugin-index".to_owned(),
            "10".to_owned(),
            "--include-interfaces".to_owned(),
            include.to_owned(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = self.netns.spawn(NETCLAIM, &args, &self.dir.path().join("node.log"));
        let registered = self.runtime.block_on(self.nri().wait_for_plugins(1, PATIENCE));
        assert!(registered.is_ok(), "the daemon's NRI plugin did not register:\n{}", self.log());
        child
    }

    fn dra_socket(&self) -> PathBuf {
        self.dir.path().join("plugin").join("dra.sock")
    }

    /// Opens the v1 health stream as kubelet does and records every report it receives.
    fn watch_health(&self) -> Reports {
        let socket = self.dra_socket();
        let seen = Reports::default();
        let sink = seen.clone();
        self.runtime.spawn(async move {
            let deadline = Instant::now() + PATIENCE;
            while tokio::net::UnixStream::connect(&socket).await.is_err() {
                assert!(Instant::now() < deadline, "nothing listens on {}", socket.display());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let channel = kit::kubelet::tonic_channel(&socket).await;
            let mut client = v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
            let mut stream = client
                .node_watch_resources(v1::NodeWatchResourcesRequest {})
                .await
                .unwrap()
                .into_inner();
            while let Ok(Some(response)) = stream.message().await {
                sink.0.lock().unwrap().push((Instant::now(), response));
            }
        });
        seen
    }

    /// A host-device claim of `if_name` allocated and reserved for `pod`; returns its UID.
    fn allocated_claim(&self, name: &str, pod: &PodSandbox, if_name: &str) -> String {
        let kubeconfig = self.dir.path().join("kubeconfig");
        let (name, parent) = (name.to_owned(), if_name.to_owned());
        let consumer = ResourceClaimConsumerReference {
            api_group: None,
            resource: "pods".to_owned(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        };
        self.netns.block_on(move || async move {
            let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
            let classes: Api<DeviceClass> = Api::all(client.clone());
            let class: DeviceClass = serde_json::from_value(json!({
                "metadata": {"name": parent},
                "spec": {"selectors": [{"cel": {"expression":
                    format!("device.attributes['netclaim.dev'].ifName == '{parent}'")}}]},
            }))
            .unwrap();
            classes.create(&PostParams::default(), &class).await.unwrap();
            let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
            let claim: ResourceClaim = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {
                    "requests": [{"name": "nic", "exactly": {"deviceClassName": parent}}],
                    "config": [{"opaque": {"driver": "netclaim.dev", "parameters": {
                        "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                        "mode": "host-device",
                        "ipam": {"addresses": ["192.0.2.10/24"]}}}}],
                }},
            }))
            .unwrap();
            claims.create(&PostParams::default(), &claim).await.unwrap();
            let allocator = AllocatorController::new(client.clone(), "test-node");
            let deadline = Instant::now() + PATIENCE;
            loop {
                allocator.reconcile().await.unwrap();
                let found = claims.get(&name).await.unwrap();
                if found.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "the claim was never allocated");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let reserved = reserve_for(&client, "default", &name, &consumer).await.unwrap();
            reserved.metadata.uid.unwrap()
        })
    }

    /// NodePrepareResources for one claim over dra.sock; returns the per-claim error.
    fn prepare(&self, name: &str, uid: &str) -> String {
        let socket = self.dra_socket();
        let (name, uid) = (name.to_owned(), uid.to_owned());
        self.runtime.block_on(async move {
            let channel = kit::kubelet::tonic_channel(&socket).await;
            let mut client = dra::dra_plugin_client::DraPluginClient::new(channel);
            let request = dra::NodePrepareResourcesRequest {
                claims: vec![dra::Claim { namespace: "default".into(), name, uid: uid.clone() }],
            };
            client.node_prepare_resources(request).await.unwrap().into_inner().claims[&uid]
                .error
                .clone()
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Close the runtime side (socket, connections) while its tokio runtime still runs.
        let _entered = self.runtime.enter();
        drop(self.nri.take());
    }
}

/// Every report a health stream received, with when.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<(Instant, v1::NodeWatchResourcesResponse)>>>);

impl Reports {
    /// Waits until a report received after `since` has a device whose message starts with
    /// `prefix` and whose health is `health`; returns its message and when it arrived.
    fn wait_for(
        &self,
        since: Instant,
        prefix: &str,
        health: v1::HealthStatus,
        limit: Duration,
        log: impl Fn() -> String,
    ) -> (String, Instant) {
        loop {
            let found = self.0.lock().unwrap().iter().filter(|(at, _)| *at >= since).find_map(
                |(at, response)| {
                    response
                        .devices
                        .iter()
                        .find(|d| d.message.starts_with(prefix) && d.health == i32::from(health))
                        .map(|d| {
                            assert_eq!(d.health_check_timeout_seconds, 30);
                            assert_eq!(d.device.as_ref().unwrap().pool_name, "test-node");
                            (d.message.clone(), *at)
                        })
                },
            );
            if let Some(found) = found {
                return found;
            }
            if since.elapsed() > limit {
                let last = self.0.lock().unwrap().last().map(|(_, r)| r.clone());
                panic!(
                    "no {health:?} report for {prefix:?} within {limit:?}; last {last:?}\n{}",
                    log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A pod: a throwaway netns announced as a sandbox.
fn pod(netns: &Netns, name: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{}", netns.prefix),
        uid: format!("uid-{}-{name}", netns.prefix),
        name: name.to_owned(),
        namespace: "default".to_owned(),
        netns_path: Some(Path::new("/run/netns").join(&netns.name)),
        ..PodSandbox::default()
    }
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn link_down_on_the_node_and_inside_a_pod_reaches_the_health_stream() {
    if !require_root("link_down_on_the_node_and_inside_a_pod_reaches_the_health_stream") {
        return;
    }
    let node = Node::start();
    let (nic, peer) = (node.netns.ifname("x0"), node.netns.ifname("x1"));
    node.netns.ip(&["link", "add", &nic, "type", "veth", "peer", "name", &peer]);
    node.netns.ip(&["link", "set", &peer, "up"]);
    node.netns.ip(&["link", "set", &nic, "up"]);
    let include = format!("{}x0", node.netns.prefix);
    let _daemon = node.start_daemon(&include);
    let reports = node.watch_health();
    let log = || node.log();
    let start = Instant::now();
    let on_host = format!("{nic} is");
    reports.wait_for(start, &on_host, v1::HealthStatus::Healthy, PATIENCE, log);

    // Link down on the node.
    let down = Instant::now();
    node.netns.ip(&["link", "set", &nic, "down"]);
    let (message, at) =
        reports.wait_for(down, &on_host, v1::HealthStatus::Unhealthy, HEALTH_LATENCY, log);
    assert_eq!(message, format!("{nic} is administratively down (operstate down)"));
    println!("link down on the node → Unhealthy on the stream in {:?}", at - down);
    node.netns.ip(&["link", "set", &nic, "up"]);
    reports.wait_for(Instant::now(), &on_host, v1::HealthStatus::Healthy, PATIENCE, log);

    // The NIC moved into a pod by a host-device claim: watched in the pod's netns.
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "nic");
    let uid = node.allocated_claim("nic-net", &sandbox, &nic);
    assert_eq!(node.prepare("nic-net", &uid), "", "{}", node.log());
    node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap();
    let in_pod = format!("{nic} (net1 in pod default/nic)");
    let (message, _) =
        reports.wait_for(Instant::now(), &in_pod, v1::HealthStatus::Healthy, PATIENCE, log);
    assert_eq!(message, format!("{in_pod} is up with carrier"));
    let down = Instant::now();
    pod_netns.ip(&["link", "set", "net1", "down"]);
    let (message, at) =
        reports.wait_for(down, &in_pod, v1::HealthStatus::Unhealthy, HEALTH_LATENCY, log);
    assert_eq!(message, format!("{in_pod} is administratively down (operstate down)"));
    println!("link down inside the pod → Unhealthy on the stream in {:?}", at - down);

    // Back on the node at stop: read on the host again (the pod watch is gone).
    node.runtime
        .block_on(node.nri().stop_pod_sandbox(&PodSandbox { netns_path: None, ..sandbox }))
        .unwrap();
    reports.wait_for(Instant::now(), &on_host, v1::HealthStatus::Unhealthy, PATIENCE, log);
}
