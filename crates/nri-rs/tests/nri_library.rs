//! The NRI library against itself: our plugin side talking to our runtime side over a temp-dir
//! Unix socket (no containerd, no root).

#![allow(clippy::unwrap_used, reason = "test helpers panic with the failing value, like the tests")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nri_rs::{
    Container, Event, EventEntry, EventMask, HandlerError, NriRuntime, Plugin, PluginError,
    PluginHandler, PluginOptions, PluginStatus, PodSandbox, RuntimeError, RuntimeOptions,
    RuntimeProtocol,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Sync(Vec<String>),
    Run(PodSandbox),
    Stop(String),
    Remove(String),
    Create(String, String),
}

/// Records every call (and, for pod events, the runtime call that delivered them); refuses
/// containers of pods named `refuse-*`; sleeps in `RunPodSandbox` for pods named `slow-*` and
/// panics there for pods named `panic-*`.
struct Recorder {
    seen: mpsc::UnboundedSender<Seen>,
    via: mpsc::UnboundedSender<Option<EventEntry>>,
}

impl Recorder {
    /// A recorder whose entry points nobody reads.
    fn new(seen: mpsc::UnboundedSender<Seen>) -> Self {
        Self { seen, via: mpsc::unbounded_channel().0 }
    }
}

impl PluginHandler for Recorder {
    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), HandlerError> {
        let _ = self.seen.send(Seen::Sync(pods.into_iter().map(|p| p.name).collect()));
        Ok(())
    }
    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        if pod.name.starts_with("slow-") {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        assert!(!pod.name.starts_with("panic-"), "a handler that panics on {}", pod.name);
        let _ = self.via.send(nri_rs::event_entry());
        let _ = self.seen.send(Seen::Run(pod));
        Ok(())
    }
    async fn stop_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        let _ = self.via.send(nri_rs::event_entry());
        let _ = self.seen.send(Seen::Stop(pod.name));
        Ok(())
    }
    async fn remove_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        let _ = self.via.send(nri_rs::event_entry());
        let _ = self.seen.send(Seen::Remove(pod.name));
        Ok(())
    }
    async fn create_container(&self, pod: PodSandbox, c: Container) -> Result<(), HandlerError> {
        let _ = self.seen.send(Seen::Create(pod.name.clone(), c.name));
        if pod.name.starts_with("deadline-") {
            let left = nri_rs::call_deadline().map(|d| d - tokio::time::Instant::now());
            return Err(HandlerError::new(
                left.map_or("none".to_owned(), |d| d.as_micros().to_string()),
            ));
        }
        if pod.name.starts_with("refuse-") {
            return Err(HandlerError::new(format!("no containers for {}", pod.name)));
        }
        Ok(())
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    runtime: Option<NriRuntime>,
    seen: mpsc::UnboundedReceiver<Seen>,
    via: mpsc::UnboundedReceiver<Option<EventEntry>>,
    status: watch::Receiver<PluginStatus>,
    stop: CancellationToken,
    plugin_task: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(protocol: RuntimeProtocol, events: EventMask) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nri.sock");
        let runtime = bind_runtime(&socket, protocol, Duration::from_secs(2));
        let (tx, seen) = mpsc::unbounded_channel();
        let (via_tx, via) = mpsc::unbounded_channel();
        let options = PluginOptions::new("recorder", "10")
            .unwrap()
            .socket_path(&socket)
            .events(events)
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200));
        let plugin = Plugin::new(Arc::new(Recorder { seen: tx, via: via_tx }), options);
        let status = plugin.status();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let plugin_task = tokio::spawn(async move { plugin.run(token).await });
        runtime.wait_for_plugins(1, WAIT).await.unwrap();
        let mut fixture = Self {
            _dir: dir,
            socket,
            runtime: Some(runtime),
            seen,
            via,
            status,
            stop,
            plugin_task,
        };
        assert_eq!(fixture.next().await, Seen::Sync(vec![]));
        fixture
    }

    fn runtime(&self) -> &NriRuntime {
        self.runtime.as_ref().unwrap()
    }

    async fn next(&mut self) -> Seen {
        tokio::time::timeout(WAIT, self.seen.recv())
            .await
            .expect("handler call within the wait")
            .expect("handler alive")
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.plugin_task)
            .await
            .expect("plugin stops on request")
            .unwrap();
    }
}

fn bind_runtime(socket: &Path, protocol: RuntimeProtocol, request_timeout: Duration) -> NriRuntime {
    let mut options = RuntimeOptions::new(socket);
    options.protocol = protocol;
    options.request_timeout = request_timeout;
    NriRuntime::bind(options).unwrap()
}

