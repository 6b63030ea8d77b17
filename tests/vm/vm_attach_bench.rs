//! The attach bench of the VM (`make vmtest`, decision 0012, issue 14 item 6): on the VM's
//! kernel, in the same boot as the other suites, an ipvlan child of a veth parent and a VF of
//! the first emulated igb PF moved in as host-device, each made three ways in interleaved
//! rounds (the order rotating each round): `podnet` (plan applied with the host and pod
//! sockets, what the daemon's attach runs), the bare rtnetlink floor (the least a program
//! must send for the same interface: parent or device index known beforehand, pod socket,
//! create or move with name and MTU, one lookup, address, up, route), and the CNI plugin a
//! runtime would run (`ipvlan` or `host-device`, with `host-local`, from
//! `/usr/lib/cni`, spawned from a thread in the host netns as a runtime does). Only the
//! attach is timed; each detach runs untimed after it, and every variant must leave the pod
//! as it found it. IPv4, one address and one route per interface.
//!
//! QEMU TCG makes absolute times meaningless, so the figures printed are medians and the
//! medians of per-round ratios; nothing is asserted on them: the test fails only when a
//! variant fails to work. 10 rounds by default (CI runs this on both kernels: ~40 s each);
//! `NETCLAIM_VM_BENCH_ROUNDS` sets more (`vmtests/run.sh` passes it into the guest).

#![allow(clippy::unwrap_used, reason = "a failed step fails the bench")]

#[allow(dead_code, reason = "the macvlan floor and its CNI config are the host bench's")]
#[path = "../../benches/attach/baselines.rs"]
mod baselines;

use crate::kit;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::kit::netns::Netns;
use crate::kit::vm::{Vfs, require_vm};
use baselines::{POD_IF, link_index, run_cni};
use netclaim::host::netlink::{HostNetlink, NetlinkOps, open_in_netns};
use netclaim::model::network_config::{
    Addressing, DeviceKind, IpvlanFlag, IpvlanMode, ResolvedInterface, ResolvedMode,
    ResolvedNetworkConfig, Route, Sharing,
};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use netlink_packet_route::link::IpVlanMode;
use rtnetlink::{LinkIpVlan, LinkUnspec, RouteMessageBuilder};

/// Rounds under CI (both kernels); `NETCLAIM_VM_BENCH_ROUNDS` overrides.
const DEFAULT_ROUNDS: usize = 10;
/// Where Debian's `containernetworking-plugins` puts the plugins (scripts/setup/20-podnet.sh).
const CNI_DIR: &str = "/usr/lib/cni";

fn path(netns: &Netns) -> PathBuf {
    PathBuf::from(format!("/run/netns/{}", netns.name))
}

/// The host, pod and peer netns, the VF in the host netns, the two plans.
struct Bench {
    runtime: tokio::runtime::Runtime,
    host: HostNetlink,
    /// A socket in the pod netns, to check what each variant left there.
    pod: rtnetlink::Handle,
    host_ns: Netns,
    pod_ns: Netns,
    _peer_ns: Netns,
    parent: String,
    parent_index: u32,
    vf: String,
    vf_index: u32,
    vlans: VlanUsers,
    ipvlan_plan: AttachPlan,
    vf_plan: AttachPlan,
    data_dir: tempfile::TempDir,
}

fn config(mode: ResolvedMode) -> ResolvedNetworkConfig {
    ResolvedNetworkConfig {
        pod_network: None,
        mode,
        interface: ResolvedInterface { name: None, mtu: 1400, hardware_address: None },
        addressing: Addressing::Static(vec!["10.77.0.2/24".parse().expect("a literal CIDR")]),
        routes: vec![Route {
            destination: "10.88.0.0/16".parse().expect("a literal CIDR"),
            gateway: Some("10.77.0.1".parse().expect("a literal address")),
            metric: None,
        }],
        vlan: None,
        sriov: None,
        stats: false,
        routing: netclaim::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    }
}

fn plan(mode: ResolvedMode, device: &HostDevice, pod: &Path) -> AttachPlan {
    let pod = PodNetns { pod_uid: "bench".to_owned(), path: pod.to_owned() };
    plan_attach(&AttachRequest {
        claim_uid: "bench-claim",
        config: &config(mode),
        device,
        pod: &pod,
        interface_name: POD_IF,
        pool_addresses: &[],
    })
    .expect("a valid plan")
}

