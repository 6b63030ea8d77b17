//! What a pod waits for at sandbox creation (DESIGN §10, decision 0010), root only. The whole
//! path: `RunPodSandbox` from our NRI runtime side through the plugin into the real attach
//! service, with the store on disk, device metadata and claim statuses, until answered. Against
//! it: the bare rtnetlink floors (parent index cached, one lookup of the new link, nothing
//! else; the requests one at a time, each awaiting its ack, or pipelined: the ones after the
//! lookup in one datagram, acks read after), CNI macvlan + host-local run as a runtime runs
//! it, `podnet::apply` alone (the kernel part of the whole path), and the NRI crossing alone (a
//! host-network pod without claims, answered without work). IPv4 and dual stack, DAD off on
//! every side. The `stop` group times `StopPodSandbox` answered against the bare link
//! deletion, and podnet's detaches. Topology: throwaway host, pod and peer netns with veth
//! devices.
//!
//! After criterion's groups, every sequence runs again in interleaved rounds (the order
//! rotating each round) whose medians and per-round ratios are printed: the figures the
//! targets are about. Without `--bench` (`cargo test --benches`, as `make test` runs it) each
//! benchmark runs once and the rounds shrink to three; under CI, missing root or CNI plugins
//! fail it instead of skipping.
//!
//! Syscalls per attach: with `NETCLAIM_BENCH_MARK=1` every timed span of the rounds is framed
//! by two marker syscalls (a `stat` of a path that does not exist, naming the sequence), which
//! `benches/attach/syscalls.sh` finds in an `strace -f` of a run and counts between.

#![allow(missing_docs, reason = "a bench binary has no public API")]
#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]

use netclaim_testkit as kit;

mod baselines;
mod node;
mod routing;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use baselines::{
    POD_IF, bare_delete, bare_macvlan, bare_macvlan_pipelined, cni_config, cni_path, link_index,
    run_cni,
};
use criterion::{Criterion, SamplingMode};
use netclaim::host::netlink::{HostNetlink, NetlinkOps, open_in_netns};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacvlanMode, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
    Route, Sharing,
};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use node::Node;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
}

/// With `NETCLAIM_BENCH_MARK` set, a syscall `strace` shows with `label` in it (a `stat` of a
/// path that cannot exist): the frame `benches/attach/syscalls.sh` counts syscalls in.
pub(crate) fn mark(label: &str) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("NETCLAIM_BENCH_MARK").is_some()) {
        let _absent = std::fs::metadata(format!("/netclaim-bench-mark/{label}"));
    }
}

fn family(dual_stack: bool) -> &'static str {
    if dual_stack { "dual" } else { "v4" }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("running ip");
    assert!(status.success(), "ip {args:?} failed");
}

/// The benchmark's namespaces, deleted on drop.
struct Namespaces {
    names: Vec<String>,
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ignored = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

fn path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{name}"))
}

fn route(destination: &str, gateway: &str, metric: Option<u32>) -> Route {
    Route {
        destination: destination.parse().expect("a literal CIDR"),
        gateway: Some(gateway.parse().expect("a literal address")),
        metric,
    }
}

fn plan_for(
    mode: ResolvedMode,
    device: &HostDevice,
    pod: &str,
    name: &str,
    dual_stack: bool,
) -> AttachPlan {
    let mut addresses = vec!["10.77.0.2/24".parse().expect("a literal CIDR")];
    let mut routes = vec![route("10.88.0.0/16", "10.77.0.1", Some(50))];
    if dual_stack {
        addresses.push("fd00:77::2/64".parse().expect("a literal CIDR"));
        routes.push(route("fd00:88::/64", "fd00:77::1", None));
    }
    let config = ResolvedNetworkConfig {
        pod_network: None,
        mode,
        interface: ResolvedInterface { name: None, mtu: 1400, hardware_address: None },
        addressing: Addressing::Static(addresses),
        routes,
        vlan: None,
        sriov: None,
        stats: false,
        routing: netclaim::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    };
    let pod = PodNetns { pod_uid: "bench".to_owned(), path: path(pod) };
    plan_attach(&AttachRequest {
        claim_uid: "bench-claim",
        config: &config,
        device,
        pod: &pod,
        interface_name: name,
        pool_addresses: &[],
    })
    .expect("a valid plan")
}