fn pod(name: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{name}"),
        uid: format!("uid-{name}"),
        name: name.to_owned(),
        namespace: "default".to_owned(),
        netns_path: Some(PathBuf::from(format!("/var/run/netns/test-{name}"))),
        labels: BTreeMap::from([("app".to_owned(), name.to_owned())]),
        annotations: BTreeMap::new(),
        ips: vec![],
    }
}

fn container(pod: &PodSandbox, name: &str) -> Container {
    Container {
        id: format!("{}-{name}", pod.id),
        pod_sandbox_id: pod.id.clone(),
        name: name.to_owned(),
    }
}

async fn sandbox_lifecycle_reaches_the_handler(protocol: RuntimeProtocol) {
    let mut f = Fixture::start(protocol, EventMask::POD_SANDBOX_LIFECYCLE).await;
    let p = pod("web");
    f.runtime().run_pod_sandbox(&p).await.unwrap();
    assert_eq!(f.next().await, Seen::Run(p.clone()));
    f.runtime().stop_pod_sandbox(&p).await.unwrap();
    assert_eq!(f.next().await, Seen::Stop("web".into()));
    f.runtime().remove_pod_sandbox(&p).await.unwrap();
    assert_eq!(f.next().await, Seen::Remove("web".into()));
    let entry = match protocol {
        RuntimeProtocol::Legacy => EventEntry::StateChange,
        RuntimeProtocol::V0_12 => EventEntry::PodSandboxCall,
    };
    let mut via = Vec::new();
    while let Ok(seen) = f.via.try_recv() {
        via.push(seen);
    }
    assert_eq!(via, [Some(entry); 3], "run, stop and remove came through {entry:?}");
    assert_eq!(nri_rs::event_entry(), None, "outside a handler call there is none");
    // Not subscribed: CreateContainer is not sent, so nothing is refused or recorded.
    let refused = pod("refuse-me");
    f.runtime().create_container(&refused, &container(&refused, "app")).await.unwrap();
    assert!(f.seen.try_recv().is_err());
    f.stop().await;
}

#[tokio::test]
async fn sandbox_lifecycle_reaches_the_handler_over_per_event_rpcs() {
    sandbox_lifecycle_reaches_the_handler(RuntimeProtocol::V0_12).await;
}

#[tokio::test]
async fn sandbox_lifecycle_reaches_the_handler_over_state_change() {
    sandbox_lifecycle_reaches_the_handler(RuntimeProtocol::Legacy).await;
}

#[tokio::test]
async fn configure_reports_the_runtime_and_the_subscription() {
    let events = EventMask::POD_SANDBOX_LIFECYCLE.with(Event::CreateContainer);
    let f = Fixture::start(RuntimeProtocol::V0_12, events).await;
    let plugins = f.runtime().plugins();
    assert_eq!(plugins.len(), 1);
    assert_eq!(plugins[0].full_name(), "10-recorder");
    assert_eq!(plugins[0].events, EventMask(0xF));
    match &*f.status.borrow() {
        PluginStatus::Synchronized(info) => {
            assert_eq!(info.name, "netclaim");
            assert_eq!(info.nri_version.to_string(), "v0.12");
            assert_eq!(info.request_timeout, Duration::from_secs(2));
            assert_eq!(info.events, EventMask(0xF));
        }
        other => panic!("plugin not synchronized: {other:?}"),
    }
    f.stop().await;
}

#[tokio::test]
async fn bits_an_old_runtime_does_not_know_are_not_sent() {
    // UpdatePodSandbox (bit 12) is unknown before NRI 0.10: a legacy runtime rejects the whole
    // subscription ("invalid plugin events") if the plugin sends it.
    let events = EventMask::POD_SANDBOX_LIFECYCLE.with(Event::UpdatePodSandbox);
    let f = Fixture::start(RuntimeProtocol::Legacy, events).await;
    assert_eq!(f.runtime().plugins()[0].events, EventMask(0x7));
    f.stop().await;
    let mut f = Fixture::start(RuntimeProtocol::V0_12, events).await;
    assert_eq!(f.runtime().plugins()[0].events, EventMask(0x807));
    // UpdatePodSandbox is answered without reaching the handler.
    f.runtime().update_pod_sandbox(&pod("resized")).await.unwrap();
    assert!(f.seen.try_recv().is_err());
    assert_eq!(f.runtime().plugins().len(), 1);
    f.stop().await;
}

