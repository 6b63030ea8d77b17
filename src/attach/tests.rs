//! Unit tests of the attach service over the fake kernel and in-memory ports.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ipnetwork::IpNetwork;
use serde_json::json;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use nri_rs::{Container, PluginHandler, PodSandbox};

use super::reconcile::{RecordAction, record_action};
use super::*;
use crate::claims::{PodConsumer, PreparedClaim, PreparedClaimDevice};
use crate::metrics::Metrics;
use crate::model::network_config::{
    Addressing, ConfigEntry, ConfigSource, DeviceFacts, DeviceKind, NodeSupport, Sharing, resolve,
};
use crate::model::{ClaimRef, PodRef};
use crate::podnet::failing::{FailingOps, FailurePlan};
use crate::podnet::fake::FakeKernel;
use crate::podnet::ports::{EEXIST, LinkState};
use crate::podnet::{LinkOpError, LinkPort, Side};
use crate::testing::facts::{FactsBuilder as _, physical_nic};

mod bandwidth;
mod ethtool;
mod vf_bandwidth;

/// [`LinkPort`] over a shared fake kernel (the service owns its ops).
/// The fake kernel behind the world's failure plan (which fails nothing unless a test sets
/// one).
type FakeOps = FailingOps<Arc<FakeKernel>>;

/// The fake kernel has one pod netns; `netns` lists the paths that "exist" for `open`.
struct FakeNetns {
    kernel: Arc<FakeKernel>,
    netns: Arc<Mutex<BTreeSet<PathBuf>>>,
    failures: Arc<Mutex<Arc<FailurePlan>>>,
}

impl FakeNetns {
    fn ops(&self) -> FakeOps {
        FailingOps::new(Arc::clone(&self.kernel), Arc::clone(&self.failures.lock().unwrap()))
    }
}

impl NetnsPort for FakeNetns {
    type Ops = FakeOps;

    async fn open(&self, path: &Path) -> Result<FakeOps, LinkOpError> {
        if self.netns.lock().unwrap().contains(path) {
            Ok(self.ops())
        } else if path == Path::new("/run/netns/unmounted") {
            // The file a netns unmount leaves until the runtime deletes it.
            let reason = crate::podnet::ports::NetnsRefusal::NotNsfs;
            Err(LinkOpError::NotPodNetns { path: path.display().to_string(), reason })
        } else {
            Err(LinkOpError::NetnsGone { path: path.display().to_string() })
        }
    }

    async fn open_for_detach(&self, _path: &Path) -> Result<FakeOps, LinkOpError> {
        Ok(self.ops())
    }

    async fn host_links(&self) -> Result<Vec<LinkState>, LinkOpError> {
        Ok(self
            .kernel
            .links(Side::Host)
            .iter()
            .filter_map(|name| self.kernel.get(Side::Host, name))
            .collect())
    }

    async fn host(&self) -> Result<FakeOps, LinkOpError> {
        Ok(self.ops())
    }
}

#[derive(Default)]
struct FakeClaims {
    claims: Mutex<Vec<PreparedClaim>>,
    gone: Mutex<BTreeSet<String>>,
    released: Mutex<Vec<String>>,
    /// `(claim uid, request, whether the device was still in the host netns)` of each
    /// device settings call, and whether they fail.
    settings: Mutex<Vec<(String, String, bool)>>,
    settings_fail: std::sync::atomic::AtomicBool,
    kernel: Mutex<Option<Arc<FakeKernel>>>,
    /// `(claim uid, request, name)`: the host netdev name the claims find now for a device
    /// (a VF by its PCI address).
    host_names: Mutex<Vec<(String, String, String)>>,
}

impl PodClaimSource for Arc<FakeClaims> {
    fn claims_of_pod(&self, pod_uid: &str) -> Vec<PreparedClaim> {
        let mut claims: Vec<PreparedClaim> = self
            .claims
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.reserved_for.iter().any(|p| p.uid == pod_uid))
            .cloned()
            .collect();
        claims.sort_by(|a, b| a.name.cmp(&b.name));
        claims
    }
    fn all_claims(&self) -> Vec<PreparedClaim> {
        self.claims.lock().unwrap().clone()
    }
    async fn presence(&self, claim: &PreparedClaim) -> ClaimPresence {
        if self.gone.lock().unwrap().contains(&claim.uid) {
            ClaimPresence::Gone
        } else {
            ClaimPresence::Present
        }
    }
    async fn release(&self, claim: &PreparedClaim) -> Result<(), crate::claims::ClaimError> {
        self.claims.lock().unwrap().retain(|c| c.uid != claim.uid);
        self.released.lock().unwrap().push(claim.uid.clone());
        Ok(())
    }
    async fn apply_device_settings(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> Result<(), crate::claims::ClaimError> {
        let device = self
            .claims
            .lock()
            .unwrap()
            .iter()
            .find(|c| c.uid == claim_uid)
            .and_then(|c| c.devices.iter().find(|d| d.request == request).cloned())
            .unwrap();
        let kernel = self.kernel.lock().unwrap().clone().unwrap();
        let in_host = kernel.get(Side::Host, &device.if_name).is_some();
        self.settings.lock().unwrap().push((claim_uid.to_owned(), request.to_owned(), in_host));
        if self.settings_fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::claims::ClaimError::NoVfPort {
                request: request.to_owned(),
                device: device.device,
            });
        }
        Ok(())
    }
    async fn current_host_name(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> Result<Option<String>, crate::claims::ClaimError> {
        let names = self.host_names.lock().unwrap();
        Ok(names.iter().find(|(u, r, _)| u == claim_uid && r == request).map(|e| e.2.clone()))
    }
}

#[derive(Clone, Default)]
struct MemStore(Arc<Mutex<BTreeMap<String, PodAttachment>>>);

impl AttachmentStore for MemStore {
    type Error = std::io::Error;
    fn load_attachments(&self) -> Result<Vec<PodAttachment>, std::io::Error> {
        Ok(self.0.lock().unwrap().values().cloned().collect())
    }
    fn save_attachment(&self, attachment: &PodAttachment) -> Result<(), std::io::Error> {
        self.0.lock().unwrap().insert(attachment.pod_uid.clone(), attachment.clone());
        Ok(())
    }
    fn remove_attachment(&self, pod_uid: &str) -> Result<(), std::io::Error> {
        self.0.lock().unwrap().remove(pod_uid);
        Ok(())
    }
}

