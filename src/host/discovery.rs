//! Host interface discovery: a netlink dump of links, addresses and default routes, joined
//! with sysfs facts into [`HostInterface`]s.
//!
//! The netlink socket is bound to the network namespace of the thread that creates it, so
//! discovery describes the namespace of the calling thread (the host, for the daemon).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoKind, LinkAttribute, LinkExtentMask, LinkFlags, LinkInfo, LinkMessage, State,
};
use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::RouteMessageBuilder;

use super::netlink_dump::{DumpError, DumpSocket};
use super::sysfs::{Sysfs, SysfsError};
use crate::inventory::Selection;
use crate::inventory::device_lookup::DiscoveredDevices;
use crate::inventory::publish::InterfaceSource;
use crate::model::device::{Controller, HostInterface, LinkKind, MacAddress, OperState};

/// `RT_TABLE_MAIN`: default routes elsewhere (policy routing tables) do not make an
/// interface the node's uplink.
const MAIN_TABLE: u32 = 254;

/// A discovery step that failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Opening the netlink socket failed.
    #[error("opening a netlink route socket: {0}")]
    Socket(#[source] std::io::Error),
    /// A netlink dump failed.
    #[error("netlink dump of {what} failed: {source}")]
    Dump {
        /// `links`, `addresses` or `routes`.
        what: &'static str,
        /// The netlink error (the kernel's errno, or what could not be read).
        #[source]
        source: DumpError,
    },
    /// Reading sysfs failed.
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    /// The blocking task reading sysfs did not finish (panicked or cancelled).
    #[error("reading sysfs: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// [`InterfaceSource`] over this host's netlink and sysfs (a fresh dump per call).
#[derive(Debug, Clone)]
pub struct HostInterfaces {
    sysfs: Sysfs,
}

impl HostInterfaces {
    /// Discovery reading PCI facts under `sysfs`.
    #[must_use]
    pub fn new(sysfs: Sysfs) -> Self {
        Self { sysfs }
    }
}

/// The claim service's device lookup over this host's interfaces.
pub type HostDevices = DiscoveredDevices<HostInterfaces>;

/// The device lookup over this host's interfaces, with PCI facts under `sysfs_root` and the
/// operator's `selection`.
#[must_use]
pub fn host_devices(sysfs_root: PathBuf, selection: Selection) -> HostDevices {
    DiscoveredDevices::with_source(HostInterfaces::new(Sysfs::new(sysfs_root)), selection)
}

impl InterfaceSource for HostInterfaces {
    type Error = DiscoveryError;

    async fn discover(&self) -> Result<Vec<HostInterface>, DiscoveryError> {
        discover(&self.sysfs).await
    }
}

/// Discovers the interfaces of the calling thread's network namespace.
///
/// Must run inside a tokio runtime (the socket is registered with it). Each dump is read a
/// datagram at a time and reduced as it arrives ([`DumpSocket`]): with a veth per pod on the
/// host, a dump decoded whole was the largest part of the daemon's peak heap (issue 36).
///
/// # Errors
/// [`DiscoveryError`] naming the step that failed.
pub async fn discover(sysfs: &Sysfs) -> Result<Vec<HostInterface>, DiscoveryError> {
    // One host discovery at a time in the process (the inventory and device health each run
    // one on host link events): concurrent dumps would add their peaks.
    let _one_dump = HOST_DUMPS.lock().await;
    let mut socket = DumpSocket::new().map_err(DiscoveryError::Socket)?;
    // Without the link's and IPv6's statistics (RTEXT_FILTER_SKIP_STATS; a kernel without the
    // flag ignores the bit), which discovery does not read: most of each message's decoding.
    let mut links = LinkMessage::default();
    links.header.interface_family = AddressFamily::Unspec;
    links.attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    let mut pods_veths = HashSet::new();
    let parsed: Vec<(HostInterface, Option<u32>)> = socket
        .dump(RouteNetlinkMessage::GetLink(links), |message| match message {
            RouteNetlinkMessage::NewLink(link) => {
                let parsed = parsed_link(&link)?;
                if peer_in_other_netns(&link, &parsed.0) {
                    pods_veths.insert(parsed.0.index);
                }
                Some(parsed)
            }
            _ => None,
        })
        .await
        .map_err(|source| DiscoveryError::Dump { what: "links", source })?;
    // Only what the join reads is kept: universe-scope addresses, main-table default routes.
    let addresses: Vec<AddressMessage> = socket
        .dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()), |message| match message {
            RouteNetlinkMessage::NewAddress(address)
                if address.header.scope == AddressScope::Universe =>
            {
                Some(address)
            }
            _ => None,
        })
        .await
        .map_err(|source| DiscoveryError::Dump { what: "addresses", source })?;
    let mut routes = Vec::new();
    for request in [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ] {
        let defaults = socket
            .dump(RouteNetlinkMessage::GetRoute(request), |message| match message {
                RouteNetlinkMessage::NewRoute(route)
                    if route.header.destination_prefix_length == 0 && is_main_unicast(&route) =>
                {
                    Some(route)
                }
                _ => None,
            })
            .await
            .map_err(|source| DiscoveryError::Dump { what: "routes", source })?;
        routes.extend(defaults);
    }
    drop(socket);

    let interfaces = interfaces_from_parsed(parsed, &addresses, &routes);
    // Sysfs reads block (a link's `speed` waits for the RTNL lock, which a burst of sandbox
    // set-ups holds often): on a blocking thread, so the runtime's workers go on attaching.
    let sysfs = sysfs.clone();
    tokio::task::spawn_blocking(move || with_sysfs_facts(&sysfs, interfaces, &pods_veths))
        .await
        .map_err(DiscoveryError::Task)?
}