#[tokio::test]
async fn a_handler_knows_when_its_answer_is_due() {
    let events = EventMask::POD_SANDBOX_LIFECYCLE.with(Event::CreateContainer);
    let f = Fixture::start(RuntimeProtocol::V0_12, events).await;
    let asking = pod("deadline-probe");
    let err = f.runtime().create_container(&asking, &container(&asking, "app")).await.unwrap_err();
    let RuntimeError::PluginFailed { message, .. } = err else { panic!("unexpected error {err}") };
    // The runtime's 2 s request timeout minus the plugin's 250 ms reserve, less what passed.
    let micros: u64 = message.parse().unwrap_or_else(|_| panic!("no deadline: {message}"));
    let left = Duration::from_micros(micros);
    assert!(left <= Duration::from_millis(1750) && left > Duration::ZERO, "{left:?}");
    assert_eq!(nri_rs::call_deadline(), None, "outside a handler call there is none");
    f.stop().await;
}

#[tokio::test]
async fn refused_container_fails_at_the_runtime() {
    let events = EventMask::POD_SANDBOX_LIFECYCLE.with(Event::CreateContainer);
    let mut f = Fixture::start(RuntimeProtocol::Legacy, events).await;
    let ok = pod("fine");
    f.runtime().create_container(&ok, &container(&ok, "app")).await.unwrap();
    assert_eq!(f.next().await, Seen::Create("fine".into(), "app".into()));
    let bad = pod("refuse-this");
    let err = f.runtime().create_container(&bad, &container(&bad, "app")).await.unwrap_err();
    match err {
        RuntimeError::PluginFailed { plugin, event, message } => {
            assert_eq!(plugin, "10-recorder");
            assert_eq!(event, "CreateContainer");
            assert_eq!(message, "no containers for refuse-this");
        }
        other => panic!("unexpected error {other}"),
    }
    assert_eq!(f.next().await, Seen::Create("refuse-this".into(), "app".into()));
    // A refusal is an answer, not a failure: the plugin stays.
    assert_eq!(f.runtime().plugins().len(), 1);
    f.stop().await;
}