type Submitted = Vec<(ClaimRef, Vec<AllocatedDeviceStatus>)>;

#[derive(Clone, Default)]
struct Recorder {
    statuses: Arc<Mutex<Submitted>>,
    warnings: Arc<Mutex<Vec<(PodRef, String)>>>,
}

impl StatusSink for Recorder {
    fn submit(&self, claim: ClaimRef, entries: Vec<AllocatedDeviceStatus>) {
        self.statuses.lock().unwrap().push((claim, entries));
    }
    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String) {
        self.warnings.lock().unwrap().push((pod, format!("{reason}: {message}")));
    }
}

impl Recorder {
    /// The last entries written for claim `name`.
    fn last(&self, name: &str) -> Vec<AllocatedDeviceStatus> {
        self.statuses
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(c, _)| c.name == name)
            .map(|(_, e)| e.clone())
            .unwrap_or_default()
    }
}

type Service = AttachService<Arc<FakeClaims>, FakeNetns, MemStore, Recorder>;

struct World {
    kernel: Arc<FakeKernel>,
    netns: Arc<Mutex<BTreeSet<PathBuf>>>,
    /// Which kernel call fails (none by default).
    failures: Arc<Mutex<Arc<FailurePlan>>>,
    claims: Arc<FakeClaims>,
    store: MemStore,
    status: Recorder,
    metrics: Arc<Metrics>,
}

impl World {
    fn new() -> Self {
        let kernel = Arc::new(FakeKernel::new());
        kernel.add_host_link("eth1", 1500, None);
        kernel.add_host_link("eth2", 9000, None);
        Self {
            kernel,
            netns: Arc::default(),
            failures: Arc::new(Mutex::new(FailurePlan::new(0, 0))),
            claims: Arc::default(),
            store: MemStore::default(),
            status: Recorder::default(),
            metrics: Arc::new(Metrics::new()),
        }
    }

    fn service(&self) -> Service {
        AttachService::load(
            "netclaim.dev",
            Arc::clone(&self.claims),
            FakeNetns {
                kernel: Arc::clone(&self.kernel),
                netns: Arc::clone(&self.netns),
                failures: Arc::clone(&self.failures),
            },
            self.store.clone(),
            self.status.clone(),
            Arc::clone(&self.metrics),
        )
        .unwrap()
    }

