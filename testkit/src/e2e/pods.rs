//! Pods of the containerd end-to-end harness: a pod's spec and sandbox, its links read back
//! with `ip -j` (in its netns and on the host), its claim's status, and [`run_e2e`], which
//! runs one scenario on a fresh [`Cluster`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::future::Future;
use std::os::fd::AsRawFd as _;
use std::panic::AssertUnwindSafe;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use ipnetwork::IpNetwork;
use netclaim::dev::cri::CriClient;
use serde_json::{Value, json};

use super::{Cluster, DRIVER, PATIENCE, POD_IFNAME};
use crate as kit;
use crate::containerd::{Runtime, sandbox_config_with_attempt};

/// A pod of the test and its claim.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub uid: String,
    pub claim: String,
}

impl PodSpec {
    pub fn new(prefix: &str, i: usize) -> Self {
        Self {
            name: format!("{prefix}-pod{i}"),
            uid: uuid::Uuid::new_v4().to_string(),
            claim: format!("{prefix}-claim{i}"),
        }
    }
}

/// A running sandbox, with an open fd of its netns so that the namespace outlives the
/// sandbox and the test can look inside after `StopPodSandbox`.
pub struct RunningPod {
    pub spec: PodSpec,
    pub id: String,
    pub netns: File,
}

impl RunningPod {
    /// A path to the netns that stays valid while we hold the fd.
    pub fn netns_path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.netns.as_raw_fd())
    }
}

/// `RunPodSandbox` for `spec` (attempt `attempt`); returns the pod and the call's wall time.
pub async fn run_pod(
    cluster: &Cluster,
    cri: &CriClient,
    spec: &PodSpec,
    attempt: u32,
) -> Result<(RunningPod, Duration), netclaim::dev::cri::CriError> {
    let config = sandbox_config_with_attempt(&cluster.containerd, &spec.name, &spec.uid, attempt);
    let started = Instant::now();
    let id = cri.run_pod_sandbox(config, "").await?;
    let took = started.elapsed();
    let netns_path = cluster.containerd.sandbox_netns(cri, &id).await;
    let netns = File::open(&netns_path).unwrap();
    Ok((RunningPod { spec: spec.clone(), id, netns }, took))
}

/// A link as `ip -j -d addr` reports it.
#[derive(Debug, Clone)]
pub struct LinkInfo {
    pub kind: Option<String>,
    pub mac: String,
    pub mtu: u64,
    /// Global IPv4/IPv6 addresses in CIDR form.
    pub addresses: Vec<IpNetwork>,
}

pub fn parse_links(json_text: &[u8]) -> BTreeMap<String, (LinkInfo, Value)> {
    let links: Vec<Value> = serde_json::from_slice(json_text).unwrap_or_default();
    links
        .into_iter()
        .map(|link| {
            let addresses = link["addr_info"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["scope"] == "global")
                .map(|a| {
                    format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]).parse().unwrap()
                })
                .collect();
            let info = LinkInfo {
                kind: link["linkinfo"]["info_kind"].as_str().map(str::to_owned),
                mac: link["address"].as_str().unwrap_or_default().to_owned(),
                mtu: link["mtu"].as_u64().unwrap_or_default(),
                addresses,
            };
            (link["ifname"].as_str().unwrap_or_default().to_owned(), (info, link))
        })
        .collect()
}

/// The links of the netns at `netns` (a path nsenter can open).
pub fn links_in(netns: &str) -> BTreeMap<String, LinkInfo> {
    let output = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-j", "-d", "addr", "show"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    parse_links(&output.stdout).into_iter().map(|(name, (info, _))| (name, info)).collect()
}

/// The host netns's links, with the raw JSON (for `link`, the parent of a macvlan).
pub fn host_links() -> BTreeMap<String, (LinkInfo, Value)> {
    let output = kit::netns::run("ip", &["-j", "-d", "addr", "show"]);
    parse_links(&output.stdout)
}

/// Macvlan (or ipvlan) links in the host netns whose parent is `parent`.
pub fn host_children_of(parent: &str) -> Vec<String> {
    host_links()
        .into_iter()
        .filter(|(_, (info, raw))| {
            // A veth end also names its peer in `link`: only sub-interfaces count.
            matches!(info.kind.as_deref(), Some("macvlan" | "ipvlan"))
                && raw["link"].as_str() == Some(parent)
        })
        .map(|(name, _)| name)
        .collect()
}

/// This driver's `status.devices` entry of `claim`, once it is Ready; checks it against the
/// allocation and returns the `(ips, hardwareAddress)` it reports.
pub async fn wait_ready_status(
    cluster: &Cluster,
    claim: &str,
    pool: &IpNetwork,
) -> (Vec<IpNetwork>, String) {
    wait_ready_status_of(cluster, claim, pool, POD_IFNAME).await
}

