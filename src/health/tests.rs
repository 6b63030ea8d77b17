use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::*;
use crate::model::device::Sharing;

fn device(name: &str, if_name: &str, kind: DeviceKind) -> Device {
    Device {
        name: name.to_owned(),
        if_name: if_name.to_owned(),
        kind,
        sharing: Sharing::Exclusive,
        shared_capacity: None,
        bandwidth: None,
        slot_index: None,
        attributes: BTreeMap::new(),
    }
}

fn facts(admin_up: bool, lower_up: bool, oper_state: OperState) -> LinkFacts {
    LinkFacts { admin_up: Some(admin_up), lower_up: Some(lower_up), oper_state, carrier: None }
}

fn host(observation: &LinkObservation) -> DeviceHealth {
    assess(&device("eth2", "eth2", DeviceKind::Physical), Placement::Host, observation)
}

#[test]
fn up_with_carrier_is_healthy() {
    let health = host(&LinkObservation::Present(facts(true, true, OperState::Up)));
    assert_eq!(health.status, HealthStatus::Healthy);
    assert_eq!(health.device, "eth2");
    assert_eq!(health.message, "eth2 is up with carrier");
}

#[test]
fn operstate_unknown_with_lower_up_is_healthy_and_without_any_state_is_unknown() {
    // dummy and some virtual NICs never leave operstate "unknown".
    let health = host(&LinkObservation::Present(facts(true, true, OperState::Unknown)));
    assert_eq!(health.status, HealthStatus::Healthy, "{}", health.message);
    let silent = LinkFacts {
        admin_up: Some(true),
        lower_up: None,
        oper_state: OperState::Unknown,
        carrier: None,
    };
    let health = host(&LinkObservation::Present(silent));
    assert_eq!(health.status, HealthStatus::Unknown);
    assert!(health.message.contains("eth2"), "{}", health.message);
}

#[test]
fn administratively_down_is_unhealthy_and_says_so() {
    let health = host(&LinkObservation::Present(facts(false, false, OperState::Down)));
    assert_eq!(health.status, HealthStatus::Unhealthy);
    assert_eq!(health.message, "eth2 is administratively down (operstate down)");
}

#[test]
fn no_carrier_is_unhealthy_whichever_signal_says_it() {
    for (facts, state) in [
        (facts(true, false, OperState::Down), "down"),
        (facts(true, false, OperState::LowerLayerDown), "lowerlayerdown"),
        // Only the operstate is known.
        (
            LinkFacts {
                admin_up: Some(true),
                lower_up: None,
                oper_state: OperState::Down,
                carrier: None,
            },
            "down",
        ),
        // IFLA_CARRIER off although the flag was not reported.
        (
            LinkFacts {
                admin_up: None,
                lower_up: None,
                oper_state: OperState::Unknown,
                carrier: Some(false),
            },
            "unknown",
        ),
    ] {
        let health = host(&LinkObservation::Present(facts));
        assert_eq!(health.status, HealthStatus::Unhealthy, "{facts:?}");
        assert_eq!(health.message, format!("eth2 has no carrier (operstate {state})"));
    }
}

#[test]
fn dormant_and_testing_are_not_operational() {
    for state in [OperState::Dormant, OperState::Testing] {
        let health = host(&LinkObservation::Present(facts(true, true, state)));
        assert_eq!(health.status, HealthStatus::Unhealthy);
        assert!(health.message.contains("not operational"), "{}", health.message);
    }
}

#[test]
fn a_removed_interface_and_a_gone_vf_are_unhealthy() {
    let health = host(&LinkObservation::Absent);
    assert_eq!(health.status, HealthStatus::Unhealthy);
    assert_eq!(health.message, "eth2 was removed: the interface is gone");
    let vf = device("pci-0000-3b-02-1", "ens1f0v1", DeviceKind::SriovVf);
    let health = assess(
        &vf,
        Placement::Pod { pod: "default/web", if_name: "net1" },
        &LinkObservation::Absent,
    );
    assert_eq!(health.status, HealthStatus::Unhealthy);
    assert_eq!(health.device, "pci-0000-3b-02-1");
    assert_eq!(
        health.message,
        "VF ens1f0v1 (net1 in pod default/web) is gone: its PF or driver removed the interface"
    );
}

#[test]
fn an_unreadable_state_is_unknown_with_the_reason() {
    let health = host(&LinkObservation::Unreadable("netlink dump failed: EPERM".into()));
    assert_eq!(health.status, HealthStatus::Unknown);
    assert_eq!(health.message, "cannot read the state of eth2: netlink dump failed: EPERM");
}

