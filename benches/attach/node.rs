//! The whole path a pod waits for, in one process: `netclaim dev --api-only` for the claims,
//! the claim service and the attach service as the daemon builds them (store on disk, device
//! metadata on, claim statuses written to the API), our NRI plugin, and our NRI runtime side
//! announcing sandboxes to it over a Unix socket as containerd does. The runtime side runs on
//! its own thread and single-threaded runtime, as containerd is its own process; the plugin and
//! the services share a two-worker runtime, as in the daemon on this 2-core machine. The span
//! is timed on the runtime side's thread, from the call to its answer. The timed span ends when
//! the runtime side has the answer; the attach's completion (claim statuses, device metadata,
//! the record's results) runs after it, as in the daemon. Each timed call starts on an idle
//! node, as the baselines' do: the completions and status writes of earlier calls are done.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use netclaim::attach::{AttachService, DetachingPreparer, WithDeviceMetadata, plugin_events};
use netclaim::cdi::LocalFiles;
use netclaim::claims::ClaimPreparer;
use netclaim::claims::metadata::{DeviceMetadata, MetadataLayout};
use netclaim::host::netlink::HostNetlink;
use netclaim::k8s::claim_status::{Backoff, StatusWriter};
use netclaim::k8s::status_sink::KubeStatus;
use netclaim::metrics::Metrics;
use netclaim::model::ClaimRef;
use netclaim::store::Store;
use nri_rs::{NriRuntime, Plugin, PluginOptions, PodSandbox, RuntimeOptions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::kit::claims::{DRIVER, DevApi, NODE, Service, claim_service, network_config};

type Attach = AttachService<Arc<Service>, HostNetlink, Arc<Store>, WithDeviceMetadata<KubeStatus>>;

/// How long the plugin may take to register.
const REGISTRATION: Duration = Duration::from_secs(20);

/// The node: API server, services, plugin and runtime side.
pub(crate) struct Node {
    api: DevApi,
    runtime: RuntimeSide,
    preparer: DetachingPreparer<Arc<Service>, Arc<Attach>>,
    stop: CancellationToken,
    plugin: tokio::task::JoinHandle<()>,
    pods: AtomicU64,
    statuses: StatusWriter,
    attach: Arc<Attach>,
    _dir: tempfile::TempDir,
}

/// A sandbox the runtime side announced, with its prepared claim.
pub(crate) struct Running {
    sandbox: PodSandbox,
    claim: ClaimRef,
}

impl Node {
    /// Starts everything; host links are those of the netns at `host_netns` (the shared
    /// parent `eth2` of the dev API's allocations must be there).
    pub(crate) async fn start(host_netns: &Path) -> Self {
        let api = DevApi::start().await;
        // On the disk the daemon's state dir would be on (not a tmpfs), like the store.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
        let metadata = Arc::new(DeviceMetadata::new(
            MetadataLayout::new(DRIVER, &dir.path().join("plugin"), &dir.path().join("cdi")),
            LocalFiles,
        ));
        let (claims, store) =
            claim_service(&api, &dir.path().join("state"), Some(Arc::clone(&metadata)));
        let statuses = StatusWriter::new(api.client.clone(), DRIVER, Backoff::default(), None);
        let status = WithDeviceMetadata::new(
            KubeStatus::new(statuses.clone(), api.client.clone(), DRIVER, NODE),
            Some(metadata),
        );
        let host = HostNetlink::in_netns(host_netns).await.expect("host netns socket");
        let attach = Arc::new(
            AttachService::load(
                DRIVER,
                Arc::clone(&claims),
                host,
                store,
                status,
                Arc::new(Metrics::new()),
            )
            .expect("an empty state dir loads"),
        );
        attach.start().await;
        let socket = dir.path().join("nri.sock");
        let runtime = RuntimeSide::start(&socket);
        let options = PluginOptions::new("netclaim", "10")
            .expect("a valid name and index")
            .socket_path(&socket)
            .events(plugin_events());
        let plugin = Plugin::new(Arc::clone(&attach), options);
        let stop = CancellationToken::new();
        let token = stop.clone();
        let plugin = tokio::spawn(async move { plugin.run(token).await });
        runtime.call(Call::WaitForPlugin).await;
        let preparer = DetachingPreparer::new(claims, Arc::clone(&attach), || {});
        Self {
            api,
            runtime,
            preparer,
            stop,
            plugin,
            pods: AtomicU64::new(0),
            statuses,
            attach,
            _dir: dir,
        }
    }

    /// Untimed: a claim for one macvlan on `eth2` (MTU 1400, the routes the baselines set,
    /// addresses of its own: see [`config`]) allocated and reserved for a new pod, and prepared.
    pub(crate) async fn prepared_pod(&self, dual_stack: bool, netns: &Path) -> Running {
        let n = self.pods.fetch_add(1, Ordering::Relaxed);
        let name = format!("wp{n}");
        let share = format!("3f1c0c3e-0000-4000-8000-{n:012}");
        let claim = self
            .api
            .allocated_claim(&name, &[("nic", "eth2", Some(&share))], Some(config(dual_stack, n)))
            .await;
        let claim = ClaimRef {
            namespace: "default".to_owned(),
            name: name.clone(),
            uid: claim.metadata.uid.expect("a created claim has a uid"),
        };
        let prepared = self.preparer.prepare(vec![claim.clone()]).await;
        assert!(prepared.values().all(Result::is_ok), "prepare failed: {prepared:?}");
        let sandbox = PodSandbox {
            id: format!("sandbox-{name}"),
            uid: format!("pod-uid-{name}"),
            name: format!("pod-{name}"),
            namespace: "default".to_owned(),
            netns_path: Some(PathBuf::from(netns)),
            ..PodSandbox::default()
        };
        Running { sandbox, claim }
    }

    /// Untimed: waits until the attaches answered so far have completed and no claim status
    /// write is under way.
    async fn idle(&self) {
        self.attach.settled().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.statuses.in_flight() > 0 {
            assert!(Instant::now() < deadline, "claim status writes did not finish");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Timed: `RunPodSandbox` until the plugin answered (the interface is attached); framed by
    /// `label`'s markers ([`crate::mark`]).
    pub(crate) async fn run(&self, pod: &Running, label: &str) -> Duration {
        self.idle().await;
        crate::mark(&format!("{label}/start"));
        let attached = self.runtime.call(Call::Run(pod.sandbox.clone())).await;
        crate::mark(&format!("{label}/end"));
        attached
    }

    /// Timed: `RunPodSandbox` of a pod on the host network without claims, which the plugin
    /// answers without work: the NRI crossing alone (runtime side, socket, plugin and back),
    /// the part of [`Self::run`] that is neither the kernel's nor the attach's. Its stop and
    /// removal follow, untimed.
    pub(crate) async fn crossing(&self) -> Duration {
        self.idle().await;
        let n = self.pods.fetch_add(1, Ordering::Relaxed);
        let sandbox = PodSandbox {
            id: format!("sandbox-hostnet{n}"),
            uid: format!("pod-uid-hostnet{n}"),
            name: format!("pod-hostnet{n}"),
            namespace: "default".to_owned(),
            netns_path: None,
            ..PodSandbox::default()
        };
        crate::mark("nri-crossing/start");
        let crossed = self.runtime.call(Call::Run(sandbox.clone())).await;
        crate::mark("nri-crossing/end");
        self.runtime.call(Call::Stop(sandbox.clone())).await;
        self.runtime.call(Call::Remove(sandbox)).await;
        crossed
    }

    /// `StopPodSandbox` timed until answered; then, untimed, `RemovePodSandbox`, the
    /// unprepare (which waits until the link is gone) and the claim's deletion.
    pub(crate) async fn stop(&self, pod: Running) -> Duration {
        self.idle().await;
        let stopped = self.runtime.call(Call::Stop(pod.sandbox.clone())).await;
        self.runtime.call(Call::Remove(pod.sandbox.clone())).await;
        let unprepared = self.preparer.unprepare(vec![pod.claim.clone()]).await;
        assert!(unprepared.values().all(Result::is_ok), "unprepare failed: {unprepared:?}");
        self.api.delete_claim(&pod.claim.name).await;
        stopped
    }

    pub(crate) async fn shutdown(self) {
        self.stop.cancel();
        let _ignored = tokio::time::timeout(Duration::from_secs(5), self.plugin).await;
        self.runtime.shutdown();
    }
}

/// What the bench asks of the runtime side.
enum Call {
    WaitForPlugin,
    Run(PodSandbox),
    Stop(PodSandbox),
    Remove(PodSandbox),
}

/// Our NRI runtime side on its own thread; each call is timed there.
struct RuntimeSide {
    calls: tokio::sync::mpsc::UnboundedSender<(Call, tokio::sync::oneshot::Sender<Duration>)>,
    thread: std::thread::JoinHandle<()>,
}

impl RuntimeSide {
    fn start(socket: &Path) -> Self {
        let (calls, mut incoming) =
            tokio::sync::mpsc::unbounded_channel::<(Call, tokio::sync::oneshot::Sender<Duration>)>(
            );
        let socket = socket.to_owned();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the NRI runtime side");
            runtime.block_on(async move {
                let nri = NriRuntime::bind(RuntimeOptions::new(&socket)).expect("NRI socket");
                while let Some((call, answer)) = incoming.recv().await {
                    let started = Instant::now();
                    match call {
                        Call::WaitForPlugin => nri
                            .wait_for_plugins(1, REGISTRATION)
                            .await
                            .expect("the plugin registers"),
                        Call::Run(pod) => {
                            nri.run_pod_sandbox(&pod).await.expect("the sandbox is attached");
                        }
                        Call::Stop(pod) => nri.stop_pod_sandbox(&pod).await.expect("stop answered"),
                        Call::Remove(pod) => {
                            nri.remove_pod_sandbox(&pod).await.expect("remove answered");
                        }
                    }
                    let _ignored = answer.send(started.elapsed());
                }
                nri.shutdown().await;
            });
        });
        Self { calls, thread }
    }

    /// Runs `call` on the runtime side; how long it took there.
    async fn call(&self, call: Call) -> Duration {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.calls.send((call, answer)).expect("the runtime side runs");
        answered.await.expect("the runtime side answers (a failed call panics there)")
    }

    fn shutdown(self) {
        drop(self.calls);
        self.thread.join().expect("the runtime side's thread");
    }
}

/// The claim's NetworkConfig: the interface, addresses and routes the baselines create.
/// Pod `n`'s claim. Each pod gets addresses of its own: a released address is quarantined
/// for 30 s (DESIGN §4), and the bench prepares a new claim per iteration.
fn config(dual_stack: bool, n: u64) -> Value {
    let host = 2 + n % 65_000;
    let mut addresses = vec![format!("10.77.{}.{}/16", host / 256, host % 256)];
    let mut routes =
        vec![json!({"destination": "10.88.0.0/16", "gateway": "10.77.0.1", "metric": 50})];
    if dual_stack {
        addresses.push(format!("fd00:77::{host:x}/64"));
        routes.push(json!({"destination": "fd00:88::/64", "gateway": "fd00:77::1"}));
    }
    network_config(json!({
        "macvlan": {"mode": "bridge"},
        "interface": {"name": crate::baselines::POD_IF, "mtu": 1400},
        "ipam": {"addresses": addresses},
        "routes": routes,
    }))
}
