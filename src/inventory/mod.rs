//! Which host interfaces become which DRA devices: selection, exclusion rules and attributes.
//!
//! Pure: takes the interfaces discovery found, the operator's selection and the PodNetworks
//! this node carries ([`networks`]), returns the devices to publish and, for every interface
//! left out, the reason (so `netclaim inventory` can answer "why is my NIC not there?").

pub mod bandwidth;
pub mod device_lookup;
pub mod facts;
pub mod naming;
pub mod networks;
pub mod publish;
mod rdma;
pub mod slices;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::model::bandwidth::BitsPerSecond;
use crate::model::device::{
    AttributeValue, Device, DeviceKind, HostInterface, LinkKind, Sharing, SriovRole,
};
use crate::model::names::{self, ATTRIBUTE_DOMAIN, ATTRIBUTE_PCIE_ROOT, attr};
use crate::model::pod_network::shared_device_name;
use networks::{NetworkConflict, NetworkPlan, NodeNetworks, SharedNetwork};

/// DRA string attributes are limited to 64 characters; longer values are omitted.
const MAX_STRING_ATTRIBUTE_LEN: usize = 64;

/// Kernel drivers that hand a device to userspace (DPDK, VMs): such a device has no usable
/// netdev for us and belongs to another consumer.
const USERSPACE_DRIVERS: &[&str] = &["vfio-pci", "vfio", "uio_pci_generic", "igb_uio"];

/// How shared parents are published (`--sharing-mode`, after `auto` was resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharingMode {
    /// One device with `allowMultipleAllocations` and consumable capacity (KEP-5075).
    Capacity,
    /// N exclusive slot devices per parent, for clusters without consumable capacity.
    Slots,
}

/// An invalid interface pattern.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// A glob in `--include-interfaces`/`--exclude-interfaces` does not parse.
    #[error("invalid interface pattern {pattern:?} in {flag}: {source}")]
    Pattern {
        /// The flag the pattern came from.
        flag: &'static str,
        /// The pattern text.
        pattern: String,
        /// The parser's complaint.
        #[source]
        source: glob::PatternError,
    },
}

/// The operator's device selection (the flags shared by `netclaim node` and `inventory`).
#[derive(Debug, Clone)]
pub struct Selection {
    include: Vec<glob::Pattern>,
    exclude: Vec<glob::Pattern>,
    shared_parents: Vec<String>,
    sharing_mode: SharingMode,
    shared_capacity: u32,
    slot_count: u32,
    parent_bandwidth: Vec<bandwidth::ParentBandwidth>,
}