/// The node topology, the in-process node and the plans every group uses.
struct Bench {
    runtime: tokio::runtime::Runtime,
    host: HostNetlink,
    /// A socket in the pod netns, to check what each sequence left there.
    pod: rtnetlink::Handle,
    vlans: VlanUsers,
    host_ns: String,
    pod_path: PathBuf,
    parent_index: u32,
    data_dir: PathBuf,
    node: Option<Node>,
    cni_dir: Option<PathBuf>,
    macvlan_plan: AttachPlan,
    macvlan_v4_plan: AttachPlan,
    host_device_plan: AttachPlan,
    _namespaces: Namespaces,
}

/// The shared parent (the dev API's claims allocate a share of `eth2`) and the exclusive
/// device; both live only in the bench's host netns.
const PARENT: &str = "eth2";
const EXCLUSIVE: &str = "eth1";

impl Bench {
    /// Throwaway host, pod and peer netns; veth parent `eth2` and exclusive veth `eth1` in
    /// the host netns, their peers in the peer netns with the gateway addresses. IPv6 DAD is
    /// off in the pod netns, so the CNI plugin's addresses are usable at once, as ours are
    /// (`IFA_F_NODAD`).
    fn new(cni_dir: Option<PathBuf>) -> Self {
        let prefix = format!("ncb{:x}", std::process::id() & 0xffff);
        let (host_ns, pod_ns, peer_ns) =
            (format!("{prefix}-h"), format!("{prefix}-p"), format!("{prefix}-q"));
        let namespaces =
            Namespaces { names: vec![host_ns.clone(), pod_ns.clone(), peer_ns.clone()] };
        for name in &namespaces.names {
            ip(&["netns", "add", name]);
        }
        let (peer, device_peer) = (format!("{prefix}p1"), format!("{prefix}d1"));
        for (a, b) in [(PARENT, &peer), (EXCLUSIVE, &device_peer)] {
            ip(&["-n", &host_ns, "link", "add", a, "type", "veth", "peer", "name", b]);
            ip(&["-n", &host_ns, "link", "set", b, "netns", &peer_ns]);
            ip(&["-n", &host_ns, "link", "set", a, "up"]);
            ip(&["-n", &peer_ns, "addr", "add", "10.77.0.1/24", "dev", b]);
            ip(&["-n", &peer_ns, "addr", "add", "fd00:77::1/64", "dev", b, "nodad"]);
            ip(&["-n", &peer_ns, "link", "set", b, "up"]);
        }
        for key in ["net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0"] {
            let status = Command::new("ip")
                .args(["netns", "exec", &pod_ns, "sysctl", "-q", "-w", key])
                .status()
                .expect("running sysctl");
            assert!(status.success(), "sysctl {key} in the pod netns failed");
        }
        let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let host =
            runtime.block_on(HostNetlink::in_netns(&path(&host_ns))).expect("host netns socket");
        let (pod, parent_index, node) = runtime.block_on(async {
            let (pod, _pod_ns) = open_in_netns(&path(&pod_ns)).await.expect("pod netns socket");
            let parent_index =
                link_index(host.handle(), PARENT).await.expect("the parent just created");
            (pod, parent_index, Node::start(&path(&host_ns)).await)
        });
        let device_of = |if_name: &str, sharing| HostDevice {
            if_name: if_name.to_owned(),
            kind: DeviceKind::Virtual,
            sharing,
            mtu: 1500,
            mac: None,
        };
        let macvlan = ResolvedMode::Macvlan { mode: MacvlanMode::Bridge };
        let shared = device_of(PARENT, Sharing::Shared);
        Self {
            macvlan_plan: plan_for(macvlan, &shared, &pod_ns, POD_IF, true),
            macvlan_v4_plan: plan_for(macvlan, &shared, &pod_ns, POD_IF, false),
            host_device_plan: plan_for(
                ResolvedMode::HostDevice,
                &device_of(EXCLUSIVE, Sharing::Exclusive),
                &pod_ns,
                "net2",
                true,
            ),
            runtime,
            host,
            pod,
            vlans: VlanUsers::new(),
            pod_path: path(&pod_ns),
            parent_index,
            host_ns,
            data_dir: std::env::temp_dir().join(format!("{prefix}-cni")),
            node: Some(node),
            cni_dir,
            _namespaces: namespaces,
        }
    }

    fn node(&self) -> &Node {
        self.node.as_ref().expect("the node runs until the bench is dropped")
    }

    /// Fails the run when a sequence left `net1` in the pod, or did not create it.
    async fn expect_pod_interface(&self, present: bool) {
        let found = link_index(&self.pod, POD_IF).await.is_some();
        assert_eq!(found, present, "{POD_IF} in the pod netns: want present={present}");
    }