    /// Waits until the stored record of `pod` has its results.
    async fn results_stored(&self, pod: &str) {
        for _ in 0..500 {
            let stored = self.store.0.lock().unwrap().get(pod).cloned();
            if stored.is_some_and(|r| r.devices.iter().all(|d| d.result.is_some())) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("the results of {pod} were never stored");
    }

    fn add_claim(&self, claim: PreparedClaim) {
        self.claims.claims.lock().unwrap().push(claim);
    }

    fn pod(&self, uid: &str) -> PodSandbox {
        let path = PathBuf::from(format!("/run/netns/{uid}"));
        self.netns.lock().unwrap().insert(path.clone());
        PodSandbox {
            id: format!("sandbox-{uid}"),
            uid: uid.to_owned(),
            name: format!("pod-{uid}"),
            namespace: "ns".to_owned(),
            netns_path: Some(path),
            ..PodSandbox::default()
        }
    }
}

fn facts(if_name: &str, sharing: Sharing, mtu: u32) -> DeviceFacts {
    physical_nic(if_name).sharing(sharing).mtu(mtu)
}

/// A prepared claim `name` (uid `uid-<name>`) for pod `pod`, one device per
/// `(request, parent, config)`.
fn claim(name: &str, pod: &str, devices: &[(&str, &str, serde_json::Value)]) -> PreparedClaim {
    let uid = format!("uid-{name}");
    PreparedClaim {
        pod_claim_index: None,
        pod_claim_name: None,
        uid,
        namespace: "ns".to_owned(),
        name: name.to_owned(),
        devices: devices
            .iter()
            .map(|(request, if_name, parameters)| {
                let mut parameters = parameters.clone();
                parameters["apiVersion"] = json!("netclaim.dev/v1alpha1");
                parameters["kind"] = json!("NetworkConfig");
                let exclusive = parameters["mode"] == "host-device";
                let sharing = if exclusive { Sharing::Exclusive } else { Sharing::Shared };
                let device_facts =
                    facts(if_name, sharing, if *if_name == "eth2" { 9000 } else { 1500 });
                let entries =
                    [ConfigEntry { source: ConfigSource::Claim, requests: Vec::new(), parameters }];
                let config =
                    resolve(&entries, request, &device_facts, &NodeSupport::everything()).unwrap();
                let addresses = match &config.addressing {
                    Addressing::Static(a) => a.clone(),
                    _ => Vec::new(),
                };
                PreparedClaimDevice {
                    request: (*request).to_owned(),
                    pool: "node-a".to_owned(),
                    device: (*if_name).to_owned(),
                    share_id: (!exclusive).then(|| format!("share-{name}-{request}")),
                    if_name: (*if_name).to_owned(),
                    config,
                    addresses,
                    sharing: Some(sharing),
                    kind: Some(DeviceKind::Physical),
                    host_mtu: Some(device_facts.mtu),
                    attributes: std::collections::BTreeMap::new(),
                    cdi_device_ids: Vec::new(),
                    vf: None,
                    vfio: None,
                    ethtool: None,
                }
            })
            .collect(),
        reserved_for: vec![PodConsumer { name: format!("pod-{pod}"), uid: pod.to_owned() }],
        generation: Some(3),
    }
}

fn macvlan(address: &str) -> serde_json::Value {
    json!({"mode": "macvlan", "ipam": {"addresses": [address]}})
}

fn ready(entries: &[AllocatedDeviceStatus]) -> Vec<(String, String, Option<String>)> {
    entries
        .iter()
        .map(|e| {
            let c = &e.conditions.as_ref().unwrap()[0];
            (
                c.status.clone(),
                c.reason.clone(),
                e.network_data.as_ref().and_then(|d| d.interface_name.clone()),
            )
        })
        .collect()
}

/// RunPodSandbox, then waits for the attach's completion (statuses, metadata, record), which
/// runs after the answer.
async fn run(service: &Service, pod: PodSandbox) -> Result<(), nri_rs::HandlerError> {
    let answered = service.run_pod_sandbox(pod).await;
    service.settled().await;
    answered
}

#[tokio::test]
async fn claims_attach_in_name_order_with_default_names_and_report_ready() {
    let world = World::new();
    // Added out of order, and one request with an explicit name.
    world.add_claim(claim("zeta", "p1", &[("nic", "eth1", macvlan("10.0.2.5/24"))]));
    world.add_claim(claim(
        "alpha",
        "p1",
        &[
            ("b", "eth1", macvlan("10.0.1.6/24")),
            ("a", "eth1", json!({"mode": "macvlan", "interface": {"name": "net1"}})),
        ],
    ));
    let service = world.service();
    run(&service, world.pod("p1")).await.unwrap();

    // alpha/a keeps its explicit net1; alpha/b and zeta/nic get net2 and net3.
    let creates: Vec<String> =
        world.kernel.log().into_iter().filter(|l| l.starts_with("create macvlan")).collect();
    assert_eq!(creates.len(), 3, "{creates:?}");
    assert!(
        creates[0].contains(" net1 ")
            && creates[1].contains(" net2 ")
            && creates[2].contains(" net3 "),
        "{creates:?}"
    );
    let record = service.attachment("p1").unwrap();
    let names: Vec<(&str, &str)> = record
        .devices
        .iter()
        .map(|d| (d.claim_name.as_str(), d.plan.interface_name.as_str()))
        .collect();
    assert_eq!(names, [("alpha", "net1"), ("alpha", "net2"), ("zeta", "net3")]);
    assert!(record.devices.iter().all(|d| d.result.is_some()));
    assert_eq!(world.store.0.lock().unwrap()["p1"].netns, PathBuf::from("/run/netns/p1"));

    let zeta = world.status.last("zeta");
    assert_eq!(
        ready(&zeta),
        [("True".to_owned(), "NetworkReady".to_owned(), Some("net3".to_owned()))]
    );
    let data = zeta[0].network_data.as_ref().unwrap();
    assert_eq!(data.ips.as_deref().unwrap(), ["10.0.2.5/24"]);
    assert!(data.hardware_address.is_some());
    assert_eq!(zeta[0].share_id.as_deref(), Some("share-zeta-nic"));
    assert_eq!(zeta[0].conditions.as_ref().unwrap()[0].observed_generation, Some(3));
    assert_eq!(world.status.last("alpha").len(), 2);
    let text = world.metrics.encode();
    assert!(text.contains(r#"netclaim_attach_duration_seconds_count{mode="macvlan"} 3"#), "{text}");
    assert!(
        text.contains(r#"netclaim_nri_events_total{event="RunPodSandbox",result="success"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_failure_in_the_second_claim_rolls_back_the_first_and_names_the_step() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim("b", "p1", &[("nic", "eth1", macvlan("10.0.2.5/24"))]));
    world.kernel.fail_on("add address 10.0.2.5/24", EEXIST);
    let service = world.service();
    let err = run(&service, world.pod("p1")).await.unwrap_err();
    let message = err.to_string();
    for part in ["claim ns/b", "request nic", "device eth1", "add address 10.0.2.5/24", "errno 17"]
    {
        assert!(message.contains(part), "{part:?} missing in {message}");
    }
    assert!(world.kernel.links(Side::Pod).is_empty(), "{:?}", world.kernel.links(Side::Pod));
    assert_eq!(world.kernel.leftovers(), (0, 0));
    assert!(service.attachment("p1").is_none());
    assert!(world.store.0.lock().unwrap().is_empty());
    for name in ["a", "b"] {
        let entries = world.status.last(name);
        assert_eq!(
            ready(&entries),
            [("False".to_owned(), "AttachFailed".to_owned(), None)],
            "{name}"
        );
    }
    let warnings = world.status.warnings.lock().unwrap().clone();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].1.starts_with("AttachFailed: ") && warnings[0].0.uid == "p1");

    // kubelet retries the sandbox: now it works.
    run(&service, world.pod("p1")).await.unwrap();
    assert_eq!(world.kernel.links(Side::Pod), ["net1", "net2"]);
    assert_eq!(ready(&world.status.last("b"))[0].0, "True");
}

#[tokio::test]
async fn a_second_run_pod_sandbox_is_a_no_op() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    let service = world.service();
    run(&service, world.pod("p1")).await.unwrap();
    let calls = world.kernel.log().len();
    run(&service, world.pod("p1")).await.unwrap();
    service.create_container(world.pod("p1"), Container::default()).await.unwrap();
    assert_eq!(world.kernel.log().len(), calls);
}

#[tokio::test]
async fn pods_without_claims_cost_nothing() {
    let world = World::new();
    let service = world.service();
    run(&service, world.pod("other")).await.unwrap();
    let mut host_network = world.pod("hostnet");
    host_network.netns_path = None;
    run(&service, host_network).await.unwrap();
    service.stop_pod_sandbox(world.pod("unknown")).await.unwrap();
    service.remove_pod_sandbox(world.pod("unknown")).await.unwrap();
    assert!(world.kernel.log().is_empty());
    assert!(world.store.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn create_container_refuses_without_a_netns_and_attaches_when_it_knows_one() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    let service = world.service();
    let mut pod = world.pod("p1");
    pod.netns_path = None;
    let err = service
        .create_container(pod.clone(), Container { name: "app".into(), ..Container::default() })
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("container app") && err.to_string().contains("not attached"),
        "{err}"
    );
    assert!(world.kernel.links(Side::Pod).is_empty());

    // The runtime's CreateContainer carries the pod's netns: attach, then allow.
    service.create_container(world.pod("p1"), Container::default()).await.unwrap();
    assert_eq!(world.kernel.links(Side::Pod), ["net1"]);

    // A netns that does not exist: refused with the cause.
    world.add_claim(claim("b", "p2", &[("nic", "eth1", macvlan("10.0.2.5/24"))]));
    let mut gone = world.pod("p2");
    gone.netns_path = Some(PathBuf::from("/run/netns/never"));
    let err = service.create_container(gone, Container::default()).await.unwrap_err();
    assert!(err.to_string().contains("is gone"), "{err}");
}

#[tokio::test]
async fn stop_detaches_and_keeps_the_record_until_remove() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim(
        "nic",
        "p1",
        &[("dev", "eth2", json!({"mode": "host-device", "interface": {"mtu": 1500}}))],
    ));
    let service = world.service();
    let moved = service.moved_devices();
    run(&service, world.pod("p1")).await.unwrap();
    assert_eq!(world.kernel.links(Side::Pod), ["net1", "net2"]);
    assert_eq!(*moved.borrow(), BTreeSet::from(["eth2".to_owned()]));