impl Selection {
    /// Builds a selection from the flag values.
    ///
    /// `include` empty means every non-virtual interface; a non-empty `include` limits
    /// publication to matching interfaces and also admits virtual ones (veth, vxlan, ...)
    /// that match, which are otherwise left to the node's primary network.
    pub fn new(
        include: &[String],
        exclude: &[String],
        shared_parents: &[String],
        sharing_mode: SharingMode,
    ) -> Result<Self, InventoryError> {
        let compile = |flag: &'static str, patterns: &[String]| {
            patterns
                .iter()
                .map(|pattern| {
                    glob::Pattern::new(pattern).map_err(|source| InventoryError::Pattern {
                        flag,
                        pattern: pattern.clone(),
                        source,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            include: compile("--include-interfaces", include)?,
            exclude: compile("--exclude-interfaces", exclude)?,
            shared_parents: shared_parents.to_vec(),
            sharing_mode,
            shared_capacity: names::DEFAULT_SHARED_CAPACITY,
            slot_count: names::DEFAULT_SLOT_COUNT,
            parent_bandwidth: Vec::new(),
        })
    }

    /// Same selection with `--parent-bandwidth` entries (a later entry for one interface
    /// wins).
    #[must_use]
    pub fn with_parent_bandwidth(mut self, entries: &[bandwidth::ParentBandwidth]) -> Self {
        self.parent_bandwidth = entries.to_vec();
        self
    }

    /// The `--parent-bandwidth` of `interface` (by name or PCI address), if given.
    fn parent_bandwidth_flag(&self, interface: &HostInterface) -> Option<BitsPerSecond> {
        self.parent_bandwidth
            .iter()
            .rev()
            .find(|entry| names_interface(&entry.interface, interface))
            .map(|entry| entry.rate)
    }

    /// The sharing mode.
    #[must_use]
    pub fn sharing_mode(&self) -> SharingMode {
        self.sharing_mode
    }

    /// Same selection with another sharing mode (the publisher's fallback to slots).
    #[must_use]
    pub fn with_sharing_mode(mut self, mode: SharingMode) -> Self {
        self.sharing_mode = mode;
        self
    }

    /// Sub-interfaces a shared device offers in slots mode at most (`capacity` above this is
    /// published as this many slot devices).
    #[must_use]
    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    fn is_shared_parent(&self, interface: &HostInterface) -> bool {
        self.shared_parents.iter().any(|wanted| names_interface(wanted, interface))
    }
}

/// Why an interface is not published (or not as the operator asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusion {
    /// The loopback interface.
    Loopback,
    /// No `--include-interfaces` pattern matches.
    NotIncluded,
    /// An `--exclude-interfaces` pattern matches.
    ExcludedByPattern(String),
    /// Enslaved to a bond, bridge, team or OVS: the controller owns its traffic, and the
    /// kernel refuses a macvlan on it (its rx handler is taken).
    Enslaved {
        /// The controller.
        controller: String,
        /// Its kind.
        kind: String,
    },
    /// A bond or bridge: the kernel refuses to move it into another netns
    /// (`NETIF_F_NETNS_LOCAL`), so it can only be a shared parent.
    OnlySharedParent(LinkKind),
    /// A software interface not named by `--include-interfaces` (usually the primary
    /// network's: veth, vxlan, tunnels).
    Virtual(LinkKind),
    /// Bound to a userspace I/O driver.
    UserspaceDriver(String),
    /// Carries a default route of the node.
    DefaultRoute,
    /// Carries a global address of the node.
    GlobalAddress(String),
    /// Listed in `--shared-parents` but not present on the node.
    SharedParentNotFound,
    /// A parent of a shared-mode PodNetwork that selects this node but is not served now
    /// (disabled, not ready, being deleted): kept off the exclusive devices, since the
    /// network's pods may still have children on it.
    PodNetworkNotServed(String),
    /// Named in `spec.parents` of a PodNetwork served here, but not present on the node.
    PodNetworkParentNotFound(String),
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Loopback => f.write_str("loopback"),
            Self::NotIncluded => f.write_str("not matched by --include-interfaces"),
            Self::ExcludedByPattern(pattern) => {
                write!(f, "matched by --exclude-interfaces pattern {pattern:?}")
            }
            Self::Enslaved { controller, kind } => {
                write!(f, "port of {kind} {controller}")
            }
            Self::OnlySharedParent(kind) => {
                write!(f, "{kind} cannot move to a pod; list it in --shared-parents")
            }
            Self::Virtual(kind) => {
                write!(f, "virtual ({kind}); name it in --include-interfaces to publish it")
            }
            Self::UserspaceDriver(driver) => write!(f, "bound to userspace driver {driver}"),
            Self::DefaultRoute => f.write_str("carries the node's default route"),
            Self::GlobalAddress(address) => write!(f, "carries node address {address}"),
            Self::SharedParentNotFound => f.write_str("listed in --shared-parents but not found"),
            Self::PodNetworkNotServed(network) => {
                write!(f, "parent of PodNetwork {network}, which is not served on this node now")
            }
            Self::PodNetworkParentNotFound(network) => {
                write!(f, "parent of PodNetwork {network} but not found")
            }
        }
    }
}

/// An interface left out, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Interface name (or the `--shared-parents` entry that matched nothing).
    pub if_name: String,
    /// Why.
    pub reason: Exclusion,
}

/// What this node publishes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Devices, sorted by name, names unique.
    pub devices: Vec<Device>,
    /// Interfaces left out, sorted by name.
    pub skipped: Vec<Skipped>,
    /// PodNetworks that could not be published together on one interface, sorted.
    pub conflicts: Vec<NetworkConflict>,
}

impl Inventory {
    /// Applies the selection and exclusion rules of DESIGN §2 to the discovered interfaces,
    /// without PodNetworks.
    #[must_use]
    pub fn build(interfaces: &[HostInterface], selection: &Selection) -> Self {
        Self::build_with(interfaces, selection, &NodeNetworks::default())
    }

