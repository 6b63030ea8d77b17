//! The stats service against an in-memory kernel: hooking follows the attached interfaces,
//! counters of an earlier run are adopted or removed, and the status gets only changes, once
//! per interval. Time is tokio's paused clock.

use std::path::Path;
use std::sync::Mutex;

use super::*;
use crate::model::stats::DirectionCounters;

#[derive(Debug, Default)]
struct FakeKernel {
    /// Counters hooked, by (pod, interface), with the packets seen so far.
    hooked: Mutex<BTreeMap<(String, String), u64>>,
    /// Every hook and unhook, in order.
    calls: Mutex<Vec<String>>,
    /// How many times the pins were listed (`hooked`).
    listings: Mutex<usize>,
}

impl FakeKernel {
    fn traffic(&self, pod: &str, interface: &str, packets: u64) {
        if let Some(seen) =
            self.hooked.lock().unwrap().get_mut(&(pod.to_owned(), interface.to_owned()))
        {
            *seen += packets;
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("fake kernel")]
struct FakeError;

impl CounterPort for Arc<FakeKernel> {
    type Error = FakeError;

    async fn hook(&self, _netns: &Path, pod_uid: &str, interface: &str) -> Result<(), FakeError> {
        self.calls.lock().unwrap().push(format!("hook {pod_uid}/{interface}"));
        self.hooked.lock().unwrap().insert((pod_uid.to_owned(), interface.to_owned()), 0);
        Ok(())
    }

    async fn unhook(
        &self,
        _netns: Option<&Path>,
        pod_uid: &str,
        interface: &str,
    ) -> Result<(), FakeError> {
        self.calls.lock().unwrap().push(format!("unhook {pod_uid}/{interface}"));
        self.hooked.lock().unwrap().remove(&(pod_uid.to_owned(), interface.to_owned()));
        Ok(())
    }

    async fn read(
        &self,
        _netns: &Path,
        pod_uid: &str,
        interfaces: &[String],
    ) -> Result<Vec<Option<InterfaceStats>>, FakeError> {
        let hooked = self.hooked.lock().unwrap();
        Ok(interfaces
            .iter()
            .map(|interface| {
                hooked.get(&(pod_uid.to_owned(), interface.clone())).map(|packets| InterfaceStats {
                    rx: DirectionCounters {
                        packets: *packets,
                        bytes: packets * 100,
                        ..Default::default()
                    },
                    ..Default::default()
                })
            })
            .collect())
    }

    fn hooked(&self) -> Result<Vec<(String, String)>, FakeError> {
        *self.listings.lock().unwrap() += 1;
        Ok(self.hooked.lock().unwrap().keys().cloned().collect())
    }
}

#[derive(Debug, Default)]
struct Recorder {
    collections: Mutex<Vec<Vec<(String, u64)>>>,
    changes: Mutex<Vec<Vec<(String, u64)>>>,
}

fn summary(samples: &[(WatchedInterface, InterfaceStats)]) -> Vec<(String, u64)> {
    samples.iter().map(|(w, s)| (format!("{}/{}", w.pod_uid, w.interface), s.rx.packets)).collect()
}

impl StatsSink for Arc<Recorder> {
    fn collected(&self, samples: &[(WatchedInterface, InterfaceStats)]) {
        self.collections.lock().unwrap().push(summary(samples));
    }

    fn changed(&self, samples: Vec<(WatchedInterface, InterfaceStats)>) {
        self.changes.lock().unwrap().push(summary(&samples));
    }
}

fn interface(pod: &str, name: &str, stats: bool) -> WatchedInterface {
    WatchedInterface {
        pod_uid: pod.to_owned(),
        pod_namespace: "default".to_owned(),
        pod_name: format!("pod-{pod}"),
        netns: PathBuf::from(format!("/run/netns/{pod}")),
        claim_uid: format!("claim-{pod}"),
        claim_name: format!("{pod}-net"),
        request: "net".to_owned(),
        pool: "node-a".to_owned(),
        device: "eth1".to_owned(),
        share_id: None,
        interface: name.to_owned(),
        stats,
    }
}

/// The attach service's side: a list and its change counter.
#[derive(Debug)]
struct Attached {
    list: Mutex<Vec<WatchedInterface>>,
    version: watch::Sender<u64>,
}

impl Attached {
    fn send_replace(&self, list: Vec<WatchedInterface>) {
        *self.list.lock().unwrap() = list;
        self.version.send_modify(|v| *v += 1);
    }
}

impl AttachedInterfaceSource for Arc<Attached> {
    fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn snapshot(&self) -> Vec<WatchedInterface> {
        self.list.lock().unwrap().clone()
    }
}

struct Running {
    kernel: Arc<FakeKernel>,
    recorder: Arc<Recorder>,
    interfaces: Arc<Attached>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(
    kernel: Arc<FakeKernel>,
    initial: Vec<WatchedInterface>,
    settings: StatsSettings,
) -> Running {
    let recorder = Arc::new(Recorder::default());
    let interfaces =
        Arc::new(Attached { list: Mutex::new(initial), version: watch::Sender::new(0) });
    let (shutdown, shutdown_receiver) = watch::channel(false);
    let service = StatsService::new(Arc::clone(&kernel), settings);
    let task = tokio::spawn(service.run(
        Arc::clone(&interfaces),
        Arc::clone(&recorder),
        shutdown_receiver,
    ));
    Running { kernel, recorder, interfaces, shutdown, task }
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

const EVERY_5S: StatsSettings = StatsSettings {
    collect_every: Duration::from_secs(5),
    status_every: Some(Duration::from_secs(10)),
};

#[tokio::test(start_paused = true)]
async fn counters_follow_the_attached_interfaces_and_stats_false_is_left_alone() {
    let run = start(Arc::default(), vec![interface("a", "net1", true)], EVERY_5S);
    settle().await;
    run.interfaces.send_replace(vec![
        interface("a", "net1", true),
        interface("b", "net1", false),
        interface("c", "net2", true),
    ]);
    settle().await;
    run.interfaces.send_replace(vec![interface("c", "net2", true)]);
    settle().await;
    assert_eq!(
        *run.kernel.calls.lock().unwrap(),
        ["hook a/net1", "hook c/net2", "unhook a/net1"],
        "b asked for no stats; a was detached"
    );
    run.shutdown.send_replace(true);
    run.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_restart_adopts_the_counters_of_attached_interfaces_and_removes_the_others() {
    let kernel = Arc::new(FakeKernel::default());
    for (pod, name) in [("a", "net1"), ("gone", "net1")] {
        kernel.hooked.lock().unwrap().insert((pod.to_owned(), name.to_owned()), 42);
    }
    let run = start(kernel, vec![interface("a", "net1", true)], EVERY_5S);
    settle().await;
    assert_eq!(*run.kernel.calls.lock().unwrap(), ["unhook gone/net1"], "a is not re-hooked");
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(
        run.recorder.collections.lock().unwrap()[0],
        [("a/net1".to_owned(), 42)],
        "the counts of the earlier run go on"
    );
    run.shutdown.send_replace(true);
    run.task.await.unwrap();
}

/// `stats: false` with a bandwidth ceiling: the ceilings' port hooked the programs; the
/// service neither counts them nor removes them while the interface is attached (a restart
/// included), and removes them once it is gone.
#[tokio::test(start_paused = true)]
async fn programs_hooked_for_a_ceiling_alone_stay_while_attached_and_go_with_the_interface() {
    let kernel = Arc::new(FakeKernel::default());
    kernel.hooked.lock().unwrap().insert(("p".to_owned(), "net1".to_owned()), 7);
    let run = start(kernel, vec![interface("p", "net1", false)], EVERY_5S);
    settle().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert!(run.kernel.calls.lock().unwrap().is_empty(), "kept at the restart");
    assert_eq!(run.recorder.collections.lock().unwrap()[0], [], "and not counted");
    run.interfaces.send_replace(vec![interface("p", "net1", false), interface("q", "net1", true)]);
    settle().await;
    assert_eq!(*run.kernel.calls.lock().unwrap(), ["hook q/net1"], "still attached: kept");
    run.interfaces.send_replace(vec![interface("q", "net1", true)]);
    settle().await;
    assert_eq!(*run.kernel.calls.lock().unwrap(), ["hook q/net1", "unhook p/net1"]);
    run.shutdown.send_replace(true);
    run.task.await.unwrap();
}

/// A burst of attaches only grows the attached set: the pins (a directory read per pod) are
/// not listed for it; an interface leaving lists them, and the collection removes the
/// ceiling programs of an interface that never showed up attached.
#[tokio::test(start_paused = true)]
async fn pins_are_listed_when_an_interface_leaves_or_at_the_collection_not_per_attach() {
    let run = start(Arc::default(), vec![interface("a", "net1", true)], EVERY_5S);
    settle().await;
    let listed = *run.kernel.listings.lock().unwrap();
    let mut attached = vec![interface("a", "net1", true)];
    for pod in ["b", "c", "d"] {
        attached.push(interface(pod, "net1", pod != "c"));
        run.interfaces.send_replace(attached.clone());
        settle().await;
    }
    assert_eq!(*run.kernel.listings.lock().unwrap(), listed, "growing: no listing");
    assert_eq!(*run.kernel.calls.lock().unwrap(), ["hook a/net1", "hook b/net1", "hook d/net1"]);

    // The ceilings' port hooked an interface whose attach then failed: gone by the next
    // collection (5 s).
    run.kernel.hooked.lock().unwrap().insert(("z".to_owned(), "net1".to_owned()), 0);
    tokio::time::advance(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(run.kernel.calls.lock().unwrap().last().unwrap(), "unhook z/net1");

    let listed = *run.kernel.listings.lock().unwrap();
    attached.retain(|i| i.pod_uid != "b");
    run.interfaces.send_replace(attached);
    settle().await;
    assert_eq!(*run.kernel.listings.lock().unwrap(), listed + 1, "b left: listed");
    assert_eq!(run.kernel.calls.lock().unwrap().last().unwrap(), "unhook b/net1");
    run.shutdown.send_replace(true);
    run.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_status_gets_changed_counters_once_per_interval_and_prometheus_every_collection() {
    let run = start(
        Arc::default(),
        vec![interface("a", "net1", true), interface("b", "net1", true)],
        EVERY_5S,
    );
    settle().await;
    run.kernel.traffic("a", "net1", 3);
    // Collections every 5 s from 0 s; the status is due at 10, 20 and 30 s: the first report,
    // nothing changed at 20 s, b changed by 30 s.
    for _ in 0..4 {
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
    }
    run.kernel.traffic("b", "net1", 1);
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
    }
    assert_eq!(run.recorder.collections.lock().unwrap().len(), 7, "0, 5, …, 30 s");
    assert_eq!(
        *run.recorder.changes.lock().unwrap(),
        [vec![("a/net1".to_owned(), 3), ("b/net1".to_owned(), 0)], vec![("b/net1".to_owned(), 1)],],
        "first report of each, then only b, which changed"
    );
    run.shutdown.send_replace(true);
    run.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stats_interval_zero_keeps_prometheus_and_writes_no_status() {
    let settings = StatsSettings::from_status_interval(Duration::ZERO);
    assert_eq!((settings.collect_every, settings.status_every), (Duration::from_secs(15), None));
    let run = start(Arc::default(), vec![interface("a", "net1", true)], settings);
    settle().await;
    run.kernel.traffic("a", "net1", 5);
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(15)).await;
        settle().await;
    }
    assert_eq!(
        run.recorder.collections.lock().unwrap().last().unwrap(),
        &[("a/net1".to_owned(), 5)]
    );
    assert!(run.recorder.changes.lock().unwrap().is_empty());
    run.shutdown.send_replace(true);
    run.task.await.unwrap();
}

#[test]
fn collection_is_at_least_as_frequent_as_the_status() {
    let s = StatsSettings::from_status_interval(Duration::from_mins(5));
    assert_eq!(
        (s.collect_every, s.status_every),
        (Duration::from_secs(15), Some(Duration::from_mins(5)))
    );
    let s = StatsSettings::from_status_interval(Duration::from_secs(2));
    assert_eq!(
        (s.collect_every, s.status_every),
        (Duration::from_secs(2), Some(Duration::from_secs(2)))
    );
}