#[tokio::test]
async fn concurrent_events_are_all_delivered() {
    let mut f = Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    let runtime = Arc::new(f.runtime.take().unwrap());
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let runtime = Arc::clone(&runtime);
            tokio::spawn(async move { runtime.run_pod_sandbox(&pod(&format!("p{i}"))).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let mut names = BTreeSet::new();
    for _ in 0..200 {
        match f.next().await {
            Seen::Run(p) => assert!(names.insert(p.name)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(names.len(), 200);
    f.runtime = Arc::into_inner(runtime);
    f.stop().await;
}

fn big_pod(i: usize) -> PodSandbox {
    let mut p = pod(&format!("big-{i:03}"));
    p.annotations.insert("blob".into(), "x".repeat(5_000));
    p
}

#[tokio::test]
async fn large_synchronize_crosses_the_mux_intact() {
    let mut f = Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    // A new runtime that already knows 500 pods of ~5 kB each: its Synchronize is a ~2.5 MB
    // ttrpc message, far above the 4096 bytes a Go reader takes in one frame.
    let socket = f.socket.clone();
    drop(f.runtime.take());
    let runtime = bind_runtime(&socket, RuntimeProtocol::V0_12, Duration::from_secs(2));
    let expected: Vec<String> = (0..500).map(|i| big_pod(i).name).collect();
    for i in 0..500 {
        runtime.run_pod_sandbox(&big_pod(i)).await.unwrap();
    }
    runtime.wait_for_plugins(1, WAIT).await.unwrap();
    // Pods announced before the plugin reconnected were not sent to it: the first call it
    // sees is the full Synchronize.
    assert_eq!(f.next().await, Seen::Sync(expected));
    f.runtime = Some(runtime);
    f.stop().await;
}

#[tokio::test]
async fn split_synchronize_is_collected_into_one_call() {
    let mut f = Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    drop(f.runtime.take());
    let mut options = RuntimeOptions::new(&f.socket);
    options.sync_chunk_pods = Some(3);
    let runtime = NriRuntime::bind(options).unwrap();
    let expected: Vec<String> = (0..10).map(|i| format!("chunked-{i:02}")).collect();
    for name in &expected {
        runtime.run_pod_sandbox(&pod(name)).await.unwrap();
    }
    // Four messages (3 + 3 + 3 + 1 pods); the plugin answers `more` to the first three and
    // hands the handler all ten pods at once.
    runtime.wait_for_plugins(1, WAIT).await.unwrap();
    assert_eq!(f.next().await, Seen::Sync(expected));
    f.runtime = Some(runtime);
    f.stop().await;
}

#[tokio::test]
async fn plugin_reconnects_after_the_runtime_restarts() {
    let mut f = Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    let first = pod("before");
    f.runtime().run_pod_sandbox(&first).await.unwrap();
    assert_eq!(f.next().await, Seen::Run(first));

    drop(f.runtime.take());
    tokio::time::timeout(WAIT, f.status.wait_for(|s| *s == PluginStatus::Disconnected))
        .await
        .unwrap()
        .unwrap();
    // The plugin retries with backoff while nothing listens.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let runtime = bind_runtime(&f.socket, RuntimeProtocol::Legacy, Duration::from_secs(2));
    let existing = pod("survivor");
    runtime.run_pod_sandbox(&existing).await.unwrap();
    runtime.wait_for_plugins(1, WAIT).await.unwrap();
    assert_eq!(f.next().await, Seen::Sync(vec!["survivor".into()]));
    let after = pod("after");
    runtime.run_pod_sandbox(&after).await.unwrap();
    assert_eq!(f.next().await, Seen::Run(after));
    f.runtime = Some(runtime);
    f.stop().await;
}

/// A runtime that answers `RegisterPlugin` and then sends nothing would leave the plugin
/// registered without pod events; the plugin gives the connection up and reconnects.
#[tokio::test]
async fn a_registration_the_runtime_never_follows_up_is_abandoned_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let mut options = RuntimeOptions::new(&socket);
    options.stall_after_registration = 1;
    let runtime = NriRuntime::bind(options).unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let confirmation = Duration::from_millis(300);
    let options = PluginOptions::new("recorder", "10")
        .unwrap()
        .socket_path(&socket)
        .confirmation_timeout(confirmation)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200));
    let plugin = Plugin::new(Arc::new(Recorder::new(tx)), options);
    let mut status = plugin.status();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let started = Instant::now();
    let task = tokio::spawn(async move { plugin.run(token).await });

    // The stalled connection registers (the runtime answered) but is never synchronized.
    tokio::time::timeout(WAIT, status.wait_for(|s| *s == PluginStatus::Registered))
        .await
        .unwrap()
        .unwrap();
    assert!(runtime.plugins().is_empty(), "the stalled connection is not configured");
    // The second connection is configured and synchronized like any other.
    runtime.wait_for_plugins(1, WAIT).await.unwrap();
    assert!(started.elapsed() >= confirmation, "the first connection waited out its timeout");
    let synced = tokio::time::timeout(WAIT, seen.recv()).await.unwrap().unwrap();
    assert_eq!(synced, Seen::Sync(vec![]));
    let ran = pod("after-retry");
    runtime.run_pod_sandbox(&ran).await.unwrap();
    assert_eq!(tokio::time::timeout(WAIT, seen.recv()).await.unwrap().unwrap(), Seen::Run(ran));
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn runtime_shutdown_makes_the_plugin_reconnect() {
    let mut f = Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    let mut status = f.status.clone();
    f.runtime.take().unwrap().shutdown().await;
    tokio::time::timeout(WAIT, status.wait_for(|s| *s == PluginStatus::Disconnected))
        .await
        .unwrap()
        .unwrap();
    let runtime = bind_runtime(&f.socket, RuntimeProtocol::V0_12, Duration::from_secs(2));
    runtime.wait_for_plugins(1, WAIT).await.unwrap();
    assert_eq!(f.next().await, Seen::Sync(vec![]));
    f.runtime = Some(runtime);
    f.stop().await;
}

#[tokio::test]
async fn slow_handler_is_answered_before_the_runtime_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime = bind_runtime(&socket, RuntimeProtocol::V0_12, Duration::from_millis(400));
    let (tx, mut seen) = mpsc::unbounded_channel();
    let options = PluginOptions::new("slowpoke", "20").unwrap().socket_path(&socket);
    let plugin = Plugin::new(Arc::new(Recorder::new(tx)), options);
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move { plugin.run(token).await });
    runtime.wait_for_plugins(1, WAIT).await.unwrap();
    assert_eq!(seen.recv().await, Some(Seen::Sync(vec![])));

    let started = Instant::now();
    let err = runtime.run_pod_sandbox(&pod("slow-one")).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, RuntimeError::PluginFailed { message, .. } if message.contains("did not finish")),
        "{err}"
    );
    assert!(took < Duration::from_millis(400), "answered after {took:?}");
    // Answered in time, so the runtime keeps the plugin.
    assert_eq!(runtime.plugins().len(), 1);
    runtime.run_pod_sandbox(&pod("quick")).await.unwrap();
    // The late call was not dropped at its deadline: it finishes after it, on its own.
    let mut finished = Vec::new();
    while finished.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), seen.recv()).await {
            Ok(Some(Seen::Run(p))) => finished.push(p.name),
            other => panic!("expected both sandboxes to reach the handler, got {other:?}"),
        }
    }
    finished.sort();
    assert_eq!(finished, ["quick", "slow-one"]);
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_handler_that_panics_fails_its_call_and_the_plugin_serves_on() {
    let mut fixture =
        Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    let runtime = fixture.runtime.as_ref().unwrap();
    let err = runtime.run_pod_sandbox(&pod("panic-one")).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::PluginFailed { message, .. } if message.contains("panicked")),
        "{err}"
    );
    assert_eq!(runtime.plugins().len(), 1, "the runtime keeps the plugin");
    runtime.run_pod_sandbox(&pod("after")).await.unwrap();
    assert!(matches!(fixture.next().await, Seen::Run(p) if p.name == "after"));
    fixture.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_when_the_runtime_goes_away_still_runs_to_its_end() {
    let mut f = Fixture::start(RuntimeProtocol::V0_12, EventMask::POD_SANDBOX_LIFECYCLE).await;
    let runtime = f.runtime.take().unwrap();
    // `slow-*` sleeps 2 s in the handler; the runtime goes away 0.3 s into it, so the plugin
    // drops the connection and the request with it.
    let call = tokio::spawn(async move { runtime.run_pod_sandbox(&pod("slow-cut")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    call.abort();
    tokio::time::timeout(WAIT, f.status.wait_for(|s| *s == PluginStatus::Disconnected))
        .await
        .unwrap()
        .unwrap();
    // A handler cut off between two steps would leave half its work done (an interface
    // created and not recorded): it finishes instead.
    match tokio::time::timeout(Duration::from_secs(5), f.seen.recv()).await {
        Ok(Some(Seen::Run(p))) => assert_eq!(p.name, "slow-cut"),
        other => panic!("the handler did not finish: {other:?}"),
    }
    f.stop().await;
}

#[tokio::test]
async fn invalid_plugin_names_are_refused_before_connecting() {
    assert!(matches!(PluginOptions::new("bad name", "10"), Err(PluginError::InvalidName(_))));
    assert!(matches!(PluginOptions::new("ok", "7"), Err(PluginError::InvalidIndex(_))));
}

#[tokio::test]
async fn runtime_dying_mid_frame_ends_the_connection_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    // A fake runtime: waits for the plugin's first frame (RegisterPlugin), then sends half a
    // frame and dies.
    let fake = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut header = [0u8; 8];
        s.read_exact(&mut header).await.unwrap();
        let mut partial = 2u32.to_be_bytes().to_vec();
        partial.extend_from_slice(&1000u32.to_be_bytes());
        partial.extend_from_slice(&[0u8; 10]);
        s.write_all(&partial).await.unwrap();
    });
    let (tx, _seen) = mpsc::unbounded_channel();
    let plugin = Plugin::new(
        Arc::new(Recorder::new(tx)),
        PluginOptions::new("victim", "30").unwrap().socket_path(&socket),
    );
    let result = tokio::time::timeout(WAIT, plugin.run_once(&CancellationToken::new()))
        .await
        .expect("a dead peer must not hang the plugin");
    fake.await.unwrap();
    let err = result.unwrap_err();
    assert!(
        matches!(err, PluginError::Ttrpc { op: "RegisterPlugin", .. } | PluginError::Mux(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn run_pod_sandbox_round_trip_latency() {
    for protocol in [RuntimeProtocol::V0_12, RuntimeProtocol::Legacy] {
        let mut f = Fixture::start(protocol, EventMask::POD_SANDBOX_LIFECYCLE).await;
        let pods: Vec<_> = (0..2000).map(|i| pod(&format!("lat-{i}"))).collect();
        let mut samples = Vec::with_capacity(pods.len());
        for p in &pods {
            let t = Instant::now();
            f.runtime().run_pod_sandbox(p).await.unwrap();
            samples.push(t.elapsed());
        }
        for _ in &pods {
            assert!(matches!(f.next().await, Seen::Run(_)));
        }
        samples.sort();
        let pct = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
        println!(
            "NRI RunPodSandbox round trip ({protocol:?}, {} events): p50 {:?} p90 {:?} p99 {:?} max {:?}",
            samples.len(),
            pct(50),
            pct(90),
            pct(99),
            samples[samples.len() - 1]
        );
        // Far below the runtime's 2 s request timeout even in a debug build on a busy machine.
        assert!(pct(50) < Duration::from_millis(100), "p50 {:?}", pct(50));
        f.stop().await;
    }
}