    let mut stop = world.pod("p1");
    stop.netns_path = None; // as containerd sends it
    service.stop_pod_sandbox(stop.clone()).await.unwrap();
    // Answered with the NIC back on the host and the macvlan without its address; the
    // macvlan's link removal (an RCU grace period in the kernel) follows in the background.
    let net1 = world.kernel.get(Side::Pod, "net1");
    if let Some(net1) = net1 {
        let config = world.kernel.pod_config(net1.index).await.unwrap();
        assert!(config.addresses.is_empty(), "{config:?}");
    }
    assert!(world.kernel.get(Side::Pod, "net2").is_none());
    let eth2 = world.kernel.get(Side::Host, "eth2").unwrap();
    assert_eq!((eth2.mtu, eth2.alias), (9000, None));
    assert!(moved.borrow().is_empty());
    assert_eq!(service.attachment("p1").unwrap().state, AttachmentState::Stopped);
    assert_eq!(
        ready(&world.status.last("nic")),
        [("False".to_owned(), "PodStopped".to_owned(), None)]
    );
    let text = world.metrics.encode();
    assert!(
        text.contains(r#"netclaim_detach_duration_seconds_count{mode="host-device"} 1"#),
        "{text}"
    );

    // Events of another (older) sandbox of the pod leave the record alone; like every later
    // event of the pod, it waits for the link removal.
    let older = PodSandbox { id: "sandbox-older".into(), ..stop.clone() };
    service.remove_pod_sandbox(older).await.unwrap();
    assert!(world.kernel.links(Side::Pod).is_empty());
    assert!(service.attachment("p1").is_some());
    service.remove_pod_sandbox(stop).await.unwrap();
    assert!(service.attachment("p1").is_none());
    assert!(world.store.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn unprepare_of_an_attached_claim_detaches_it() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim("b", "p1", &[("nic", "eth1", macvlan("10.0.2.5/24"))]));
    let service = world.service();
    run(&service, world.pod("p1")).await.unwrap();
    service.detach_claim("uid-a").await;
    assert_eq!(world.kernel.links(Side::Pod), ["net2"]);
    let record = service.attachment("p1").unwrap();
    assert_eq!(record.devices.len(), 1);
    assert_eq!(world.store.0.lock().unwrap()["p1"].devices.len(), 1);
}

/// A `Synchronize` and the background reconcile it starts, run to its end.
async fn synchronize(service: &Service, pods: Vec<PodSandbox>) {
    service.synchronize(pods).await.unwrap();
    service.reconcile_pending().await;
    service.settled().await;
}

#[tokio::test]
async fn synchronize_returns_before_the_reconcile_and_create_container_waits_for_it() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    let service = Arc::new(world.service());
    service.start().await;
    // Answered without touching the kernel: the pod's attach is the reconcile's work.
    let calls = world.kernel.log().len();
    service.synchronize(vec![world.pod("p1"), world.pod("no-claims")]).await.unwrap();
    assert_eq!(world.kernel.log().len(), calls, "{:?}", world.kernel.log());
    // A pod without interfaces of ours never waits.
    service.create_container(world.pod("no-claims"), Container::default()).await.unwrap();
    // The pod's container waits for the reconcile, then finds its interface.
    let waiting = tokio::spawn({
        let (service, pod) = (Arc::clone(&service), world.pod("p1"));
        async move { service.create_container(pod, Container::default()).await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    service.reconcile_pending().await;
    waiting.await.unwrap().unwrap();
    assert_eq!(world.kernel.links(Side::Pod), ["net1"]);
}

#[tokio::test]
async fn a_stopped_sandbox_the_runtime_still_lists_is_not_attached_again_after_a_restart() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    {
        let service = world.service();
        run(&service, world.pod("p1")).await.unwrap();
        service.stop_pod_sandbox(world.pod("p1")).await.unwrap();
        // The next event of the pod waits for the background link removal.
        run(&service, world.pod("other")).await.unwrap();
        service.remove_pod_sandbox(world.pod("other")).await.unwrap();
    }
    let service = world.service();
    service.start().await;
    synchronize(&service, vec![world.pod("p1")]).await;
    assert_eq!(service.attachment("p1").unwrap().state, AttachmentState::Stopped);
    assert!(
        world.kernel.log().iter().filter(|l| l.starts_with("create macvlan")).count() == 1,
        "{:?}",
        world.kernel.log()
    );
    // A new sandbox of the pod (another ID) is attached.
    let mut again = world.pod("p1");
    again.id = "sandbox-p1-second".into();
    synchronize(&service, vec![again]).await;
    assert_eq!(service.attachment("p1").unwrap().state, AttachmentState::Attached);
}

#[tokio::test]
async fn create_container_of_a_pod_still_unverified_at_its_deadline_is_refused_for_a_retry() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    let service = world.service();
    service.synchronize(vec![world.pod("p1")]).await.unwrap();
    // Outside a plugin call it waits for the default deadline (2 s minus 250 ms), then refuses
    // with its own message: the plugin's deadline error would say less.
    let err = service
        .create_container(world.pod("p1"), Container { name: "app".into(), ..Container::default() })
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("still verifying") && err.to_string().contains("app"),
        "{err}"
    );
    assert!(
        world.kernel.links(Side::Pod).is_empty(),
        "nothing attached behind the reconcile's back"
    );
    // Once reconciled, the retry goes through.
    service.reconcile_pending().await;
    service.create_container(world.pod("p1"), Container::default()).await.unwrap();
}