/// [`wait_ready_status`] for an interface named `if_name` in the pod.
pub async fn wait_ready_status_of(
    cluster: &Cluster,
    claim: &str,
    pool: &IpNetwork,
    if_name: &str,
) -> (Vec<IpNetwork>, String) {
    let claims = cluster.claims();
    let started = Instant::now();
    loop {
        let current = claims.get(claim).await.unwrap();
        let status = current.status.clone().unwrap_or_default();
        let entry = status.devices.iter().flatten().find(|d| d.driver == DRIVER).cloned();
        let ready = entry.as_ref().and_then(|e| {
            e.conditions.iter().flatten().find(|c| c.type_ == "Ready" && c.status == "True")
        });
        if let (Some(entry), Some(condition)) = (entry.as_ref(), ready) {
            assert_eq!(condition.reason, "NetworkReady", "{entry:?}");
            let result = &status
                .allocation
                .as_ref()
                .unwrap()
                .devices
                .as_ref()
                .unwrap()
                .results
                .as_ref()
                .unwrap()[0];
            assert_eq!(
                (&entry.pool, &entry.device, &entry.share_id),
                (&result.pool, &result.device, &result.share_id),
                "the entry names the allocated device (and echoes the shareID)"
            );
            let data = entry.network_data.as_ref().expect("networkData");
            assert_eq!(data.interface_name.as_deref(), Some(if_name), "{entry:?}");
            let ips: Vec<IpNetwork> = data
                .ips
                .iter()
                .flatten()
                .map(|ip| ip.parse().unwrap_or_else(|e| panic!("ip {ip:?} is not CIDR: {e}")))
                .collect();
            assert!(!ips.is_empty(), "{entry:?}");
            for ip in &ips {
                assert!(pool.contains(ip.ip()), "{ip} outside the pool {pool}");
                assert_eq!(ip.prefix(), pool.prefix(), "{ip} has the pool's prefix length");
            }
            let raw = &entry.data.as_ref().expect("data").0;
            assert_eq!(raw["kind"], "NetworkStatus", "{raw}");
            assert_eq!(raw["apiVersion"], "netclaim.dev/v1alpha1", "{raw}");
            let mac = data.hardware_address.clone().expect("hardwareAddress");
            return (ips, mac);
        }
        assert!(
            started.elapsed() < PATIENCE,
            "claim {claim} never became Ready: {status:#?}\nnode log:\n{}",
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until this driver's entry of `claim` says the pod stopped: not Ready, no data and no
/// addresses of an interface that is gone.
pub async fn wait_stopped_status(cluster: &Cluster, claim: &str) {
    let started = Instant::now();
    loop {
        let claim = cluster.claims().get(claim).await.unwrap();
        let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
        // The dev API server's server-side apply leaves `networkData: {}` behind when
        // the applier drops the field: empty counts as gone.
        let stopped = devices.iter().any(|d| {
            d.driver == DRIVER
                && d.data.is_none()
                && d.network_data.as_ref().is_none_or(|n| {
                    n.ips.is_none() && n.interface_name.is_none() && n.hardware_address.is_none()
                })
                && d.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "PodStopped")
        });
        if stopped {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the status does not say the pod stopped: {devices:#?}\nnode log:\n{}",
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the pod has `net1` with an address; returns it.
pub async fn wait_pod_link(cluster: &Cluster, pod: &RunningPod) -> LinkInfo {
    wait_pod_links(cluster, pod, &[POD_IFNAME]).await.remove(0)
}

/// Waits until the pod has each of `names` with an address, and no other link than those,
/// `lo` and `eth0`; returns them in the order of `names`.
pub async fn wait_pod_links(cluster: &Cluster, pod: &RunningPod, names: &[&str]) -> Vec<LinkInfo> {
    let started = Instant::now();
    loop {
        let links = links_in(&pod.netns_path());
        if names.iter().all(|n| links.get(*n).is_some_and(|l| !l.addresses.is_empty())) {
            let found: BTreeSet<&str> = links.keys().map(String::as_str).collect();
            let allowed: BTreeSet<&str> =
                ["lo", "eth0"].into_iter().chain(names.iter().copied()).collect();
            // `eth0` is the CNI plugin's, not ours: a sandbox whose CNI setup a containerd
            // restart interrupted has none, which is not this driver's to judge.
            assert!(
                found.is_subset(&allowed),
                "pod {}: nothing but its interfaces, lo and eth0: {found:?}",
                pod.spec.name
            );
            return names.iter().map(|n| links[*n].clone()).collect();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "pod {} lacks one of {names:?} with an address; its links: {:?}\nnode log:\n{}",
            pod.spec.name,
            links.keys().collect::<Vec<_>>(),
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops (with the netns still held) and removes a sandbox, then checks the daemon took its
/// interface out of the namespace.
pub async fn stop_and_remove(cri: &CriClient, pod: &RunningPod) {
    cri.stop_pod_sandbox(&pod.id).await.unwrap();
    let left = links_in(&pod.netns_path());
    assert!(
        !left.contains_key(POD_IFNAME),
        "{POD_IFNAME} is still in pod {}'s netns after StopPodSandbox: {left:?}",
        pod.spec.name
    );
    cri.remove_pod_sandbox(&pod.id).await.unwrap();
}

pub fn macvlan_config(subnet: &str) -> Value {
    json!({"ipam": {"pool": {"subnet": subnet}}})
}

/// Runs `scenario` on a fresh cluster; prints the logs when it fails, then cleans up.
pub fn run_e2e<F>(runtime: Runtime, scenario: F)
where
    F: for<'a> FnOnce(&'a mut Cluster) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>,
{
    // Checks root as well; fails naming what is missing.
    let Some(tools) = kit::containerd::find_tools_for(runtime) else { return };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut cluster = rt.block_on(Cluster::start(tools));
    let outcome = rt.block_on(AssertUnwindSafe(scenario(&mut cluster)).catch_unwind());
    if outcome.is_err() {
        cluster.print_logs();
    }
    rt.block_on(cluster.containerd.remove_all_sandboxes());
    drop(cluster);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}