/// `interfaces` with their sysfs facts, without those gone since the dump. A pod's veth
/// (`pods_veths`) is kept without reading sysfs: a veth has no bus device, and reading its
/// `speed` takes the RTNL lock, once per pod on a node running hundreds (issue 36).
fn with_sysfs_facts(
    sysfs: &Sysfs,
    mut interfaces: Vec<HostInterface>,
    pods_veths: &HashSet<u32>,
) -> Result<Vec<HostInterface>, DiscoveryError> {
    let mut present = Vec::with_capacity(interfaces.len());
    for mut interface in interfaces.drain(..) {
        if pods_veths.contains(&interface.index) {
            present.push(interface);
        } else if let Some(hardware) = sysfs.hardware(&interface.name)? {
            interface.hardware = hardware;
            present.push(interface);
        } else {
            // Gone since the dump: the link event that removed it triggers a new inventory.
            tracing::debug!(interface = %interface.name, "no sysfs entry; skipped");
        }
    }
    // RDMA facts are optional: annotate logs what it cannot read and never fails discovery.
    super::rdma::annotate(sysfs.root(), &mut present);
    Ok(present)
}

/// A veth whose peer lives in another network namespace (`IFLA_LINK_NETNSID`, which the
/// kernel adds only then): a pod's or container's link, never one of the node's NICs.
fn peer_in_other_netns(link: &LinkMessage, interface: &HostInterface) -> bool {
    interface.kind == Some(LinkKind::Veth)
        && link.attributes.iter().any(|a| matches!(a, LinkAttribute::LinkNetNsId(_)))
}

/// Serialises host discoveries (see [`discover`]).
static HOST_DUMPS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One link's interface and its controller's index; `None` for a message without a name.
fn parsed_link(link: &LinkMessage) -> Option<(HostInterface, Option<u32>)> {
    let controller = link.attributes.iter().find_map(|attribute| match attribute {
        LinkAttribute::Controller(index) => Some(*index),
        _ => None,
    });
    interface_from_link(link).map(|interface| (interface, controller))
}

/// Joins the three netlink dumps into interfaces (sysfs facts not filled in yet).
#[must_use]
pub fn interfaces_from_messages(
    links: &[LinkMessage],
    addresses: &[AddressMessage],
    routes: &[RouteMessage],
) -> Vec<HostInterface> {
    interfaces_from_parsed(links.iter().filter_map(parsed_link).collect(), addresses, routes)
}