#[test]
fn a_nic_in_a_pod_is_named_with_its_pod_side_name() {
    let health = assess(
        &device("eth2", "eth2", DeviceKind::Physical),
        Placement::Pod { pod: "default/web", if_name: "net1" },
        &LinkObservation::Present(facts(false, false, OperState::Down)),
    );
    assert_eq!(health.status, HealthStatus::Unhealthy);
    assert_eq!(
        health.message,
        "eth2 (net1 in pod default/web) is administratively down (operstate down)"
    );
}

// --- the monitor, over fakes ---

#[derive(Debug, thiserror::Error)]
#[error("fake failure: {0}")]
struct FakeError(String);

/// The host's interfaces as the test sets them; discovery fails while `failing` is set.
#[derive(Clone, Default)]
struct FakeHost {
    interfaces: Arc<Mutex<Vec<HostInterface>>>,
    failing: Arc<Mutex<Option<String>>>,
    discoveries: Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeHost {
    fn set(&self, name: &str, up: bool) {
        let mut interfaces = self.interfaces.lock().unwrap();
        interfaces.retain(|i| i.name != name);
        let mut interface = HostInterface::new(7, name, 1500);
        interface.admin_up = Some(up);
        interface.lower_up = Some(up);
        interface.oper_state = if up { OperState::Up } else { OperState::Down };
        interfaces.push(interface);
    }

    fn remove(&self, name: &str) {
        self.interfaces.lock().unwrap().retain(|i| i.name != name);
    }
}

impl crate::inventory::publish::InterfaceSource for FakeHost {
    type Error = FakeError;

    async fn discover(&self) -> Result<Vec<HostInterface>, FakeError> {
        self.discoveries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(reason) = self.failing.lock().unwrap().clone() {
            return Err(FakeError(reason));
        }
        Ok(self.interfaces.lock().unwrap().clone())
    }
}

/// A watch [`FakePods`] started: the NIC and its reporter.
type StartedWatch = (MovedNic, Arc<LinkReporter>);

/// Pod watches: each start reports `Present(up)` at once and is kept for the test to drive;
/// starts fail while `refuse` is set.
#[derive(Clone, Default)]
struct FakePods {
    started: Arc<Mutex<Vec<StartedWatch>>>,
    refuse: Arc<Mutex<bool>>,
}

impl FakePods {
    fn reporter(&self, if_name: &str) -> Arc<LinkReporter> {
        let started = self.started.lock().unwrap();
        let (_, reporter) = started.iter().rev().find(|(nic, _)| nic.if_name == if_name).unwrap();
        Arc::clone(reporter)
    }
}

impl PodLinkSource for FakePods {
    type Error = FakeError;

    async fn watch(&self, nic: &MovedNic, reporter: LinkReporter) -> Result<(), FakeError> {
        if *self.refuse.lock().unwrap() {
            return Err(FakeError(format!("{} is gone", nic.netns.display())));
        }
        reporter.report(LinkObservation::Present(facts(true, true, OperState::Up)));
        self.started.lock().unwrap().push((nic.clone(), Arc::new(reporter)));
        Ok(())
    }
}

struct Harness {
    host: FakeHost,
    pods: FakePods,
    devices: watch::Sender<Vec<Device>>,
    moved: watch::Sender<BTreeMap<String, MovedNic>>,
    links: mpsc::Sender<()>,
    stop: watch::Sender<bool>,
    report: watch::Receiver<HealthReport>,
    task: tokio::task::JoinHandle<()>,
}

fn settings() -> MonitorSettings {
    let mut settings = MonitorSettings::new("node-a");
    settings.refresh = Duration::from_secs(10);
    settings.removed_retention = Duration::from_mins(1);
    settings
}

impl Harness {
    fn start(host: FakeHost, devices: Vec<Device>) -> Self {
        let pods = FakePods::default();
        let (devices, devices_rx) = watch::channel(devices);
        let (moved, moved_rx) = watch::channel(BTreeMap::new());
        let (links, links_rx) = mpsc::channel(1);
        let (stop, stop_rx) = watch::channel(false);
        let (out, report) = watch::channel(HealthReport::default());
        let inputs = MonitorInputs {
            devices: devices_rx,
            moved: moved_rx,
            link_changes: links_rx,
            stop: stop_rx,
        };
        let task = tokio::spawn(run(settings(), host.clone(), pods.clone(), inputs, out));
        Self { host, pods, devices, moved, links, stop, report, task }
    }