fn running(p: &PodSandbox) -> HashMap<&str, &PodSandbox> {
    HashMap::from([("p1", p)])
}

#[test]
fn record_actions_follow_the_runtime_pods() {
    use AttachmentState::{Attached, Stopped};

    let record = |state| PodAttachment {
        pod_uid: "p1".into(),
        pod_name: "p".into(),
        pod_namespace: "ns".into(),
        sandbox_id: "s".into(),
        netns: PathBuf::from("/run/netns/a"),
        state,
        devices: Vec::new(),
    };
    let pod = |netns: Option<&str>| PodSandbox {
        uid: "p1".into(),
        netns_path: netns.map(PathBuf::from),
        ..PodSandbox::default()
    };
    let same = pod(Some("/run/netns/a"));
    let other = pod(Some("/run/netns/b"));
    let unknown = pod(None);
    let none = HashMap::new();
    assert_eq!(record_action(&record(Attached), &running(&same)), RecordAction::Verify);
    assert_eq!(record_action(&record(Attached), &running(&unknown)), RecordAction::Verify);
    assert_eq!(record_action(&record(Attached), &running(&other)), RecordAction::Detach);
    assert_eq!(record_action(&record(Attached), &none), RecordAction::Detach);
    assert_eq!(record_action(&record(Stopped), &none), RecordAction::Forget);
    assert_eq!(record_action(&record(Stopped), &running(&same)), RecordAction::Keep);
}

#[tokio::test]
async fn synchronize_attaches_running_pods_and_detaches_gone_ones() {
    let world = World::new();
    world.add_claim(claim("gone", "old", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    {
        let service = world.service();
        run(&service, world.pod("old")).await.unwrap();
        world.results_stored("old").await;
    }
    assert_eq!(world.kernel.links(Side::Pod), ["net1"]);
    // Restart: pod "old" is gone, pod "new" started while the daemon was down.
    world.add_claim(claim("fresh", "new", &[("nic", "eth1", macvlan("10.0.2.5/24"))]));
    world.claims.gone.lock().unwrap().insert("uid-gone".into());
    let service = world.service();
    service.start().await;
    // Before the runtime told which pods run, nothing is released.
    assert_eq!(service.sweep_gone_claims().await, 0);
    synchronize(&service, vec![world.pod("new")]).await;
    assert_eq!(service.sweep_gone_claims().await, 1);

    assert!(service.attachment("old").is_none());
    assert!(!world.store.0.lock().unwrap().contains_key("old"));
    let record = service.attachment("new").unwrap();
    assert_eq!(record.devices[0].plan.addresses(), ["10.0.2.5/24".parse::<IpNetwork>().unwrap()]);
    // One pod netns in the fake: the old net1 was deleted, the new pod's net1 created.
    assert_eq!(world.kernel.links(Side::Pod), ["net1"]);
    assert_eq!(*world.claims.released.lock().unwrap(), ["uid-gone"]);
    assert_eq!(ready(&world.status.last("fresh"))[0].0, "True");
    assert_eq!(ready(&world.status.last("gone"))[0].1, "PodStopped");
}

#[tokio::test]
async fn synchronize_keeps_running_interfaces_and_restores_missing_ones() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim("b", "p1", &[("nic", "eth1", macvlan("10.0.2.5/24"))]));
    run(&world.service(), world.pod("p1")).await.unwrap();
    world.results_stored("p1").await;
    // Someone deleted net2 inside the pod while the daemon was down.
    let net2 = world.kernel.get(Side::Pod, "net2").unwrap();
    world.kernel.delete_link(Side::Pod, net2.index).await.unwrap();
    let service = world.service();
    let calls = world.kernel.log().len();
    synchronize(&service, vec![world.pod("p1")]).await;
    let after: Vec<String> = world.kernel.log()[calls..].to_vec();
    assert!(after.iter().all(|l| !l.contains("net1")), "net1 untouched: {after:?}");
    assert!(
        after.iter().any(|l| l.starts_with("create macvlan") && l.contains("net2")),
        "{after:?}"
    );
    assert_eq!(world.kernel.links(Side::Pod), ["net1", "net2"]);
}

#[tokio::test]
async fn start_restores_a_device_that_came_back_under_its_pod_name() {
    let world = World::new();
    world.add_claim(claim(
        "nic",
        "p1",
        &[("dev", "eth3", json!({"mode": "host-device", "interface": {"mtu": 1400}}))],
    ));
    // The pod netns died while the daemon was down: the kernel put the NIC back as net1.
    world.kernel.add_host_link("net1", 1400, Some("netclaim.dev/device host=eth3 claim=uid-nic"));
    // An administrator's link with another alias is never touched.
    world.kernel.add_host_link("mine0", 1400, Some("something else"));
    // Aliases are hints, never authority (DESIGN §6): a tenant with NET_ADMIN can write one
    // on a NIC it holds. Neither a device the claim does not hold nor an unknown claim is
    // renamed.
    world.kernel.add_host_link("net2", 1400, Some("netclaim.dev/device host=eth9 claim=uid-nic"));
    world.kernel.add_host_link("net3", 1400, Some("netclaim.dev/device host=eth8 claim=forged"));
    let service = world.service();
    service.start().await;
    assert!(world.kernel.get(Side::Host, "net1").is_none());
    let eth3 = world.kernel.get(Side::Host, "eth3").unwrap();
    // No record: the MTU comes from the prepared claim.
    assert_eq!((eth3.mtu, eth3.alias), (1500, None));
    assert_eq!(world.kernel.get(Side::Host, "mine0").unwrap().mtu, 1400);
    for forged in ["net2", "net3"] {
        assert!(world.kernel.get(Side::Host, forged).is_some(), "{forged} was renamed");
    }
    assert!(world.kernel.get(Side::Host, "eth9").is_none());
    assert!(world.kernel.get(Side::Host, "eth8").is_none());
}