/// [`interfaces_from_messages`] over links already reduced by [`parsed_link`].
fn interfaces_from_parsed(
    parsed: Vec<(HostInterface, Option<u32>)>,
    addresses: &[AddressMessage],
    routes: &[RouteMessage],
) -> Vec<HostInterface> {
    let default_route_indexes = default_route_interfaces(routes);
    let mut global_addresses: HashMap<u32, Vec<String>> = HashMap::new();
    for message in addresses {
        if message.header.scope != AddressScope::Universe {
            continue;
        }
        let address = message.attributes.iter().find_map(|attribute| match attribute {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = address.or_else(|| {
            message.attributes.iter().find_map(|attribute| match attribute {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            })
        });
        if let Some(address) = address.filter(is_node_address) {
            global_addresses
                .entry(message.header.index)
                .or_default()
                .push(format!("{address}/{}", message.header.prefix_len));
        }
    }

    let by_index: HashMap<u32, (String, Option<LinkKind>)> = parsed
        .iter()
        .map(|(interface, _)| (interface.index, (interface.name.clone(), interface.kind.clone())))
        .collect();
    let mut interfaces = Vec::with_capacity(parsed.len());
    for (mut interface, controller) in parsed {
        interface.has_default_route = default_route_indexes.contains(&interface.index);
        interface.global_addresses = global_addresses.remove(&interface.index).unwrap_or_default();
        interface.controller = controller.map(|index| match by_index.get(&index) {
            Some((name, kind)) => Controller { name: name.clone(), kind: kind.clone() },
            None => Controller { name: format!("ifindex {index}"), kind: None },
        });
        interfaces.push(interface);
    }
    interfaces
}

/// Addresses that make an interface "the node's": global scope, excluding the IPv6
/// link-local range some kernels report with universe scope on odd configurations.
fn is_node_address(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
        IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
    }
}

/// One interface from an `RTM_NEWLINK` message; `None` for a message without a name.
#[must_use]
pub fn interface_from_link(link: &LinkMessage) -> Option<HostInterface> {
    let name = link.attributes.iter().find_map(|attribute| match attribute {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })?;
    let mut interface = HostInterface::new(link.header.index, &name, 0);
    interface.loopback = link.header.flags.contains(LinkFlags::Loopback);
    interface.admin_up = Some(link.header.flags.contains(LinkFlags::Up));
    interface.lower_up = Some(link.header.flags.contains(LinkFlags::LowerUp));
    for attribute in &link.attributes {
        match attribute {
            LinkAttribute::Address(bytes) if bytes.iter().any(|b| *b != 0) => {
                interface.mac = Some(MacAddress(bytes.clone()));
            }
            LinkAttribute::Mtu(mtu) => interface.mtu = *mtu,
            LinkAttribute::MinMtu(mtu) => interface.min_mtu = Some(*mtu),
            LinkAttribute::MaxMtu(mtu) => interface.max_mtu = Some(*mtu),
            LinkAttribute::Carrier(carrier) => interface.carrier = Some(*carrier != 0),
            LinkAttribute::OperState(state) => interface.oper_state = oper_state(*state),
            LinkAttribute::LinkInfo(infos) => {
                interface.kind = infos.iter().find_map(|info| match info {
                    LinkInfo::Kind(kind) => Some(link_kind(kind)),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    Some(interface)
}

fn link_kind(kind: &InfoKind) -> LinkKind {
    LinkKind::from_kernel(&kind.to_string())
}

fn oper_state(state: State) -> OperState {
    match state {
        State::NotPresent => OperState::NotPresent,
        State::Down => OperState::Down,
        State::LowerLayerDown => OperState::LowerLayerDown,
        State::Testing => OperState::Testing,
        State::Dormant => OperState::Dormant,
        State::Up => OperState::Up,
        _ => OperState::Unknown,
    }
}

/// Whether `route` is a unicast route of the main table. The table id is in `RTA_TABLE`
/// (ids above 255 do not fit the header's byte), else in the header.
pub(super) fn is_main_unicast(route: &RouteMessage) -> bool {
    let table = route
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            RouteAttribute::Table(table) => Some(*table),
            _ => None,
        })
        .unwrap_or(u32::from(route.header.table));
    table == MAIN_TABLE && route.header.kind == RouteType::Unicast
}

/// Interfaces that carry a unicast default route of the main table (IPv4 or IPv6), directly
/// or as one next hop of a multipath route.
fn default_route_interfaces(routes: &[RouteMessage]) -> HashSet<u32> {
    let mut indexes = HashSet::new();
    for route in routes {
        if route.header.destination_prefix_length != 0 || !is_main_unicast(route) {
            continue;
        }
        for attribute in &route.attributes {
            match attribute {
                RouteAttribute::Oif(index) => {
                    indexes.insert(*index);
                }
                RouteAttribute::MultiPath(hops) => {
                    indexes.extend(hops.iter().map(|hop| hop.interface_index));
                }
                _ => {}
            }
        }
    }
    indexes
}
