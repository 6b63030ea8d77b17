//! Attach latency (DESIGN §10), root only: macvlan through `podnet::apply` against the bare
//! rtnetlink sequence doing the same work, host-device attach, and both detaches. Each sample
//! opens the pod netns socket and runs the full sequence; the reverse operation runs untimed
//! between samples. Topology: throwaway "host" and "pod" netns with a veth parent.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures::TryStreamExt;
use netclaim::host::netlink::{HostNetlink, NetlinkOps, open_in_netns};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacvlanMode, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
    Route, Sharing,
};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::link::MacVlanMode;
use rtnetlink::{LinkMacVlan, LinkUnspec, RouteMessageBuilder};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
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

/// The same work as a macvlan plan, written directly against rtnetlink: pod socket, parent
/// lookup, create in the pod netns with name and MTU, lookup (index, MAC), two addresses, up,
/// two routes.
async fn bare_macvlan(
    host: &rtnetlink::Handle,
    pod_path: &std::path::Path,
    parent: &str,
    dual_stack: bool,
) -> u32 {
    let (pod, pod_ns) = open_in_netns(pod_path).await.expect("pod netns socket");
    let parent = host
        .link()
        .get()
        .match_name(parent.to_owned())
        .execute()
        .try_next()
        .await
        .expect("parent lookup")
        .expect("parent exists");
    host.link()
        .add(
            LinkMacVlan::new("net1", parent.header.index, MacVlanMode::Bridge)
                .mtu(1400)
                .setns_by_fd(std::os::fd::AsRawFd::as_raw_fd(&pod_ns))
                .build(),
        )
        .execute()
        .await
        .expect("macvlan create");
    let link = pod
        .link()
        .get()
        .match_name("net1".to_owned())
        .execute()
        .try_next()
        .await
        .expect("lookup")
        .expect("net1 exists");
    let index = link.header.index;
    pod.address()
        .add(index, Ipv4Addr::new(10, 77, 0, 2).into(), 24)
        .execute()
        .await
        .expect("v4 address");
    if dual_stack {
        let mut v6 =
            pod.address().add(index, "fd00:77::2".parse::<Ipv6Addr>().expect("literal").into(), 64);
        v6.message_mut().attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
        v6.execute().await.expect("v6 address");
    }
    pod.link().set(LinkUnspec::new_with_index(index).up().build()).execute().await.expect("up");
    pod.route()
        .add(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::new(10, 88, 0, 0), 16)
                .gateway(Ipv4Addr::new(10, 77, 0, 1))
                .output_interface(index)
                .priority(50)
                .build(),
        )
        .execute()
        .await
        .expect("v4 route");
    if dual_stack {
        pod.route()
            .add(
                RouteMessageBuilder::<Ipv6Addr>::new()
                    .destination_prefix("fd00:88::".parse().expect("literal"), 64)
                    .gateway("fd00:77::1".parse().expect("literal"))
                    .output_interface(index)
                    .build(),
            )
            .execute()
            .await
            .expect("v6 route");
    }
    index
}

/// Where Debian's `containernetworking-plugins` puts the plugins (override: `NETCLAIM_CNI_PATH`).
fn cni_path() -> Option<PathBuf> {
    let dir = std::env::var_os("NETCLAIM_CNI_PATH")
        .map_or_else(|| PathBuf::from("/usr/lib/cni"), PathBuf::from);
    dir.join("macvlan").exists().then_some(dir)
}

/// The CNI config doing the same work as the macvlan plan: macvlan bridge, MTU 1400, an IPv4
/// (and IPv6) address from `host-local`, one route per family.
fn cni_config(parent: &str, data_dir: &std::path::Path, dual_stack: bool) -> String {
    let mut ranges = vec![serde_json::json!([
        {"subnet": "10.77.0.0/24", "rangeStart": "10.77.0.2", "rangeEnd": "10.77.0.2"}
    ])];
    let mut routes = vec![serde_json::json!({"dst": "10.88.0.0/16", "gw": "10.77.0.1"})];
    if dual_stack {
        ranges.push(serde_json::json!([
            {"subnet": "fd00:77::/64", "rangeStart": "fd00:77::2", "rangeEnd": "fd00:77::2"}
        ]));
        routes.push(serde_json::json!({"dst": "fd00:88::/64", "gw": "fd00:77::1"}));
    }
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "type": "macvlan",
        "master": parent,
        "mode": "bridge",
        "mtu": 1400,
        "ipam": {"type": "host-local", "dataDir": data_dir, "ranges": ranges, "routes": routes}
    })
    .to_string()
}