impl Bench {
    fn new(vfs: &Vfs) -> Self {
        let (host_ns, pod_ns, peer_ns) = (Netns::new(), Netns::new(), Netns::new());
        let (parent, peer) = (host_ns.ifname("p0"), host_ns.ifname("p1"));
        host_ns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
        host_ns.ip(&["link", "set", &peer, "netns", &peer_ns.name]);
        host_ns.ip(&["link", "set", &parent, "up"]);
        peer_ns.ip(&["addr", "add", "10.77.0.1/24", "dev", &peer]);
        peer_ns.ip(&["link", "set", &peer, "up"]);
        let vf = vfs.names[0].clone();
        kit::vm::ip(&["link", "set", &vf, "netns", &host_ns.name]);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let host = runtime.block_on(HostNetlink::in_netns(&path(&host_ns))).unwrap();
        let (pod, parent_index, vf_index) = runtime.block_on(async {
            let (pod, _pod_ns) = open_in_netns(&path(&pod_ns)).await.unwrap();
            let parent_index = link_index(host.handle(), &parent).await.unwrap();
            let vf_index = link_index(host.handle(), &vf).await.unwrap();
            (pod, parent_index, vf_index)
        });
        let device = |if_name: &str, kind, sharing| HostDevice {
            if_name: if_name.to_owned(),
            kind,
            sharing,
            mtu: 1500,
            mac: None,
        };
        let ipvlan = ResolvedMode::Ipvlan { mode: IpvlanMode::L2, flag: IpvlanFlag::Bridge };
        let ipvlan_plan =
            plan(ipvlan, &device(&parent, DeviceKind::Virtual, Sharing::Shared), &path(&pod_ns));
        let vf_plan = plan(
            ResolvedMode::HostDevice,
            &device(&vf, DeviceKind::SriovVf, Sharing::Exclusive),
            &path(&pod_ns),
        );
        Self {
            runtime,
            host,
            pod,
            host_ns,
            pod_ns,
            _peer_ns: peer_ns,
            parent,
            parent_index,
            vf,
            vf_index,
            vlans: VlanUsers::new(),
            ipvlan_plan,
            vf_plan,
            data_dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Fails the run when a variant left `net1` in the pod, or did not create it.
    fn expect_pod_interface(&self, present: bool, variant: &str) {
        let found = self.runtime.block_on(link_index(&self.pod, POD_IF)).is_some();
        assert_eq!(found, present, "{variant}: {POD_IF} in the pod netns, want present={present}");
    }

    /// `podnet` attach of `plan` (pod socket included), timed; the detach untimed.
    fn podnet(&self, plan: &AttachPlan, variant: &str) -> Duration {
        let attached = self.runtime.block_on(async {
            let started = Instant::now();
            let ops = NetlinkOps::open(&self.host, &path(&self.pod_ns)).await.unwrap();
            attach(&ops, &self.vlans, plan).await.expect("podnet attach");
            started.elapsed()
        });
        self.expect_pod_interface(true, variant);
        self.runtime.block_on(async {
            let ops = NetlinkOps::open_for_detach(&self.host, &path(&self.pod_ns)).await.unwrap();
            assert!(detach(&ops, &self.vlans, plan).await.is_clean(), "{variant}: detach");
        });
        self.expect_pod_interface(false, variant);
        attached
    }

    /// The address, up and route of the bare floor on link `index` of the pod.
    async fn bare_configure(pod: &rtnetlink::Handle, index: u32) {
        pod.address().add(index, Ipv4Addr::new(10, 77, 0, 2).into(), 24).execute().await.unwrap();
        pod.link().set(LinkUnspec::new_with_index(index).up().build()).execute().await.unwrap();
        pod.route()
            .add(
                RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(Ipv4Addr::new(10, 88, 0, 0), 16)
                    .gateway(Ipv4Addr::new(10, 77, 0, 1))
                    .output_interface(index)
                    .build(),
            )
            .execute()
            .await
            .unwrap();
    }

    /// The bare ipvlan floor, timed; the link deletion untimed.
    fn bare_ipvlan(&self) -> Duration {
        let (attached, index) = self.runtime.block_on(async {
            let started = Instant::now();
            let (pod, pod_fd) = open_in_netns(&path(&self.pod_ns)).await.unwrap();
            let link = LinkIpVlan::new(POD_IF, self.parent_index, IpVlanMode::L2)
                .mtu(1400)
                .setns_by_fd(pod_fd.as_raw_fd())
                .build();
            self.host.handle().link().add(link).execute().await.expect("ipvlan create");
            let index = link_index(&pod, POD_IF).await.expect("the link just created");
            Self::bare_configure(&pod, index).await;
            (started.elapsed(), index)
        });
        self.expect_pod_interface(true, "bare ipvlan");
        self.runtime.block_on(self.pod.link().del(index).execute()).unwrap();
        self.expect_pod_interface(false, "bare ipvlan");
        attached
    }

    /// The bare host-device floor for the VF (move with name and MTU, address, up, route),
    /// timed; the move back (down, host name, MTU) untimed.
    fn bare_vf(&self) -> Duration {
        let (attached, index) = self.runtime.block_on(async {
            let started = Instant::now();
            let (pod, pod_fd) = open_in_netns(&path(&self.pod_ns)).await.unwrap();
            let moved = LinkUnspec::new_with_index(self.vf_index)
                .name(POD_IF.to_owned())
                .mtu(1400)
                .setns_by_fd(pod_fd.as_raw_fd())
                .build();
            self.host.handle().link().set(moved).execute().await.expect("VF move");
            let index = link_index(&pod, POD_IF).await.expect("the link just moved");
            Self::bare_configure(&pod, index).await;
            (started.elapsed(), index)
        });
        self.expect_pod_interface(true, "bare VF");
        self.runtime.block_on(async {
            let host_ns = std::fs::File::open(path(&self.host_ns)).unwrap();
            let back = LinkUnspec::new_with_index(index)
                .down()
                .name(self.vf.clone())
                .mtu(1500)
                .setns_by_fd(host_ns.as_raw_fd())
                .build();
            self.pod.link().set(back).execute().await.expect("VF move back");
        });
        self.expect_pod_interface(false, "bare VF");
        self.vf_is_home("bare VF");
        attached
    }

    /// The VF is back in the host netns under its name, with its index (later moves by
    /// index need it unchanged).
    fn vf_is_home(&self, variant: &str) {
        let index = self.runtime.block_on(link_index(self.host.handle(), &self.vf));
        assert_eq!(index, Some(self.vf_index), "{variant}: the VF is back as {}", self.vf);
    }

    /// The CNI plugin `plugin` with `host-local` (ADD timed, DEL untimed).
    fn cni(&self, plugin: &str, fields: &serde_json::Value) -> Duration {
        let mut config = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "vmbench",
            "type": plugin,
            "ipam": {
                "type": "host-local",
                "dataDir": self.data_dir.path(),
                "ranges": [[{"subnet": "10.77.0.0/24", "rangeStart": "10.77.0.2",
                    "rangeEnd": "10.77.0.2"}]],
                "routes": [{"dst": "10.88.0.0/16", "gw": "10.77.0.1"}],
            },
        });
        for (key, value) in fields.as_object().unwrap() {
            config[key] = value.clone();
        }
        let config = config.to_string();
        let (host, pod, cni_dir) = (path(&self.host_ns), path(&self.pod_ns), Path::new(CNI_DIR));
        let added = run_cni(&host, cni_dir, plugin, "ADD", &pod, &config);
        self.expect_pod_interface(true, plugin);
        run_cni(&host, cni_dir, plugin, "DEL", &pod, &config);
        self.expect_pod_interface(false, plugin);
        added
    }