    /// One whole-path pod: prepared (untimed), `RunPodSandbox` answered (timed), then
    /// `StopPodSandbox` answered (timed) and the rest of the teardown (untimed).
    async fn whole_path(&self, dual_stack: bool) -> (Duration, Duration) {
        let pod = self.node().prepared_pod(dual_stack, &self.pod_path).await;
        let attached = self.node().run(&pod, &format!("whole-path-{}", family(dual_stack))).await;
        self.expect_pod_interface(true).await;
        let stopped = self.node().stop(pod).await;
        self.expect_pod_interface(false).await;
        (attached, stopped)
    }

    /// One bare sequence: attach and delete, both timed.
    async fn bare(&self, dual_stack: bool) -> (Duration, Duration) {
        mark(&format!("bare-sequential-{}/start", family(dual_stack)));
        let started = Instant::now();
        let (_pod, index) =
            bare_macvlan(self.host.handle(), &self.pod_path, self.parent_index, dual_stack).await;
        let attached = started.elapsed();
        mark(&format!("bare-sequential-{}/end", family(dual_stack)));
        self.expect_pod_interface(true).await;
        let started = Instant::now();
        bare_delete(&self.pod_path, index).await;
        let deleted = started.elapsed();
        self.expect_pod_interface(false).await;
        (attached, deleted)
    }

    /// One bare pipelined attach, timed; the delete untimed.
    async fn bare_pipelined(&self, dual_stack: bool) -> Duration {
        mark(&format!("bare-pipelined-{}/start", family(dual_stack)));
        let started = Instant::now();
        let (_batch, index) = bare_macvlan_pipelined(
            self.host.handle(),
            &self.pod_path,
            self.parent_index,
            dual_stack,
        )
        .await;
        let attached = started.elapsed();
        mark(&format!("bare-pipelined-{}/end", family(dual_stack)));
        self.expect_pod_interface(true).await;
        bare_delete(&self.pod_path, index).await;
        self.expect_pod_interface(false).await;
        attached
    }

    /// One `podnet` apply (pod socket included), timed; the detach untimed.
    async fn podnet(&self, plan: &AttachPlan) -> Duration {
        // The plan's step count tells the plans apart (dual stack, IPv4, routed).
        mark(&format!("podnet-{}-steps/start", plan.steps.len()));
        let started = Instant::now();
        let ops = NetlinkOps::open(&self.host, &self.pod_path).await.expect("pod socket");
        attach(&ops, &self.vlans, plan).await.expect("attach");
        let attached = started.elapsed();
        mark(&format!("podnet-{}-steps/end", plan.steps.len()));
        assert!(detach(&ops, &self.vlans, plan).await.is_clean());
        attached
    }

    /// One CNI ADD, timed; the DEL untimed.
    fn cni(&self, cni_dir: &Path, dual_stack: bool) -> Duration {
        let config = cni_config(PARENT, &self.data_dir, dual_stack);
        let host_path = path(&self.host_ns);
        mark(&format!("cni-{}/start", family(dual_stack)));
        let added = run_cni(&host_path, cni_dir, "macvlan", "ADD", &self.pod_path, &config);
        mark(&format!("cni-{}/end", family(dual_stack)));
        self.runtime.block_on(self.expect_pod_interface(true));
        run_cni(&host_path, cni_dir, "macvlan", "DEL", &self.pod_path, &config);
        self.runtime.block_on(self.expect_pod_interface(false));
        added
    }

    /// Sum of `iters` runs of `one`.
    fn repeat(iters: u64, mut one: impl FnMut() -> Duration) -> Duration {
        (0..iters).map(|_| one()).sum()
    }