    /// [`Self::build`] with the PodNetworks of this node (DESIGN §2, §4): a parent of a served
    /// shared-mode network becomes one shared device per network (`<podnetwork>-<parent>`,
    /// never also a plain `--shared-parents` device), a device of a served exclusive-mode
    /// network gets the `podNetwork` attribute, and a parent of a shared-mode network that
    /// is not served now is published as nothing (unless listed in `--shared-parents`).
    #[must_use]
    pub fn build_with(
        interfaces: &[HostInterface],
        selection: &Selection,
        networks: &NodeNetworks,
    ) -> Self {
        let plan = NetworkPlan::resolve(networks, interfaces);
        let mut inventory = Self::default();
        let mut sorted: Vec<&HostInterface> = interfaces.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));

        for interface in sorted {
            let outcome = if let Some(uses) = plan.shared.get(&interface.name) {
                shared_parent_exclusion(interface)
                    .map_or_else(|| Ok(network_devices(interface, selection, uses)), Err)
            } else if selection.is_shared_parent(interface) {
                shared_parent_exclusion(interface)
                    .map_or_else(|| Ok(shared_devices(interface, selection)), Err)
            } else if let Some(network) = plan.reserved.get(&interface.name) {
                Err(Exclusion::PodNetworkNotServed(network.clone()))
            } else {
                exclusive_exclusion(interface, selection).map_or_else(
                    || {
                        let mut device = exclusive_device(interface);
                        if let Some(network) = plan.exclusive.get(&interface.name) {
                            put_string(&mut device.attributes, attr::POD_NETWORK, network);
                        }
                        Ok(vec![device])
                    },
                    Err,
                )
            };
            match outcome {
                Ok(devices) => inventory.devices.extend(devices),
                Err(reason) => {
                    inventory.skipped.push(Skipped { if_name: interface.name.clone(), reason });
                }
            }
        }
        for wanted in &selection.shared_parents {
            let found = interfaces.iter().any(|interface| {
                selection.is_shared_parent(interface)
                    && (interface.name == *wanted
                        || interface.hardware.pci.as_ref().is_some_and(|pci| {
                            pci.address.to_string() == wanted.to_ascii_lowercase()
                        }))
            });
            if !found {
                inventory.skipped.push(Skipped {
                    if_name: wanted.clone(),
                    reason: Exclusion::SharedParentNotFound,
                });
            }
        }
        for missing in &plan.missing {
            inventory.skipped.push(Skipped {
                if_name: missing.parent.clone(),
                reason: Exclusion::PodNetworkParentNotFound(missing.network.clone()),
            });
        }
        make_names_unique(&mut inventory.devices);
        inventory.devices.sort_by(|a, b| a.name.cmp(&b.name));
        inventory.skipped.sort_by(|a, b| a.if_name.cmp(&b.if_name));
        inventory.conflicts = plan.conflicts;
        inventory
    }
}

/// The device type attribute for an interface.
#[must_use]
pub fn device_kind(interface: &HostInterface) -> DeviceKind {
    match &interface.kind {
        Some(LinkKind::Bond) => DeviceKind::Bond,
        Some(LinkKind::Vlan) => DeviceKind::Vlan,
        Some(_) => DeviceKind::Virtual,
        None => match interface.hardware.pci.as_ref().map(|pci| &pci.sriov) {
            Some(SriovRole::VirtualFunction { .. }) => DeviceKind::SriovVf,
            Some(SriovRole::PhysicalFunction { total_vfs, .. }) if *total_vfs > 0 => {
                DeviceKind::SriovPf
            }
            _ if interface.hardware.has_device => DeviceKind::Physical,
            _ => DeviceKind::Virtual,
        },
    }
}

fn is_loopback(interface: &HostInterface) -> bool {
    interface.loopback
}

/// Controllers whose ports cannot carry a macvlan and must not be moved away.
fn enslaved(interface: &HostInterface) -> Option<Exclusion> {
    let controller = interface.controller.as_ref()?;
    let kind = controller.kind.as_ref().map(ToString::to_string);
    match kind.as_deref() {
        Some("bond" | "bridge" | "team" | "openvswitch") | None => Some(Exclusion::Enslaved {
            controller: controller.name.clone(),
            kind: kind.unwrap_or_else(|| "controller".to_owned()),
        }),
        // VRF ports keep their own rx path and may move; leave them to the other rules.
        Some(_) => None,
    }
}

fn shared_parent_exclusion(interface: &HostInterface) -> Option<Exclusion> {
    if is_loopback(interface) {
        return Some(Exclusion::Loopback);
    }
    enslaved(interface)
}