#[tokio::test]
async fn a_record_of_a_dead_pod_gives_the_nic_back_with_its_mtu() {
    let world = World::new();
    world.add_claim(claim(
        "nic",
        "p1",
        &[("dev", "eth2", json!({"mode": "host-device", "interface": {"mtu": 1500}}))],
    ));
    run(&world.service(), world.pod("p1")).await.unwrap();
    // The pod netns is destroyed while the daemon is down; the kernel returns the NIC as net1.
    let moved = world.kernel.get(Side::Pod, "net1").unwrap();
    world.kernel.destroy_pod_netns();
    world.kernel.add_host_link("net1", moved.mtu, moved.alias.as_deref());
    let service = world.service();
    service.start().await;
    synchronize(&service, Vec::new()).await;
    let eth2 = world.kernel.get(Side::Host, "eth2").unwrap();
    assert_eq!((eth2.mtu, eth2.alias), (9000, None));
    assert!(service.attachment("p1").is_none());
}

#[tokio::test]
async fn a_listed_sandbox_without_its_netns_is_skipped_quietly() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim("b", "p2", &[("nic", "eth1", macvlan("10.0.1.6/24"))]));
    let service = world.service();
    service.start().await;
    let mut stopped = world.pod("p1");
    stopped.netns_path = Some(PathBuf::from("/run/netns/already-gone"));
    // Unmounted, its file not yet deleted (a run that containerd cut short at its restart).
    let mut unmounted = world.pod("p2");
    unmounted.netns_path = Some(PathBuf::from("/run/netns/unmounted"));
    synchronize(&service, vec![stopped, unmounted]).await;
    assert!(world.status.statuses.lock().unwrap().is_empty());
    assert!(world.status.warnings.lock().unwrap().is_empty());
    assert!(service.attachment("p1").is_none());
    assert!(service.attachment("p2").is_none());
}

#[tokio::test]
async fn a_kernel_failure_at_any_call_of_a_pod_attach_leaves_no_link_and_no_record() {
    // A macvlan and a whole NIC for one pod; every mutating kernel call fails in turn.
    let claims = || {
        [
            claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]),
            claim(
                "b",
                "p1",
                &[(
                    "nic",
                    "eth2",
                    json!({"mode": "host-device", "ipam": {"addresses": ["10.0.2.5/24"]}}),
                )],
            ),
        ]
    };
    let clean = World::new();
    for c in claims() {
        clean.add_claim(c);
    }
    run(&clean.service(), clean.pod("p1")).await.unwrap();
    let calls = clean.failures.lock().unwrap().calls();
    assert!(calls >= 6, "{calls} kernel calls");
    for fail_at in 1..=calls {
        let world = World::new();
        for c in claims() {
            world.add_claim(c);
        }
        let host_before: Vec<_> =
            ["eth1", "eth2"].iter().map(|n| world.kernel.get(Side::Host, n)).collect();
        *world.failures.lock().unwrap() = FailurePlan::new(fail_at, nix::libc::EBUSY);
        let service = world.service();
        let err = run(&service, world.pod("p1")).await.unwrap_err();
        let context = format!("call {fail_at} of {calls}: {err}");
        assert!(err.to_string().contains("injected failure"), "{context}");
        assert!(world.kernel.links(Side::Pod).is_empty(), "{context}: pod links left");
        assert_eq!(world.kernel.leftovers(), (0, 0), "{context}: addresses or routes left");
        let host_after: Vec<_> =
            ["eth1", "eth2"].iter().map(|n| world.kernel.get(Side::Host, n)).collect();
        assert_eq!(host_after, host_before, "{context}: host links changed");
        assert_eq!(world.kernel.links(Side::Host), ["eth1", "eth2"], "{context}");
        assert!(service.attachment("p1").is_none(), "{context}: record in memory");
        assert!(world.store.0.lock().unwrap().is_empty(), "{context}: record on disk");
        // The retry (kubelet recreates the sandbox) attaches both.
        run(&service, world.pod("p1")).await.unwrap();
        assert_eq!(world.kernel.links(Side::Pod), ["net1", "net2"], "{context}: retry");
    }
}

/// Drops the stored results of pod `uid`'s record, as a crash between a finished attach and
/// the background write of its results leaves it.
fn forget_results(world: &World, uid: &str) {
    let mut stored = world.store.0.lock().unwrap();
    for device in &mut stored.get_mut(uid).unwrap().devices {
        device.result = None;
    }
}

#[tokio::test]
async fn a_finished_attach_whose_results_were_lost_is_adopted_without_touching_it() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim(
        "b",
        "p1",
        &[("nic", "eth2", json!({"mode": "host-device", "ipam": {"addresses": ["10.0.2.5/24"]}}))],
    ));
    run(&world.service(), world.pod("p1")).await.unwrap();
    world.results_stored("p1").await;
    forget_results(&world, "p1");
    let service = world.service();
    let calls = world.kernel.log().len();
    synchronize(&service, vec![world.pod("p1")]).await;
    assert_eq!(world.kernel.log()[calls..], [] as [String; 0], "no kernel change");
    world.results_stored("p1").await;
    assert_eq!(ready(&world.status.last("b"))[0].0, "True");
}

#[tokio::test]
async fn a_half_done_attach_is_undone_and_done_again_at_synchronize() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    run(&world.service(), world.pod("p1")).await.unwrap();
    world.results_stored("p1").await;
    forget_results(&world, "p1");
    // The crash came before the link was set up.
    let net1 = world.kernel.get(Side::Pod, "net1").unwrap();
    world.kernel.set_up(net1.index, false).await.unwrap();
    let service = world.service();
    let calls = world.kernel.log().len();
    synchronize(&service, vec![world.pod("p1")]).await;
    let after = world.kernel.log()[calls..].to_vec();
    assert!(after.iter().any(|l| l.starts_with("delete pod link")), "{after:?}");
    assert!(after.iter().any(|l| l.starts_with("create macvlan")), "{after:?}");
    assert_eq!(world.kernel.links(Side::Pod), ["net1"]);
    world.results_stored("p1").await;
}