    /// Waits (in paused time) until the device's status is `status`; returns its message.
    async fn wait_for(&mut self, device: &str, status: HealthStatus) -> String {
        self.wait_until(device, status, |_| true).await
    }

    /// [`Self::wait_for`] a status with a message that `check` accepts.
    async fn wait_until(
        &mut self,
        device: &str,
        status: HealthStatus,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let mut report = self.report.clone();
        let found = tokio::time::timeout(
            Duration::from_secs(30),
            report.wait_for(|r| {
                r.devices
                    .iter()
                    .any(|d| d.device == device && d.status == status && check(&d.message))
            }),
        )
        .await;
        let Ok(found) = found else {
            panic!("{device} never became {status:?}: {:?}", *self.report.borrow());
        };
        found.unwrap().devices.iter().find(|d| d.device == device).unwrap().message.clone()
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap();
    }
}

fn pod_nic(pod: &str) -> MovedNic {
    MovedNic {
        netns: format!("/run/netns/{pod}").into(),
        pod: format!("default/{pod}"),
        if_name: "net1".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn host_devices_follow_link_changes() {
    let host = FakeHost::default();
    host.set("eth1", true);
    host.set("eth2", true);
    let devices = vec![
        device("eth1", "eth1", DeviceKind::Physical),
        device("eth2", "eth2", DeviceKind::Physical),
    ];
    let mut harness = Harness::start(host, devices);
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    {
        let report = harness.report.borrow();
        assert_eq!(report.pool, "node-a");
        let names: Vec<&str> = report.devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(names, ["eth1", "eth2"]);
    }

    harness.host.set("eth2", false);
    harness.links.send(()).await.unwrap();
    let message = harness.wait_for("eth2", HealthStatus::Unhealthy).await;
    assert_eq!(message, "eth2 is administratively down (operstate down)");
    assert_eq!(harness.report.borrow().devices[0].status, HealthStatus::Healthy, "eth1 untouched");

    harness.host.set("eth2", true);
    harness.links.send(()).await.unwrap();
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    harness.stop().await;
}

/// A burst of pod starts is a stream of host link notifications (one veth each): the
/// monitor rediscovers at most once a second through it, and still sees the last change.
#[tokio::test(start_paused = true)]
async fn a_stream_of_notifications_rediscovers_at_most_once_a_second() {
    use std::sync::atomic::Ordering;
    let host = FakeHost::default();
    host.set("eth2", true);
    let mut harness = Harness::start(host, vec![device("eth2", "eth2", DeviceKind::Physical)]);
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    let before = harness.host.discoveries.load(Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    // 5 s of a notification every 20 ms (250 in all).
    for _ in 0..250 {
        harness.links.send(()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = harness.host.discoveries.load(Ordering::SeqCst) - before;
    assert!((4..=6).contains(&during), "{during} rediscoveries in 5 s of notifications");
    // The last notification of the stream carries a change: seen within the bound.
    harness.host.set("eth2", false);
    harness.links.send(()).await.unwrap();
    let changed = tokio::time::Instant::now();
    harness.wait_for("eth2", HealthStatus::Unhealthy).await;
    assert!(changed.elapsed() <= Duration::from_millis(1050), "{:?}", changed.elapsed());
    assert!(started.elapsed() < Duration::from_secs(7));
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_notification_is_caught_by_the_refresh() {
    let host = FakeHost::default();
    host.set("eth2", true);
    let mut harness = Harness::start(host, vec![device("eth2", "eth2", DeviceKind::Physical)]);
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    harness.host.set("eth2", false);
    // No notification: the 10 s refresh rediscovers.
    let started = tokio::time::Instant::now();
    harness.wait_for("eth2", HealthStatus::Unhealthy).await;
    assert!(started.elapsed() <= Duration::from_secs(10), "{:?}", started.elapsed());
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_discovery_makes_host_devices_unknown() {
    let host = FakeHost::default();
    host.set("eth2", true);
    let mut harness = Harness::start(host, vec![device("eth2", "eth2", DeviceKind::Physical)]);
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    *harness.host.failing.lock().unwrap() = Some("netlink: EPERM".into());
    harness.links.send(()).await.unwrap();
    let message = harness.wait_for("eth2", HealthStatus::Unknown).await;
    assert_eq!(
        message,
        "cannot read the state of eth2: discovering the host's interfaces failed: fake failure: \
         netlink: EPERM"
    );
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_moved_nic_is_watched_in_its_pod_until_it_leaves() {
    let host = FakeHost::default();
    host.set("eth2", true);
    let mut harness = Harness::start(host, vec![device("eth2", "eth2", DeviceKind::Physical)]);
    harness.wait_for("eth2", HealthStatus::Healthy).await;

    // Marked moved before the move: the watch starts at once.
    harness.moved.send(BTreeMap::from([("eth2".to_owned(), pod_nic("web"))])).unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let reporter = harness.pods.reporter("net1");
    assert_eq!(harness.pods.started.lock().unwrap()[0].0, pod_nic("web"));
    // The move: gone from the host, present (up) in the pod.
    harness.host.remove("eth2");
    harness.links.send(()).await.unwrap();
    let message = harness.wait_for("eth2", HealthStatus::Healthy).await;
    assert_eq!(message, "eth2 (net1 in pod default/web) is up with carrier");

    // Link down inside the pod.
    reporter.report(LinkObservation::Present(facts(false, false, OperState::Down)));
    let message = harness.wait_for("eth2", HealthStatus::Unhealthy).await;
    assert_eq!(message, "eth2 (net1 in pod default/web) is administratively down (operstate down)");
    // Gone inside the pod and not back on the host.
    reporter.report(LinkObservation::Absent);
    let message =
        harness.wait_until("eth2", HealthStatus::Unhealthy, |m| m.contains("removed")).await;
    assert_eq!(message, "eth2 (net1 in pod default/web) was removed: the interface is gone");

    // The pod stops: the NIC is back on the host and the pod watch is released.
    harness.host.set("eth2", true);
    harness.moved.send(BTreeMap::new()).unwrap();
    harness.links.send(()).await.unwrap();
    let message = harness.wait_for("eth2", HealthStatus::Healthy).await;
    assert_eq!(message, "eth2 is up with carrier");
    assert!(reporter.is_closed(), "the pod watch is dropped when the NIC leaves the pod");
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_watch_that_cannot_start_is_unknown_and_retried() {
    let host = FakeHost::default();
    let mut harness = Harness::start(host, vec![device("eth2", "eth2", DeviceKind::Physical)]);
    *harness.pods.refuse.lock().unwrap() = true;
    harness.moved.send(BTreeMap::from([("eth2".to_owned(), pod_nic("web"))])).unwrap();
    let message = harness.wait_for("eth2", HealthStatus::Unknown).await;
    assert_eq!(
        message,
        "cannot read the state of eth2 (net1 in pod default/web): cannot watch net1 in \
         /run/netns/web: fake failure: /run/netns/web is gone"
    );
    *harness.pods.refuse.lock().unwrap() = false;
    // Retried at the next refresh.
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_removed_device_stays_unhealthy_for_the_retention_then_goes() {
    let host = FakeHost::default();
    host.set("eth1", true);
    host.set("eth2", true);
    let both = vec![
        device("eth1", "eth1", DeviceKind::Physical),
        device("eth2", "eth2", DeviceKind::Physical),
    ];
    let mut harness = Harness::start(host, both.clone());
    harness.wait_for("eth2", HealthStatus::Healthy).await;
    harness.host.remove("eth2");
    harness.links.send(()).await.unwrap();
    harness.wait_for("eth2", HealthStatus::Unhealthy).await;
    // The publisher unpublishes it: still reported, as removed.
    harness.devices.send(vec![both[0].clone()]).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let message = harness.wait_for("eth2", HealthStatus::Unhealthy).await;
    assert_eq!(message, "eth2 was removed: the interface is gone");
    // After the retention (60 s here) it is dropped.
    tokio::time::sleep(Duration::from_secs(41)).await;
    let names: Vec<String> =
        harness.report.borrow().devices.iter().map(|d| d.device.clone()).collect();
    assert_eq!(names, ["eth1"]);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_device_republished_under_another_name_is_not_reported_removed() {
    let host = FakeHost::default();
    host.set("eth1", true);
    let mut harness = Harness::start(host, vec![device("eth1", "eth1", DeviceKind::Physical)]);
    harness.wait_for("eth1", HealthStatus::Healthy).await;
    // The slot fallback: the same interface, other device names.
    harness.devices.send(vec![device("eth1-slot-0", "eth1", DeviceKind::Physical)]).unwrap();
    harness.wait_for("eth1-slot-0", HealthStatus::Healthy).await;
    let names: Vec<String> =
        harness.report.borrow().devices.iter().map(|d| d.device.clone()).collect();
    assert_eq!(names, ["eth1-slot-0"]);
    harness.stop().await;
}
