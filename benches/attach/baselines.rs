//! The sequences the whole path is compared with: the bare rtnetlink floors (the least a
//! program must send to the kernel for the same interface: one request at a time, each
//! awaiting its ack, or pipelined, the requests after the create in one datagram and their
//! acks read after) and CNI macvlan + host-local run as a runtime runs it.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use netclaim::host::netlink::open_in_netns;
use netclaim::host::netlink_batch::{BatchSocket, open_batched_in_netns};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::link::MacVlanMode;
use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage};
use rtnetlink::{AddressMessageBuilder, LinkMacVlan, LinkUnspec, RouteMessageBuilder};

/// The pod-side name every sequence gives the interface.
pub(crate) const POD_IF: &str = "net1";

/// The bare floor of a macvlan attach: the parent's index known beforehand (looked up once,
/// outside the timing), then pod socket, create in the pod netns with name and MTU, one
/// lookup for the new link's index (and MAC), the addresses (`IFA_F_NODAD` for IPv6), up,
/// one route per family. Returns the pod socket and the link's index.
pub(crate) async fn bare_macvlan(
    host: &rtnetlink::Handle,
    pod_path: &Path,
    parent_index: u32,
    dual_stack: bool,
) -> (rtnetlink::Handle, u32) {
    let (pod, pod_ns) = open_in_netns(pod_path).await.expect("pod netns socket");
    host.link()
        .add(
            LinkMacVlan::new(POD_IF, parent_index, MacVlanMode::Bridge)
                .mtu(1400)
                .setns_by_fd(pod_ns.as_raw_fd())
                .build(),
        )
        .execute()
        .await
        .expect("macvlan create");
    let index = link_index(&pod, POD_IF).await.expect("the link just created");
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
    (pod, index)
}

/// A request to create or set (`NLM_F_EXCL | NLM_F_CREATE`, as rtnetlink's single requests).
fn create(message: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut request = NetlinkMessage::from(message);
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
    request
}

/// The pipelined floor of the same attach: the pod's sockets opened on one thread (rtnetlink's,
/// unused, as the attach path opens it, and a batch socket), create as in [`bare_macvlan`], the
/// lookup on the batch socket (its answer read at once), then the addresses, up and the routes
/// sent back to back in one datagram, their acks read after.
/// Returns the pod's batch socket and the link's index.
pub(crate) async fn bare_macvlan_pipelined(
    host: &rtnetlink::Handle,
    pod_path: &Path,
    parent_index: u32,
    dual_stack: bool,
) -> (BatchSocket, u32) {
    let (_pod, batch, pod_ns) = open_batched_in_netns(pod_path).await.expect("pod netns sockets");
    host.link()
        .add(
            LinkMacVlan::new(POD_IF, parent_index, MacVlanMode::Bridge)
                .mtu(1400)
                .setns_by_fd(pod_ns.as_raw_fd())
                .build(),
        )
        .execute()
        .await
        .expect("macvlan create");
    let index = batch
        .link(POD_IF)
        .await
        .expect("looking the link up")
        .expect("the link just created")
        .header
        .index;
    let mut messages = vec![create(RouteNetlinkMessage::NewAddress(
        AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(Ipv4Addr::new(10, 77, 0, 2), 24)
            .build(),
    ))];
    if dual_stack {
        let mut v6 = AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address("fd00:77::2".parse().expect("literal"), 64)
            .build();
        v6.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
        messages.push(create(RouteNetlinkMessage::NewAddress(v6)));
    }
    messages
        .push(create(RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).up().build())));
    messages.push(create(RouteNetlinkMessage::NewRoute(
        RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::new(10, 88, 0, 0), 16)
            .gateway(Ipv4Addr::new(10, 77, 0, 1))
            .output_interface(index)
            .priority(50)
            .build(),
    )));
    if dual_stack {
        messages.push(create(RouteNetlinkMessage::NewRoute(
            RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix("fd00:88::".parse().expect("literal"), 64)
                .gateway("fd00:77::1".parse().expect("literal"))
                .output_interface(index)
                .build(),
        )));
    }
    let acks = batch.send(messages).await;
    assert!(acks.iter().all(Result::is_ok), "pipelined requests refused: {acks:?}");
    (batch, index)
}

/// The bare floor of a detach: pod socket, delete the link (the kernel removes its
/// addresses and routes with it).
pub(crate) async fn bare_delete(pod_path: &Path, index: u32) {
    let (pod, _pod_ns) = open_in_netns(pod_path).await.expect("pod netns socket");
    pod.link().del(index).execute().await.expect("link delete");
}

/// Index of link `name` in the netns of `handle`, `None` when there is none.
pub(crate) async fn link_index(handle: &rtnetlink::Handle, name: &str) -> Option<u32> {
    match handle.link().get().match_name(name.to_owned()).execute().try_next().await {
        Ok(link) => link.map(|link| link.header.index),
        Err(rtnetlink::Error::NetlinkError(err))
            if err.raw_code() == -(nix::errno::Errno::ENODEV as i32) =>
        {
            None
        }
        Err(err) => panic!("looking up {name}: {err}"),
    }
}

/// Where Debian's `containernetworking-plugins` puts the plugins (override: `NETCLAIM_CNI_PATH`).
pub(crate) fn cni_path() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("NETCLAIM_CNI_PATH")
        .map_or_else(|| std::path::PathBuf::from("/usr/lib/cni"), std::path::PathBuf::from);
    (dir.join("macvlan").exists() && dir.join("host-local").exists()).then_some(dir)
}

/// The CNI config doing the same work as the other sequences: macvlan bridge, MTU 1400, an
/// IPv4 (and IPv6) address from `host-local`, one route per family.
pub(crate) fn cni_config(parent: &str, data_dir: &Path, dual_stack: bool) -> String {
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

/// Runs the CNI plugin `plugin` (here `macvlan`; the VM bench's `ipvlan`, `host-device`) as a
/// runtime would (`CNI_*` environment, config on stdin), from a thread that entered the host
/// netns: the child inherits that netns, like a runtime's plugin runs in the node's. Returns
/// how long `command` took.
pub(crate) fn run_cni(
    host_ns: &Path,
    cni_dir: &Path,
    plugin: &str,
    command: &str,
    pod_ns: &Path,
    config: &str,
) -> Duration {
    let (host_ns, cni_dir, pod_ns) = (host_ns.to_owned(), cni_dir.to_owned(), pod_ns.to_owned());
    let (plugin, command, config) = (plugin.to_owned(), command.to_owned(), config.to_owned());
    std::thread::spawn(move || {
        let netns = std::fs::File::open(&host_ns).expect("host netns");
        #[allow(
            clippy::disallowed_methods,
            reason = "the CNI baseline runs the plugin from a throwaway thread in the node netns"
        )]
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("entering host netns");
        let start = Instant::now();
        let mut child = Command::new(cni_dir.join(&plugin))
            .env("CNI_COMMAND", &command)
            .env("CNI_CONTAINERID", "bench")
            .env("CNI_NETNS", &pod_ns)
            .env("CNI_IFNAME", POD_IF)
            .env("CNI_PATH", &cni_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning the CNI plugin");
        std::io::Write::write_all(&mut child.stdin.take().expect("piped stdin"), config.as_bytes())
            .expect("writing the CNI config");
        let output = child.wait_with_output().expect("waiting for the CNI plugin");
        let elapsed = start.elapsed();
        assert!(
            output.status.success(),
            "CNI {plugin} {command} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        elapsed
    })
    .join()
    .expect("the CNI thread")
}