    fn cni_ipvlan(&self) -> Duration {
        let fields = serde_json::json!({"master": self.parent, "mode": "l2", "mtu": 1400});
        self.cni("ipvlan", &fields)
    }

    fn cni_vf(&self) -> Duration {
        let added = self.cni("host-device", &serde_json::json!({"device": self.vf}));
        self.vf_is_home("cni host-device");
        added
    }
}

/// Samples per variant, one per round (index = round).
#[derive(Default)]
struct Samples {
    podnet: Vec<Duration>,
    bare: Vec<Duration>,
    cni: Vec<Duration>,
}

impl Samples {
    fn report(&self, label: &str) {
        kit::vm::report(&format!(
            "vm-bench {label}: {} rounds; medians podnet {:?}, bare rtnetlink {:?}, cni {:?}; \
             per-round ratio medians podnet/bare {:.2}, cni/podnet {:.1}, cni/bare {:.1}",
            self.podnet.len(),
            median(&self.podnet),
            median(&self.bare),
            median(&self.cni),
            ratio_median(&self.podnet, &self.bare),
            ratio_median(&self.cni, &self.podnet),
            ratio_median(&self.cni, &self.bare),
        ));
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

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn ipvlan_and_vf_attach_against_the_bare_rtnetlink_floor_and_the_cni_plugins() {
    require_vm("ipvlan_and_vf_attach_against_the_bare_rtnetlink_floor_and_the_cni_plugins");
    for plugin in ["ipvlan", "host-device", "host-local"] {
        assert!(
            Path::new(CNI_DIR).join(plugin).exists(),
            "no {plugin} CNI plugin in {CNI_DIR} (scripts/setup/20-podnet.sh installs them)"
        );
    }
    let rounds = std::env::var("NETCLAIM_VM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let vfs = Vfs::create(1);
    let bench = Bench::new(&vfs);
    let (mut ipvlan, mut vf) = (Samples::default(), Samples::default());
    let started = Instant::now();
    for round in 0..rounds {
        for turn in 0..6 {
            match (round + turn) % 6 {
                0 => ipvlan.podnet.push(bench.podnet(&bench.ipvlan_plan, "podnet ipvlan")),
                1 => ipvlan.bare.push(bench.bare_ipvlan()),
                2 => ipvlan.cni.push(bench.cni_ipvlan()),
                3 => {
                    vf.podnet.push(bench.podnet(&bench.vf_plan, "podnet VF"));
                    bench.vf_is_home("podnet VF");
                }
                4 => vf.bare.push(bench.bare_vf()),
                _ => vf.cni.push(bench.cni_vf()),
            }
        }
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    kit::vm::report(&format!(
        "vm-bench: kernel {}, {:?} for {rounds} rounds",
        kernel.trim(),
        started.elapsed()
    ));
    ipvlan.report("ipvlan l2");
    vf.report("VF host-device");
    drop(bench);
    drop(vfs);
}