fn exclusive_exclusion(interface: &HostInterface, selection: &Selection) -> Option<Exclusion> {
    if is_loopback(interface) {
        return Some(Exclusion::Loopback);
    }
    let included = selection.include.iter().any(|p| p.matches(&interface.name));
    if !selection.include.is_empty() && !included {
        return Some(Exclusion::NotIncluded);
    }
    if let Some(pattern) = selection.exclude.iter().find(|p| p.matches(&interface.name)) {
        return Some(Exclusion::ExcludedByPattern(pattern.as_str().to_owned()));
    }
    if let Some(reason) = enslaved(interface) {
        return Some(reason);
    }
    match &interface.kind {
        Some(kind @ (LinkKind::Bond | LinkKind::Bridge)) => {
            return Some(Exclusion::OnlySharedParent(kind.clone()));
        }
        Some(kind) if !included => return Some(Exclusion::Virtual(kind.clone())),
        _ => {}
    }
    if let Some(driver) =
        interface.hardware.driver.as_deref().filter(|driver| USERSPACE_DRIVERS.contains(driver))
    {
        return Some(Exclusion::UserspaceDriver(driver.to_owned()));
    }
    if interface.has_default_route {
        return Some(Exclusion::DefaultRoute);
    }
    interface.global_addresses.first().map(|address| Exclusion::GlobalAddress(address.clone()))
}

/// Whether a flag's `wanted` (an interface name or a PCI address) names `interface`.
fn names_interface(wanted: &str, interface: &HostInterface) -> bool {
    *wanted == interface.name
        || interface
            .hardware
            .pci
            .as_ref()
            .is_some_and(|pci| pci.address.to_string() == wanted.to_ascii_lowercase())
}

fn base_device_name(interface: &HostInterface) -> String {
    match &interface.hardware.pci {
        // Only a real NIC function owns its PCI address; a vlan or macvlan on top of it does
        // not have a `device` link of its own.
        Some(pci) if interface.kind.is_none() => naming::pci_device_name(&pci.address),
        _ => naming::interface_device_name(&interface.name),
    }
}

fn exclusive_device(interface: &HostInterface) -> Device {
    let kind = device_kind(interface);
    let mut attributes = attributes(interface, kind);
    put_string(&mut attributes, attr::SHARING, "exclusive");
    Device {
        name: base_device_name(interface),
        if_name: interface.name.clone(),
        kind,
        sharing: Sharing::Exclusive,
        shared_capacity: None,
        bandwidth: None,
        slot_index: None,
        attributes,
    }
}

fn shared_devices(interface: &HostInterface, selection: &Selection) -> Vec<Device> {
    let kind = device_kind(interface);
    let mut attributes = attributes(interface, kind);
    put_string(&mut attributes, attr::SHARING, "shared");
    let base = base_device_name(interface);
    match selection.sharing_mode {
        SharingMode::Capacity => vec![Device {
            name: base,
            if_name: interface.name.clone(),
            kind,
            sharing: Sharing::Shared,
            shared_capacity: Some(selection.shared_capacity),
            bandwidth: bandwidth::parent_bandwidth(
                selection.parent_bandwidth_flag(interface),
                interface.hardware.speed_mbps,
                None,
            ),
            slot_index: None,
            attributes,
        }],
        SharingMode::Slots => (0..selection.slot_count)
            .map(|index| Device {
                name: naming::fit_label(&format!("{base}-s{index}"), naming::MAX_LABEL_LEN),
                if_name: interface.name.clone(),
                kind,
                sharing: Sharing::Slot,
                shared_capacity: None,
                bandwidth: None,
                slot_index: Some(index),
                attributes: attributes.clone(),
            })
            .collect(),
    }
}

/// The devices of the shared-mode PodNetworks on one parent: per network, one shared device
/// `<podnetwork>-<parent>` with the network's capacity, or in slots mode as many slot
/// devices (at most the node's slot count), each with the parent's attributes plus
/// `podNetwork` and `vlan`.
fn network_devices(
    interface: &HostInterface,
    selection: &Selection,
    networks: &[SharedNetwork],
) -> Vec<Device> {
    let kind = device_kind(interface);
    let mut parent_attributes = attributes(interface, kind);
    put_string(&mut parent_attributes, attr::SHARING, "shared");
    let parent = base_device_name(interface);
    let mut devices = Vec::new();
    for network in networks {
        let mut attributes = parent_attributes.clone();
        put_string(&mut attributes, attr::POD_NETWORK, &network.network);
        put_int(&mut attributes, attr::VLAN, network.vlan.map(u32::from));
        let name = shared_device_name(&network.network, &parent);
        match selection.sharing_mode {
            SharingMode::Capacity => devices.push(Device {
                name,
                if_name: interface.name.clone(),
                kind,
                sharing: Sharing::Shared,
                shared_capacity: Some(network.capacity),
                bandwidth: bandwidth::parent_bandwidth(
                    selection.parent_bandwidth_flag(interface),
                    interface.hardware.speed_mbps,
                    network.bandwidth,
                ),
                slot_index: None,
                attributes,
            }),
            SharingMode::Slots => {
                devices.extend((0..network.capacity.min(selection.slot_count)).map(|index| {
                    Device {
                        name: naming::fit_label(&format!("{name}-s{index}"), naming::MAX_LABEL_LEN),
                        if_name: interface.name.clone(),
                        kind,
                        sharing: Sharing::Slot,
                        shared_capacity: None,
                        bandwidth: None,
                        slot_index: Some(index),
                        attributes: attributes.clone(),
                    }
                }));
            }
        }
    }
    devices
}