/// Runs the macvlan plugin as a runtime would (`CNI_*` environment, config on stdin), from a
/// thread that entered the host netns: the child inherits that netns, like a runtime's plugin
/// runs in the node's. Returns how long `command` took.
fn run_cni(
    host_ns: &std::path::Path,
    cni_dir: &std::path::Path,
    command: &str,
    pod_ns: &std::path::Path,
    config: &str,
) -> Duration {
    let (host_ns, cni_dir, pod_ns) = (host_ns.to_owned(), cni_dir.to_owned(), pod_ns.to_owned());
    let (command, config) = (command.to_owned(), config.to_owned());
    std::thread::spawn(move || {
        let netns = std::fs::File::open(&host_ns).expect("host netns");
        #[allow(
            clippy::disallowed_methods,
            reason = "the CNI baseline runs the plugin from a throwaway thread in the node netns"
        )]
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("entering host netns");
        let start = Instant::now();
        let mut child = Command::new(cni_dir.join("macvlan"))
            .env("CNI_COMMAND", &command)
            .env("CNI_CONTAINERID", "bench")
            .env("CNI_NETNS", &pod_ns)
            .env("CNI_IFNAME", "net1")
            .env("CNI_PATH", &cni_dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawning the CNI plugin");
        std::io::Write::write_all(&mut child.stdin.take().expect("piped stdin"), config.as_bytes())
            .expect("writing the CNI config");
        let output = child.wait_with_output().expect("waiting for the CNI plugin");
        let elapsed = start.elapsed();
        assert!(
            output.status.success(),
            "CNI {command} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        elapsed
    })
    .join()
    .expect("the CNI thread")
}

/// The node topology and plans every group uses.
struct Bench {
    runtime: tokio::runtime::Runtime,
    host: HostNetlink,
    vlans: VlanUsers,
    host_ns: String,
    pod_path: PathBuf,
    parent: String,
    data_dir: PathBuf,
    macvlan_plan: AttachPlan,
    macvlan_v4_plan: AttachPlan,
    host_device_plan: AttachPlan,
    _namespaces: Namespaces,
}

impl Bench {
    /// Throwaway host, pod and peer netns; veth parent `p0` and exclusive veth `d0` in the
    /// host netns, their peers in the peer netns with the gateway addresses.
    fn new() -> Self {
        let prefix = format!("ncb{:x}", std::process::id() & 0xffff);
        let (host_ns, pod_ns, peer_ns) =
            (format!("{prefix}-h"), format!("{prefix}-p"), format!("{prefix}-q"));
        let namespaces =
            Namespaces { names: vec![host_ns.clone(), pod_ns.clone(), peer_ns.clone()] };
        for name in &namespaces.names {
            ip(&["netns", "add", name]);
        }
        let (parent, peer, device, device_peer) = (
            format!("{prefix}p0"),
            format!("{prefix}p1"),
            format!("{prefix}d0"),
            format!("{prefix}d1"),
        );
        for (a, b) in [(&parent, &peer), (&device, &device_peer)] {
            ip(&["-n", &host_ns, "link", "add", a, "type", "veth", "peer", "name", b]);
            ip(&["-n", &host_ns, "link", "set", b, "netns", &peer_ns]);
            ip(&["-n", &host_ns, "link", "set", a, "up"]);
            ip(&["-n", &peer_ns, "addr", "add", "10.77.0.1/24", "dev", b]);
            ip(&["-n", &peer_ns, "addr", "add", "fd00:77::1/64", "dev", b, "nodad"]);
            ip(&["-n", &peer_ns, "link", "set", b, "up"]);
        }
        let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let host =
            runtime.block_on(HostNetlink::in_netns(&path(&host_ns))).expect("host netns socket");
        let device_of = |if_name: &str, sharing| HostDevice {
            if_name: if_name.to_owned(),
            kind: DeviceKind::Virtual,
            sharing,
            mtu: 1500,
            mac: None,
        };
        let macvlan_plan = plan_for(
            ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
            &device_of(&parent, Sharing::Shared),
            &pod_ns,
            "net1",
            true,
        );
        let macvlan_v4_plan = plan_for(
            ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
            &device_of(&parent, Sharing::Shared),
            &pod_ns,
            "net1",
            false,
        );
        let host_device_plan = plan_for(
            ResolvedMode::HostDevice,
            &device_of(&device, Sharing::Exclusive),
            &pod_ns,
            "net2",
            true,
        );
        Self {
            runtime,
            host,
            vlans: VlanUsers::new(),
            pod_path: path(&pod_ns),
            host_ns,
            parent,
            data_dir: std::env::temp_dir().join(format!("{prefix}-cni")),
            macvlan_plan,
            macvlan_v4_plan,
            host_device_plan,
            _namespaces: namespaces,
        }
    }