#[tokio::test]
async fn a_failed_lookup_at_synchronize_never_detaches_a_live_interface() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    run(&world.service(), world.pod("p1")).await.unwrap();
    world.results_stored("p1").await;
    let service = world.service();
    world.kernel.fail_lookups(Some(nix::libc::ENOBUFS));
    let calls = world.kernel.log().len();
    synchronize(&service, vec![world.pod("p1")]).await;
    assert_eq!(world.kernel.log()[calls..], [] as [String; 0], "nothing moved");
    // The same with the result lost: still left alone while lookups fail.
    forget_results(&world, "p1");
    let service = world.service();
    synchronize(&service, vec![world.pod("p1")]).await;
    assert_eq!(world.kernel.log()[calls..], [] as [String; 0], "nothing moved");
    assert_eq!(world.kernel.links(Side::Pod), ["net1"]);
}

#[tokio::test]
async fn default_names_follow_the_pods_claim_order_not_claim_names() {
    let world = World::new();
    let mut alpha = claim("alpha", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]);
    let mut zeta = claim("zeta", "p1", &[("nic", "eth1", macvlan("10.0.2.5/24"))]);
    // The pod's spec.resourceClaims lists zeta first.
    zeta.pod_claim_index = Some(0);
    alpha.pod_claim_index = Some(1);
    world.add_claim(alpha);
    world.add_claim(zeta);
    run(&world.service(), world.pod("p1")).await.unwrap();
    let record = world.store.0.lock().unwrap()["p1"].clone();
    let names: Vec<(String, String)> = record
        .devices
        .iter()
        .map(|d| (d.claim_uid.clone(), d.plan.interface_name.clone()))
        .collect();
    assert!(names.contains(&("uid-zeta".to_owned(), "net1".to_owned())), "{names:?}");
    assert!(names.contains(&("uid-alpha".to_owned(), "net2".to_owned())), "{names:?}");
}

/// The stats service's view of the attach service: the change counter moves with the
/// records, the snapshot lists attached interfaces with their `stats` setting, and counters
/// handed back land in `data.stats` of the right entry (one write per claim) and in
/// Prometheus.
#[tokio::test]
async fn attached_interfaces_carry_their_stats_setting_and_counters_reach_status_and_metrics() {
    use crate::model::stats::{DirectionCounters, InterfaceStats};
    use crate::stats::{AttachedInterfaceSource as _, StatsSink as _};

    let world = World::new();
    world.add_claim(claim("counted", "p1", &[("nic", "eth1", macvlan("10.0.1.5/24"))]));
    world.add_claim(claim(
        "quiet",
        "p1",
        &[(
            "nic",
            "eth1",
            json!({"mode": "macvlan", "stats": false, "ipam": {"addresses": ["10.0.1.6/24"]}}),
        )],
    ));
    let service = Arc::new(world.service());
    let mut changes = service.changes();
    changes.borrow_and_update();
    assert!(service.snapshot().is_empty());
    run(&service, world.pod("p1")).await.unwrap();
    assert!(changes.has_changed().unwrap(), "the attach moved the counter");
    let mut snapshot = service.snapshot();
    snapshot.sort_by(|a, b| a.claim_name.cmp(&b.claim_name));
    let summary: Vec<_> = snapshot
        .iter()
        .map(|w| (w.claim_name.as_str(), w.interface.as_str(), w.stats, w.pod_name.as_str()))
        .collect();
    assert_eq!(summary, [("counted", "net1", true, "pod-p1"), ("quiet", "net2", false, "pod-p1")]);

    let writes_before = world.status.statuses.lock().unwrap().len();
    let stats = InterfaceStats {
        rx: DirectionCounters { bytes: 420, packets: 5, icmp: 5, ..Default::default() },
        tx: DirectionCounters { bytes: 420, packets: 5, icmp: 5, ..Default::default() },
        rx_dropped: 0,
        tx_dropped: 1,
        ..Default::default()
    };
    let counted = snapshot[0].clone();
    service.collected(&[(counted.clone(), stats)]);
    service.changed(vec![(counted.clone(), stats)]);
    let statuses = world.status.statuses.lock().unwrap().clone();
    assert_eq!(statuses.len(), writes_before + 1, "one write for the one claim that changed");
    let entry = &world.status.last("counted")[0];
    let data = &entry.data.as_ref().unwrap().0;
    assert_eq!(data["stats"]["rxPackets"], 5);
    assert_eq!(data["stats"]["txDropped"], 1);
    assert_eq!(ready(std::slice::from_ref(entry))[0].1, "NetworkReady", "conditions untouched");
    let text = world.metrics.encode();
    assert!(
        text.contains(
            r#"netclaim_interface_rx_packets_total{namespace="ns",pod="pod-p1",claim="counted",interface="net1"} 5"#
        ),
        "{text}"
    );
    service.changed(vec![(counted, stats)]);
    assert_eq!(
        world.status.statuses.lock().unwrap().len(),
        writes_before + 1,
        "the same counters again are no new write"
    );

    service.stop_pod_sandbox(world.pod("p1")).await.unwrap();
    // The next event of the pod waits for the background link removal.
    service.remove_pod_sandbox(world.pod("p1")).await.unwrap();
    assert!(service.snapshot().is_empty(), "a stopped pod's interfaces leave the snapshot");
}