fn attributes(interface: &HostInterface, kind: DeviceKind) -> BTreeMap<String, AttributeValue> {
    let mut attributes = BTreeMap::new();
    put_string(&mut attributes, attr::IF_NAME, &interface.name);
    put_string(&mut attributes, attr::TYPE, kind.as_str());
    put_int(&mut attributes, attr::MTU, Some(interface.mtu));
    put_string(&mut attributes, attr::OPER_STATE, interface.oper_state.as_str());
    if let Some(mac) = &interface.mac {
        put_string(&mut attributes, attr::MAC, &mac.to_string());
    }
    if let Some(driver) = &interface.hardware.driver {
        put_string(&mut attributes, attr::KERNEL_DRIVER, driver);
    }
    put_int(&mut attributes, attr::SPEED_MBPS, interface.hardware.speed_mbps);
    if let Some(pci) = &interface.hardware.pci {
        put_string(&mut attributes, attr::PCI_ADDRESS, &pci.address.to_string());
        let bus_id = pci.address.to_string();
        insert_string(&mut attributes, names::ATTRIBUTE_PCI_BUS_ID.to_owned(), &bus_id);
        if let Some(vendor) = pci.vendor {
            put_string(&mut attributes, attr::PCI_VENDOR, &format!("{vendor:04x}"));
        }
        if let Some(device) = pci.device {
            put_string(&mut attributes, attr::PCI_DEVICE, &format!("{device:04x}"));
        }
        put_int(&mut attributes, attr::NUMA_NODE, pci.numa_node);
        if let Some(root) = &pci.pcie_root {
            insert_string(&mut attributes, ATTRIBUTE_PCIE_ROOT.to_owned(), root);
        }
        match &pci.sriov {
            SriovRole::None => {}
            SriovRole::PhysicalFunction { total_vfs, num_vfs } => {
                put_int(&mut attributes, attr::SRIOV_TOTAL_VFS, Some(*total_vfs));
                put_int(&mut attributes, attr::SRIOV_VFS, Some(*num_vfs));
            }
            SriovRole::VirtualFunction { pf_name, vf_index, .. } => {
                if let Some(pf_name) = pf_name {
                    put_string(&mut attributes, attr::PF_NAME, pf_name);
                }
                put_int(&mut attributes, attr::VF_INDEX, *vf_index);
            }
        }
    }
    rdma::put_attributes(&mut attributes, interface);
    attributes
}

fn qualified(name: &str) -> String {
    format!("{ATTRIBUTE_DOMAIN}/{name}")
}

fn put_string(attributes: &mut BTreeMap<String, AttributeValue>, name: &str, value: &str) {
    insert_string(attributes, qualified(name), value);
}

fn insert_string(attributes: &mut BTreeMap<String, AttributeValue>, key: String, value: &str) {
    if value.chars().count() <= MAX_STRING_ATTRIBUTE_LEN {
        attributes.insert(key, AttributeValue::String(value.to_owned()));
    }
}

fn put_int(attributes: &mut BTreeMap<String, AttributeValue>, name: &str, value: Option<u32>) {
    if let Some(value) = value {
        attributes.insert(qualified(name), AttributeValue::Int(i64::from(value)));
    }
}

/// Device names must be unique in the pool. Collisions are rare (several netdevs on one PCI
/// function, an interface literally named like a PCI device); each colliding device gets a
/// suffix derived from its interface name, which is unique on the node, so names stay stable.
fn make_names_unique(devices: &mut [Device]) {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for device in devices.iter() {
        *counts.entry(device.name.clone()).or_default() += 1;
    }
    for device in devices.iter_mut() {
        if counts.get(&device.name).copied().unwrap_or(0) > 1 {
            let mut key = match device.slot_index {
                Some(index) => format!("{}/{index}", device.if_name),
                None => device.if_name.clone(),
            };
            // Devices of PodNetworks carry the network too (one parent has one per network);
            // the keys of other devices stay as they were, so their names do not change.
            if let Some(network) = device.string_attribute(&qualified(attr::POD_NETWORK)) {
                key = format!("{key}@{network}");
            }
            device.name = naming::with_hash_suffix(&device.name, &key, naming::MAX_LABEL_LEN);
        }
    }
}

#[cfg(test)]
mod tests;