    /// Times `attach` of `plan` (pod socket included); detaches untimed.
    fn time_attach(&self, plan: &AttachPlan, iters: u64) -> Duration {
        self.runtime.block_on(async {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let ops = NetlinkOps::open(&self.host, &self.pod_path).await.expect("pod socket");
                attach(&ops, &self.vlans, plan).await.expect("attach");
                total += start.elapsed();
                assert!(detach(&ops, &self.vlans, plan).await.is_clean());
            }
            total
        })
    }

    /// Times the bare rtnetlink macvlan sequence; deletes untimed.
    fn time_bare_macvlan(&self, iters: u64, dual_stack: bool) -> Duration {
        self.runtime.block_on(async {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                bare_macvlan(self.host.handle(), &self.pod_path, &self.parent, dual_stack).await;
                total += start.elapsed();
                let ops = NetlinkOps::open(&self.host, &self.pod_path).await.expect("pod socket");
                assert!(detach(&ops, &self.vlans, &self.macvlan_plan).await.is_clean());
            }
            total
        })
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

    /// Times CNI ADD of macvlan + host-local; DEL untimed.
    fn time_cni(&self, cni_dir: &std::path::Path, iters: u64, dual_stack: bool) -> Duration {
        let config = cni_config(&self.parent, &self.data_dir, dual_stack);
        let host_path = path(&self.host_ns);
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            total += run_cni(&host_path, cni_dir, "ADD", &self.pod_path, &config);
            run_cni(&host_path, cni_dir, "DEL", &self.pod_path, &config);
        }
        total
    }

    /// Interleaved A/B runs of podnet and the bare sequence (`rounds` each, alternating, so
    /// both see the same machine load; this host is shared with other builds): per-iteration
    /// medians and the median of the per-round ratios.
    fn paired(&self, plan: &AttachPlan, dual_stack: bool, rounds: usize) -> PairedResult {
        let mut podnet = Vec::with_capacity(rounds);
        let mut bare = Vec::with_capacity(rounds);
        for round in 0..rounds {
            // Alternate who goes first, so neither always follows the other's deletion.
            if round % 2 == 0 {
                podnet.push(self.time_attach(plan, 1));
                bare.push(self.time_bare_macvlan(1, dual_stack));
            } else {
                bare.push(self.time_bare_macvlan(1, dual_stack));
                podnet.push(self.time_attach(plan, 1));
            }
        }
        let mut ratios: Vec<f64> =
            podnet.iter().zip(&bare).map(|(p, b)| p.as_secs_f64() / b.as_secs_f64()).collect();
        ratios.sort_by(f64::total_cmp);
        PairedResult {
            podnet: median(&mut podnet),
            bare: median(&mut bare),
            ratio: ratios[ratios.len() / 2],
        }
    }
}

/// Result of [`Bench::paired`].
struct PairedResult {
    podnet: Duration,
    bare: Duration,
    ratio: f64,
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ignored = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn main() {
    if !is_root() {
        println!("SKIPPED: benches/attach needs root (it builds network namespaces)");
        return;
    }
    let bench = Bench::new();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));

    let cni_dir = cni_path();
    if cni_dir.is_none() {
        println!(
            "SKIPPED: CNI groups, no macvlan plugin in /usr/lib/cni (apt-get install \
             containernetworking-plugins, or set NETCLAIM_CNI_PATH)"
        );
    }
    let mut group = criterion.benchmark_group("attach");
    for (family, plan, dual_stack) in
        [("dual-stack", &bench.macvlan_plan, true), ("ipv4", &bench.macvlan_v4_plan, false)]
    {
        group.bench_function(format!("macvlan-{family}/podnet"), |b| {
            b.iter_custom(|iters| bench.time_attach(plan, iters));
        });
        group.bench_function(format!("macvlan-{family}/bare-rtnetlink"), |b| {
            b.iter_custom(|iters| bench.time_bare_macvlan(iters, dual_stack));
        });
        if let Some(cni_dir) = &cni_dir {
            group.bench_function(format!("macvlan-{family}/cni-macvlan+host-local"), |b| {
                b.iter_custom(|iters| bench.time_cni(cni_dir, iters, dual_stack));
            });
        }
    }
    group.bench_function("host-device/podnet", |b| {
        b.iter_custom(|iters| bench.time_attach(&bench.host_device_plan, iters));
    });
    group.finish();

    let mut group = criterion.benchmark_group("detach");
    group.bench_function("macvlan", |b| {
        b.iter_custom(|iters| bench.time_detach(&bench.macvlan_plan, iters));
    });
    group.bench_function("host-device", |b| {
        b.iter_custom(|iters| bench.time_detach(&bench.host_device_plan, iters));
    });
    group.finish();
    criterion.final_summary();

    let rounds =
        std::env::var("NETCLAIM_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(200);
    for (family, plan, dual_stack) in
        [("dual-stack", &bench.macvlan_plan, true), ("ipv4", &bench.macvlan_v4_plan, false)]
    {
        let result = bench.paired(plan, dual_stack, rounds);
        println!(
            "paired macvlan-{family} ({rounds} rounds): podnet median {:?}, bare rtnetlink median \
             {:?}, median ratio {:.3}",
            result.podnet, result.bare, result.ratio
        );
    }
}