/// Two claims on one VLAN sub-interface, a daemon restart in between (a new service from the
/// store, `start`, `Synchronize`): the users are counted again from the stored plans, so the
/// first release keeps it and the last removes it. At start, a sub-interface of ours that no
/// stored pod uses is removed; an administrator's is left alone.
#[tokio::test]
async fn vlan_users_survive_a_restart_and_the_last_release_removes_it() {
    let world = World::new();
    let on_vlan = |address: &str, name: &str| {
        json!({"mode": "macvlan", "vlan": 100, "interface": {"name": name},
               "ipam": {"addresses": [address]}})
    };
    world.add_claim(claim("a", "p1", &[("nic", "eth1", on_vlan("10.0.1.5/24", "net1"))]));
    world.add_claim(claim("b", "p2", &[("nic", "eth1", on_vlan("10.0.1.6/24", "net2"))]));
    {
        let service = world.service();
        run(&service, world.pod("p1")).await.unwrap();
        run(&service, world.pod("p2")).await.unwrap();
        world.results_stored("p1").await;
        world.results_stored("p2").await;
    }
    assert_eq!(world.kernel.log().iter().filter(|l| l.starts_with("create vlan")).count(), 1);
    let ours = world.kernel.get(Side::Host, "eth1.100").unwrap();
    assert_eq!(ours.alias.as_deref(), Some("netclaim.dev/vlan parent=eth1 id=100"));
    world.kernel.add_host_link("eth1.7", 1500, Some("netclaim.dev/vlan parent=eth1 id=7"));
    world.kernel.add_host_link("eth1.8", 1500, None);

    let service = world.service();
    service.start().await;
    assert!(world.kernel.get(Side::Host, "eth1.7").is_none(), "ours, unused: removed");
    assert!(world.kernel.get(Side::Host, "eth1.8").is_some(), "not ours: kept");
    synchronize(&service, vec![world.pod("p1"), world.pod("p2")]).await;
    assert_eq!(service.vlans.users("eth1.100").await, ["uid-a", "uid-b"]);

    service.stop_pod_sandbox(world.pod("p1")).await.unwrap();
    // The next event of the pod waits for the background link removal.
    service.remove_pod_sandbox(world.pod("p1")).await.unwrap();
    assert_eq!(world.kernel.get(Side::Host, "eth1.100").map(|l| l.index), Some(ours.index));
    assert_eq!(service.vlans.users("eth1.100").await, ["uid-b"]);
    service.stop_pod_sandbox(world.pod("p2")).await.unwrap();
    // The next event of the pod waits for the background link removal.
    service.remove_pod_sandbox(world.pod("p2")).await.unwrap();
    assert!(world.kernel.get(Side::Host, "eth1.100").is_none(), "{:?}", world.kernel.log());
    assert_eq!(world.kernel.links(Side::Host), ["eth1", "eth1.8", "eth2"]);
    assert_eq!(world.kernel.log().iter().filter(|l| l.starts_with("create vlan")).count(), 1);
}

/// DESIGN §6 (decision 0018): a VF's settings are put on it at every attach, before the move
/// (kubelet answers a repeated prepare from the record, and a reboot blanked the VF); the
/// attach fails rather than hand the pod a VF without them. Other modes do not ask.
#[tokio::test]
async fn a_vf_gets_its_settings_before_every_move_into_a_pod_and_is_not_moved_without_them() {
    let world = World::new();
    world.kernel.add_host_link("eth9v1", 1500, None);
    *world.claims.kernel.lock().unwrap() = Some(Arc::clone(&world.kernel));
    let mut vf_claim = claim("vf", "p1", &[("vf", "eth9v1", json!({"mode": "host-device"}))]);
    vf_claim.devices[0].config.mode = crate::model::network_config::ResolvedMode::SriovVf;
    vf_claim.devices[0].kind = Some(DeviceKind::SriovVf);
    world.add_claim(vf_claim);
    world.add_claim(claim("web", "p1", &[("nic", "eth2", macvlan("10.0.2.5/24"))]));
    let service = world.service();
    world.claims.settings_fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = run(&service, world.pod("p1")).await.unwrap_err();
    assert!(format!("{err:?}").contains("device settings"), "{err:?}");
    assert!(world.kernel.get(Side::Host, "eth9v1").is_some(), "not moved");
    assert!(service.attachment("p1").is_none());
    world.claims.settings_fail.store(false, std::sync::atomic::Ordering::SeqCst);
    run(&service, world.pod("p1")).await.unwrap();
    assert!(world.kernel.get(Side::Host, "eth9v1").is_none(), "moved");
    let calls = world.claims.settings.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            ("uid-vf".to_owned(), "vf".to_owned(), true),
            ("uid-vf".to_owned(), "vf".to_owned(), true)
        ],
        "once per attach, before the move, for the VF only"
    );
}

/// DESIGN §6 ("never by a name that can change at boot"): a VF whose netdev has another name
/// than at prepare (a reboot, udev, its PF renamed) is found by its PCI address through the
/// claims and moved under its current name; in the pod it still gets the claim's name.
#[tokio::test]
async fn a_vf_renamed_since_prepare_is_found_by_pci_address_and_moved_under_the_claims_name() {
    let world = World::new();
    world.kernel.add_host_link("vf-boot2", 1500, None);
    *world.claims.kernel.lock().unwrap() = Some(Arc::clone(&world.kernel));
    let config = json!({"mode": "host-device", "interface": {"name": "vf0"}});
    let mut vf_claim = claim("vf", "p1", &[("vf", "eth9v1", config)]);
    vf_claim.devices[0].config.mode = crate::model::network_config::ResolvedMode::SriovVf;
    vf_claim.devices[0].kind = Some(DeviceKind::SriovVf);
    vf_claim.devices[0].vf = Some(crate::claims::PreparedVf {
        vf: crate::claims::vf::VfRef { pf: "eth9".to_owned(), index: 1 },
        pci: Some("0000:09:00.1".parse().unwrap()),
        boot_id: Some("boot-1".to_owned()),
        unresolved: false,
        before: crate::claims::vf::tests::fresh(),
    });
    world.add_claim(vf_claim);
    world.claims.host_names.lock().unwrap().push((
        "uid-vf".to_owned(),
        "vf".to_owned(),
        "vf-boot2".to_owned(),
    ));
    let service = world.service();
    run(&service, world.pod("p1")).await.unwrap();
    assert!(world.kernel.get(Side::Host, "vf-boot2").is_none(), "moved");
    assert_eq!(world.kernel.links(Side::Pod), ["vf0"], "the claim's pod-side name");
    let attachment = service.attachment("p1").unwrap();
    assert_eq!(attachment.moved_host_devices().collect::<Vec<_>>(), ["vf-boot2"]);
}