    /// Times `detach` of `plan` (pod socket included); attaches untimed.
    fn time_detach(&self, plan: &AttachPlan, iters: u64) -> Duration {
        self.runtime.block_on(async {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let ops = NetlinkOps::open(&self.host, &self.pod_path).await.expect("pod socket");
                attach(&ops, &self.vlans, plan).await.expect("attach");
                drop(ops);
                let start = Instant::now();
                let ops = NetlinkOps::open_for_detach(&self.host, &self.pod_path)
                    .await
                    .expect("pod socket");
                assert!(detach(&ops, &self.vlans, plan).await.is_clean());
                total += start.elapsed();
            }
            total
        })
    }

    /// Interleaved rounds of every sequence for one address family; the order rotates each
    /// round, so none always follows the same one and all see the same machine load (this
    /// host runs other builds).
    fn rounds(&self, plan: &AttachPlan, dual_stack: bool, rounds: usize) -> Rounds {
        let mut result = Rounds::default();
        for round in 0..rounds {
            for turn in 0..6 {
                match (round + turn) % 6 {
                    0 => {
                        let (attached, stopped) =
                            self.runtime.block_on(self.whole_path(dual_stack));
                        result.whole.push(attached);
                        result.whole_stop.push(stopped);
                    }
                    1 => {
                        let (attached, deleted) = self.runtime.block_on(self.bare(dual_stack));
                        result.bare.push(attached);
                        result.bare_delete.push(deleted);
                    }
                    2 => result.podnet.push(self.runtime.block_on(self.podnet(plan))),
                    3 => result
                        .bare_pipelined
                        .push(self.runtime.block_on(self.bare_pipelined(dual_stack))),
                    4 => result.crossing.push(self.runtime.block_on(self.node().crossing())),
                    _ => {
                        if let Some(cni_dir) = &self.cni_dir {
                            result.cni.push(self.cni(cni_dir, dual_stack));
                        }
                    }
                }
            }
        }
        result
    }
}

/// Samples of [`Bench::rounds`], one per round and sequence (index = round).
#[derive(Default)]
struct Rounds {
    whole: Vec<Duration>,
    whole_stop: Vec<Duration>,
    podnet: Vec<Duration>,
    bare: Vec<Duration>,
    bare_pipelined: Vec<Duration>,
    bare_delete: Vec<Duration>,
    cni: Vec<Duration>,
    /// The NRI crossing alone ([`node::Node::crossing`]).
    crossing: Vec<Duration>,
}

impl Rounds {
    fn report(&self, label: &str) {
        let count = self.whole.len();
        println!("rounds {label} ({count} rounds, order rotating):");
        println!(
            "  attach medians: whole path {:?}, podnet {:?}, bare sequential {:?}, bare pipelined \
             {:?}, cni {}",
            median(&self.whole),
            median(&self.podnet),
            median(&self.bare),
            median(&self.bare_pipelined),
            if self.cni.is_empty() { "-".to_owned() } else { format!("{:?}", median(&self.cni)) },
        );
        println!(
            "  per-round ratio medians: whole/bare-sequential {:.2} (target <= 1.0), \
             whole/bare-pipelined {:.2} (target <= 1.15), whole/podnet {:.2}, \
             podnet/bare-pipelined {:.2}, bare-sequential/bare-pipelined {:.2}{}",
            ratio_median(&self.whole, &self.bare),
            ratio_median(&self.whole, &self.bare_pipelined),
            ratio_median(&self.whole, &self.podnet),
            ratio_median(&self.podnet, &self.bare_pipelined),
            ratio_median(&self.bare, &self.bare_pipelined),
            if self.cni.is_empty() {
                String::new()
            } else {
                format!(
                    ", cni/whole {:.1} (goal >= 15), cni/podnet {:.1}",
                    ratio_median(&self.cni, &self.whole),
                    ratio_median(&self.cni, &self.podnet)
                )
            },
        );
        // What the whole path spends beyond its kernel part and the crossing: the attach
        // service's own work (claims, gate, plan, pod record) and whatever the two cost more
        // together than apart (wake-ups).
        let apart: Vec<Duration> = self
            .podnet
            .iter()
            .zip(&self.crossing)
            .map(|(podnet, crossing)| *podnet + *crossing)
            .collect();
        let mut rest: Vec<f64> = self
            .whole
            .iter()
            .zip(&apart)
            .map(|(whole, apart)| whole.as_secs_f64() - apart.as_secs_f64())
            .collect();
        rest.sort_by(f64::total_cmp);
        println!(
            "  NRI crossing (a host-network pod without claims, answered without work) median \
             {:?}; per-round medians: whole - (podnet + crossing) {:.0} µs, whole/(podnet + \
             crossing) {:.2}",
            median(&self.crossing),
            rest[rest.len() / 2] * 1e6,
            ratio_median(&self.whole, &apart),
        );
        println!(
            "  stop: StopPodSandbox answered median {:?}, bare link delete median {:?}, \
             per-round ratio median {:.2}",
            median(&self.whole_stop),
            median(&self.bare_delete),
            ratio_median(&self.whole_stop, &self.bare_delete),
        );
    }
}

fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// Median of the per-round ratios `a[i] / b[i]`.
fn ratio_median(a: &[Duration], b: &[Duration]) -> f64 {
    let mut ratios: Vec<f64> =
        a.iter().zip(b).map(|(a, b)| a.as_secs_f64() / b.as_secs_f64()).collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            self.runtime.block_on(node.shutdown());
        }
        let _ignored = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Under CI a bench that cannot run fails instead of skipping.
fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "false")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // As criterion decides: without `--bench` (`cargo test --benches`) or with `--test`,
    // every benchmark runs once; the rounds shrink to a few.
    let smoke = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");
    if !is_root() {
        assert!(!under_ci(), "benches/attach needs root, and CI runs every bench");
        println!("SKIPPED: benches/attach needs root (it builds network namespaces)");
        return;
    }
    let cni_dir = cni_path();
    if cni_dir.is_none() {
        assert!(
            !under_ci(),
            "no macvlan and host-local CNI plugins in /usr/lib/cni (scripts/setup/20-podnet.sh \
             installs containernetworking-plugins)"
        );
        println!(
            "SKIPPED: CNI groups, no macvlan and host-local plugins in /usr/lib/cni (apt-get \
             install containernetworking-plugins, or set NETCLAIM_CNI_PATH)"
        );
    }
    let bench = Bench::new(cni_dir.clone());
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));

    let mut group = criterion.benchmark_group("attach");
    group.sampling_mode(SamplingMode::Flat);
    for (family, plan, dual_stack) in
        [("dual-stack", &bench.macvlan_plan, true), ("ipv4", &bench.macvlan_v4_plan, false)]
    {
        group.bench_function(format!("macvlan-{family}/whole-path"), |b| {
            b.iter_custom(|iters| {
                Bench::repeat(iters, || bench.runtime.block_on(bench.whole_path(dual_stack)).0)
            });
        });
        group.bench_function(format!("macvlan-{family}/podnet"), |b| {
            b.iter_custom(|iters| {
                Bench::repeat(iters, || bench.runtime.block_on(bench.podnet(plan)))
            });
        });
        group.bench_function(format!("macvlan-{family}/bare-rtnetlink"), |b| {
            b.iter_custom(|iters| {
                Bench::repeat(iters, || bench.runtime.block_on(bench.bare(dual_stack)).0)
            });
        });
        group.bench_function(format!("macvlan-{family}/bare-pipelined"), |b| {
            b.iter_custom(|iters| {
                Bench::repeat(iters, || bench.runtime.block_on(bench.bare_pipelined(dual_stack)))
            });
        });
        if let Some(cni_dir) = &cni_dir {
            group.bench_function(format!("macvlan-{family}/cni-macvlan+host-local"), |b| {
                b.iter_custom(|iters| Bench::repeat(iters, || bench.cni(cni_dir, dual_stack)));
            });
        }
    }
    group.bench_function("host-device/podnet", |b| {
        b.iter_custom(|iters| {
            Bench::repeat(iters, || bench.runtime.block_on(bench.podnet(&bench.host_device_plan)))
        });
    });
    routing::bench_function(&mut group, &bench);
    group.finish();

    let mut group = criterion.benchmark_group("stop");
    group.sampling_mode(SamplingMode::Flat);
    group.bench_function("macvlan-dual-stack/whole-path", |b| {
        b.iter_custom(|iters| {
            Bench::repeat(iters, || bench.runtime.block_on(bench.whole_path(true)).1)
        });
    });
    group.bench_function("macvlan-dual-stack/bare-rtnetlink", |b| {
        b.iter_custom(|iters| Bench::repeat(iters, || bench.runtime.block_on(bench.bare(true)).1));
    });
    group.bench_function("macvlan-dual-stack/podnet-detach", |b| {
        b.iter_custom(|iters| bench.time_detach(&bench.macvlan_plan, iters));
    });
    group.bench_function("host-device/podnet-detach", |b| {
        b.iter_custom(|iters| bench.time_detach(&bench.host_device_plan, iters));
    });
    group.finish();
    criterion.final_summary();

    let rounds = if smoke {
        3
    } else {
        std::env::var("NETCLAIM_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(200)
    };
    for (family, plan, dual_stack) in
        [("dual-stack", &bench.macvlan_plan, true), ("ipv4", &bench.macvlan_v4_plan, false)]
    {
        bench.rounds(plan, dual_stack, rounds).report(&format!("macvlan-{family}"));
    }
    routing::report(&bench, rounds);
}
