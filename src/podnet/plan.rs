//! Pure attach planning: turns a resolved `NetworkConfig`, the allocated device's host facts and
//! the pod's identity into the ordered steps that attach one pod interface, and derives the
//! steps that undo them (rollback on failure, detach at sandbox stop). No I/O.
//!
//! Links are named, never referred to by ifindex: an index is only valid in one namespace and
//! can change when a link moves, so `podnet::apply` resolves names while it executes.

use std::fmt;
use std::path::PathBuf;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use crate::model::network_config::{
    Addressing, DeviceKind, IpvlanFlag, IpvlanMode, MacAddr, MacvlanMode, Mode, ResolvedMode,
    ResolvedNetworkConfig, Route, Sharing, check_interface_name,
};
use crate::model::support::{KernelSupport, NodeSupport, Probe};

mod names;
pub mod rdma;
mod routing;
#[cfg(test)]
pub(crate) mod tests;

pub use routing::{AppliedRouting, SourceRule, TableRoute, assign_tables, with_table};

pub use names::{
    DEVICE_ALIAS_PREFIX, HASHED_VLAN_PREFIX, InterfaceSlot, NameError, VLAN_ALIAS, VlanOwner,
    assign_interface_names, device_alias, parse_device_alias, parse_vlan_alias, vlan_alias,
    vlan_name, vlan_owner,
};

/// What the attach needs to know about the allocated device in the host netns. Gathered by
/// the caller from the inventory; names only, no ifindex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostDevice {
    /// Host interface name: the device itself (exclusive) or the parent (shared, slot).
    pub if_name: String,
    /// Device type.
    pub kind: DeviceKind,
    /// Exclusive, shared or slot.
    pub sharing: Sharing,
    /// The device's MTU in the host netns, restored when an exclusive device comes back.
    pub mtu: u32,
    /// The device's MAC address in the host netns, restored when the config changed it.
    pub mac: Option<MacAddr>,
}

/// The pod whose network namespace receives the interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetns {
    /// The pod's UID.
    pub pod_uid: String,
    /// Path of the sandbox's network namespace (from NRI `RunPodSandbox`; remembered because
    /// it is empty at stop time).
    pub path: PathBuf,
}

/// Everything one attach is planned from.
#[derive(Debug, Clone, Copy)]
pub struct AttachRequest<'a> {
    /// The `ResourceClaim`'s UID.
    pub claim_uid: &'a str,
    /// The validated config of this allocation result.
    pub config: &'a ResolvedNetworkConfig,
    /// The allocated device's host facts.
    pub device: &'a HostDevice,
    /// The pod receiving the interface.
    pub pod: &'a PodNetns,
    /// The final pod-side name: the config's explicit name or the default name (`net1`, …)
    /// assigned at sandbox time (DESIGN §3).
    pub interface_name: &'a str,
    /// The addresses leased from the node-local pool (IPAM, with the pool's prefix), for
    /// [`Addressing::Pool`], or from a `PodNetwork` for [`Addressing::Network`]; must be empty
    /// otherwise.
    pub pool_addresses: &'a [IpNetwork],
}

/// The kind of virtual child link created on a shared parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
#[non_exhaustive]
pub enum ChildKind {
    /// `IFLA_INFO_KIND` `macvlan` with its `IFLA_MACVLAN_MODE`.
    Macvlan {
        /// macvlan mode.
        mode: MacvlanMode,
    },
    /// `IFLA_INFO_KIND` `ipvlan` with its `IFLA_IPVLAN_MODE` and `IFLA_IPVLAN_FLAGS`. The
    /// child shares the parent's MAC address (`ipvlan_link_new` copies it), so it has none of
    /// its own to set.
    Ipvlan {
        /// ipvlan mode (l2, l3, l3s).
        mode: IpvlanMode,
        /// ipvlan flag (bridge, private, vepa).
        flag: IpvlanFlag,
    },
}

impl fmt::Display for ChildKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildKind::Macvlan { mode } => write!(f, "macvlan mode {}", macvlan_mode_name(*mode)),
            ChildKind::Ipvlan { mode, flag } => {
                write!(f, "ipvlan mode {} {}", ipvlan_mode_name(*mode), ipvlan_flag_name(*flag))
            }
        }
    }
}

fn ipvlan_mode_name(mode: IpvlanMode) -> &'static str {
    match mode {
        IpvlanMode::L2 => "l2",
        IpvlanMode::L3 => "l3",
        IpvlanMode::L3s => "l3s",
    }
}

fn ipvlan_flag_name(flag: IpvlanFlag) -> &'static str {
    match flag {
        IpvlanFlag::Bridge => "bridge",
        IpvlanFlag::Private => "private",
        IpvlanFlag::Vepa => "vepa",
    }
}

fn macvlan_mode_name(mode: MacvlanMode) -> &'static str {
    match mode {
        MacvlanMode::Bridge => "bridge",
        MacvlanMode::Private => "private",
        MacvlanMode::Vepa => "vepa",
        MacvlanMode::Passthru => "passthru",
    }
}

/// A VLAN sub-interface in the host netns, shared by every claim on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VlanLink {
    /// The shared parent.
    pub parent: String,
    /// 802.1Q VLAN id.
    pub id: u16,
    /// [`vlan_name`]: `<parent>.<id>`, or `nc<hash6>.<id>` when that is longer than 15
    /// bytes. Kept in the plan (and so in the store) as it was when the claim attached.
    pub name: String,
}

/// One attach step, executed in order by `podnet::apply`. Steps after the create/move act on
/// the pod interface made by that step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "step")]
pub enum Step {
    /// Make sure the VLAN sub-interface exists in the host netns (created and marked with
    /// [`VLAN_ALIAS`] on first use) and count this claim as one of its users.
    EnsureVlan {
        /// The sub-interface.
        vlan: VlanLink,
    },
    /// Create a child of `parent` directly in the pod netns with its final name, MTU and MAC
    /// (one `RTM_NEWLINK` sent in the host netns with `IFLA_NET_NS_FD`: the parent index
    /// resolves in the sender's netns, the name in the target's; no rename and no second
    /// netns move, which would cost an RCU grace period).
    CreateChild {
        /// Child kind and its mode.
        kind: ChildKind,
        /// Host-side parent (the device or its VLAN sub-interface).
        parent: String,
        /// Pod-side name.
        name: String,
        /// MTU.
        mtu: u32,
        /// MAC address; `None` lets the kernel pick a random one.
        hardware_address: Option<MacAddr>,
    },
    /// Move a host device into the pod netns, renamed, with its MTU, MAC and an alias
    /// recording its host name and claim: one `RTM_NEWLINK` (the kernel applies the name in
    /// the target netns and the other attributes after the move).
    MoveIntoPod {
        /// Name in the host netns.
        host_name: String,
        /// Name in the pod netns.
        pod_name: String,
        /// MTU in the pod.
        mtu: u32,
        /// MAC address to set; `None` keeps the device's.
        hardware_address: Option<MacAddr>,
        /// [`device_alias`].
        alias: String,
    },
    /// Add an interface address (host bits kept).
    AddAddress {
        /// The address with its prefix.
        address: IpNetwork,
        /// `IFA_F_NODAD` (IPv6): see [`plan_attach`] for why.
        nodad: bool,
    },
    /// Make sure the VRF exists in the pod netns (created with its table and up on first use;
    /// shared by the pod's claims that name it).
    EnsureVrf {
        /// The VRF.
        vrf: crate::model::network_config::Vrf,
    },
    /// Enslave the interface to the VRF (while it is still down).
    JoinVrf {
        /// The VRF's name.
        vrf: String,
    },
    /// Set the interface's sysctls (while it is still down).
    SetSysctls {
        /// The settings, keys written with the interface's name.
        sysctls: Vec<crate::model::network_config::Sysctl>,
    },
    /// Add a route through the interface to a table other than `main`.
    AddTableRoute {
        /// The route and its table.
        route: TableRoute,
    },
    /// Add a `from <address> lookup <table>` rule.
    AddRule {
        /// The rule.
        rule: SourceRule,
    },
    /// Set the link administratively up.
    SetUp,
    /// Add a route through the interface (after up: the kernel refuses a nexthop on a down
    /// link).
    AddRoute {
        /// The route.
        route: Route,
    },
    /// Move the netdev's RDMA device into the pod netns, right after the netdev
    /// (`RDMA_NLDEV_CMD_SET` with `RDMA_NLDEV_NET_NS_FD`; node in exclusive RDMA netns mode,
    /// `rdma: exclusive`; see [`rdma`]).
    MoveRdmaIntoPod {
        /// The RDMA device's name (it keeps it across netns moves).
        device: String,
    },
}

impl Step {
    /// The step that reverses this one.
    #[must_use]
    pub fn undo(&self, plan: &AttachPlan) -> UndoStep {
        match self {
            Step::EnsureVlan { vlan } => UndoStep::ReleaseVlan { vlan: vlan.clone() },
            Step::CreateChild { name, .. } => UndoStep::DeleteChild { name: name.clone() },
            Step::MoveIntoPod { host_name, pod_name, .. } => UndoStep::MoveToHost {
                pod_name: pod_name.clone(),
                host_name: host_name.clone(),
                mtu: plan.host_mtu,
                hardware_address: plan.host_mac_to_restore,
            },
            Step::AddAddress { address, .. } => UndoStep::DeleteAddress { address: *address },
            Step::EnsureVrf { vrf } => UndoStep::ReleaseVrf { vrf: vrf.clone() },
            Step::JoinVrf { vrf } => UndoStep::LeaveVrf { vrf: vrf.clone() },
            Step::SetSysctls { .. } => UndoStep::KeepSysctls,
            Step::AddTableRoute { route } => UndoStep::DeleteTableRoute { route: route.clone() },
            Step::AddRule { rule } => UndoStep::DeleteRule { rule: rule.clone() },
            Step::SetUp => UndoStep::SetDown,
            Step::AddRoute { route } => UndoStep::DeleteRoute { route: route.clone() },
            Step::MoveRdmaIntoPod { device } => UndoStep::MoveRdmaToHost { device: device.clone() },
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::EnsureVlan { vlan } => write!(f, "ensure VLAN sub-interface {}", vlan.name),
            Step::CreateChild { kind, parent, name, mtu, .. } => {
                write!(f, "create {kind} {name} on {parent} (mtu {mtu}) in the pod")
            }
            Step::MoveIntoPod { host_name, pod_name, mtu, .. } => {
                write!(f, "move {host_name} into the pod as {pod_name} (mtu {mtu})")
            }
            Step::AddAddress { address, .. } => write!(f, "add address {address}"),
            Step::EnsureVrf { vrf } => write!(f, "ensure VRF {} (table {})", vrf.name, vrf.table),
            Step::JoinVrf { vrf } => write!(f, "enslave to VRF {vrf}"),
            Step::SetSysctls { sysctls } => {
                let list: Vec<String> = sysctls.iter().map(ToString::to_string).collect();
                write!(f, "set sysctls {}", list.join(", "))
            }
            Step::AddTableRoute { route } => write!(f, "add route {route}"),
            Step::AddRule { rule } => write!(f, "add rule {rule}"),
            Step::SetUp => f.write_str("set link up"),
            Step::AddRoute { route } => write!(f, "add route {}", RouteDisplay(route)),
            Step::MoveRdmaIntoPod { device } => write!(f, "move RDMA device {device} into the pod"),
        }
    }
}

/// A step that reverses an attach step: used in reverse order for the rollback of a failed
/// attach, and (the link-level subset, see [`AttachPlan::teardown`]) for detach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "step")]
pub enum UndoStep {
    /// Drop this claim's use of the VLAN sub-interface; delete it after the last user, and
    /// only if this driver created it.
    ReleaseVlan {
        /// The sub-interface.
        vlan: VlanLink,
    },
    /// Delete the child link in the pod (when the pod netns is gone, the kernel already did).
    DeleteChild {
        /// Pod-side name.
        name: String,
    },
    /// Move the device back to the host netns: down, original name, MTU and MAC, alias
    /// cleared, in one message; the kernel flushes its addresses on the move.
    MoveToHost {
        /// Name in the pod.
        pod_name: String,
        /// Original host name.
        host_name: String,
        /// Original MTU.
        mtu: u32,
        /// Original MAC, when the attach changed it.
        hardware_address: Option<MacAddr>,
    },
    /// Remove an address.
    DeleteAddress {
        /// The address.
        address: IpNetwork,
    },
    /// Delete the VRF once no link is enslaved to it (and only a VRF with the plan's table).
    ReleaseVrf {
        /// The VRF.
        vrf: crate::model::network_config::Vrf,
    },
    /// Take the interface out of the VRF (rollback only: it leaves with the link).
    LeaveVrf {
        /// The VRF's name.
        vrf: String,
    },
    /// Nothing: sysctls go with the link (deleted, or made afresh from the host's defaults
    /// when a device moves back).
    KeepSysctls,
    /// Remove a table route (rollback only: it goes with the link).
    DeleteTableRoute {
        /// The route and its table.
        route: TableRoute,
    },
    /// Remove a source rule (rules belong to the netns: detach removes them).
    DeleteRule {
        /// The rule.
        rule: SourceRule,
    },
    /// Set the link down.
    SetDown,
    /// Remove a route.
    DeleteRoute {
        /// The route.
        route: Route,
    },
    /// Move the RDMA device back to the host netns (nothing to do when the pod netns is
    /// gone: the kernel moved it back, `rdma_dev_exit_net`).
    MoveRdmaToHost {
        /// The RDMA device's name.
        device: String,
    },
}

impl fmt::Display for UndoStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UndoStep::ReleaseVlan { vlan } => write!(f, "release VLAN sub-interface {}", vlan.name),
            UndoStep::DeleteChild { name } => write!(f, "delete {name} in the pod"),
            UndoStep::MoveToHost { pod_name, host_name, mtu, .. } => {
                write!(f, "move {pod_name} back to the host as {host_name} (mtu {mtu})")
            }
            UndoStep::DeleteAddress { address } => write!(f, "delete address {address}"),
            UndoStep::ReleaseVrf { vrf } => write!(f, "release VRF {}", vrf.name),
            UndoStep::LeaveVrf { vrf } => write!(f, "leave VRF {vrf}"),
            UndoStep::KeepSysctls => f.write_str("sysctls go with the link"),
            UndoStep::DeleteTableRoute { route } => write!(f, "delete route {route}"),
            UndoStep::DeleteRule { rule } => write!(f, "delete rule {rule}"),
            UndoStep::SetDown => f.write_str("set link down"),
            UndoStep::DeleteRoute { route } => write!(f, "delete route {}", RouteDisplay(route)),
            UndoStep::MoveRdmaToHost { device } => {
                write!(f, "move RDMA device {device} back to the host")
            }
        }
    }
}

/// `10.20.0.0/16 via 10.10.1.1 metric 200`.
pub(crate) struct RouteDisplay<'a>(pub(crate) &'a Route);

impl fmt::Display for RouteDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.destination)?;
        if let Some(gateway) = self.0.gateway {
            write!(f, " via {gateway}")?;
        }
        if let Some(metric) = self.0.metric {
            write!(f, " metric {metric}")?;
        }
        Ok(())
    }
}

/// The plan of one pod interface: persisted with the attachment so that detach (whose NRI
/// event carries no netns path) and reconcile after a restart can undo it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachPlan {
    /// The `ResourceClaim`'s UID.
    pub claim_uid: String,
    /// The pod and its netns path.
    pub pod: PodNetns,
    /// The configured mode.
    pub mode: Mode,
    /// Host-side device (exclusive) or parent (shared), as allocated.
    pub host_device: String,
    /// Pod-side interface name.
    pub interface_name: String,
    /// MTU the exclusive device gets back on detach.
    pub host_mtu: u32,
    /// MAC the exclusive device gets back on detach, when the attach changes it.
    pub host_mac_to_restore: Option<MacAddr>,
    /// The ordered attach steps.
    pub steps: Vec<Step>,
    /// The netdev's RDMA device the pod gets (moved or shared), for the claim status
    /// (`data.rdmaDevice`); absent in plans recorded before `rdma` existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
}

impl AttachPlan {
    /// The detach steps: the link-level reversals in reverse order. Addresses, routes and the
    /// up flag need no step of their own: the kernel removes them with a deleted link and
    /// flushes them when a device leaves a netns.
    #[must_use]
    pub fn teardown(&self) -> Vec<UndoStep> {
        self.steps
            .iter()
            .rev()
            .filter(|step| {
                matches!(step, Step::AddRule { .. } | Step::EnsureVrf { .. })
                    || matches!(
                        step,
                        Step::EnsureVlan { .. }
                            | Step::CreateChild { .. }
                            | Step::MoveIntoPod { .. }
                            | Step::MoveRdmaIntoPod { .. }
                    )
            })
            .map(|step| step.undo(self))
            .collect()
    }

    /// Whether the interface is a child created in the pod (macvlan, ipvlan), not a device
    /// moved there.
    #[must_use]
    pub fn creates_child(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::CreateChild { .. }))
    }

    /// The addresses the attach configures, in plan order (canonical CIDR, host bits kept).
    #[must_use]
    pub fn addresses(&self) -> Vec<IpNetwork> {
        self.steps
            .iter()
            .filter_map(|step| match step {
                Step::AddAddress { address, .. } => Some(*address),
                _ => None,
            })
            .collect()
    }

    /// The routes the attach adds, in plan order.
    #[must_use]
    pub fn routes(&self) -> Vec<Route> {
        self.steps
            .iter()
            .filter_map(|step| match step {
                Step::AddRoute { route } => Some(route.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Why no plan could be made; every variant names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The mode is valid config but this build cannot attach it yet.
    #[error("mode {mode} is not supported by this build: {why}")]
    ModeNotSupported {
        /// The mode.
        mode: Mode,
        /// What is missing.
        why: &'static str,
    },
    /// The mode does not fit how the device was allocated.
    #[error("mode {mode} cannot use a {sharing} device ({device})")]
    ModeDoesNotFitDevice {
        /// The mode.
        mode: Mode,
        /// How the device is shared.
        sharing: Sharing,
        /// The device.
        device: String,
    },
    /// A bond cannot change network namespace (the kernel refuses with `EINVAL`).
    #[error("{device} is a {kind} and cannot move into a pod")]
    CannotMove {
        /// The device.
        device: String,
        /// Its type.
        kind: DeviceKind,
    },
    /// The pod-side name breaks the kernel's naming rules.
    #[error("interface name {name:?}: {why}")]
    InterfaceName {
        /// The name.
        name: String,
        /// The rule.
        why: &'static str,
    },
    /// A pool config without its leased address, or leases without a pool.
    #[error("addressing {expected}, but {given} pool addresses were given")]
    PoolAddresses {
        /// What the config asks for.
        expected: &'static str,
        /// How many addresses the caller passed.
        given: usize,
    },
    /// A leased address outside its pool.
    #[error("pool address {address} is not inside the pool {subnet}")]
    PoolAddressOutsidePool {
        /// The address.
        address: IpNetwork,
        /// The pool.
        subnet: IpNetwork,
    },
    /// The config changes the MAC of an exclusive device whose original MAC is unknown, so
    /// detach could not restore it.
    #[error("hardwareAddress set, but the original MAC of {device} is unknown")]
    UnknownOriginalMac {
        /// The device.
        device: String,
    },
}

/// Plans the attach of one pod interface.
///
/// IPv6 addresses are added with `IFA_F_NODAD`: node-local pools never hand one address to two
/// claims and static addresses are the administrator's promise of uniqueness, while DAD would
/// keep the address tentative (unusable for `bind`, ~1 s with the kernel defaults
/// `dad_transmits=1`, `retrans_time=1000 ms`, plus the random delay) after the sandbox already
/// reported ready, and the containers would start with a network that does not work yet.
/// Waiting for DAD instead would put that second on the sandbox's critical path. A duplicate
/// coming from outside our IPAM therefore goes undetected; that is the documented trade-off.
pub fn plan_attach(request: &AttachRequest<'_>) -> Result<AttachPlan, PlanError> {
    let AttachRequest { claim_uid, config, device, pod, interface_name, pool_addresses } = *request;
    check_interface_name(interface_name)
        .map_err(|why| PlanError::InterfaceName { name: interface_name.to_owned(), why })?;
    let mode = config.mode.mode();
    let addresses = addresses_of(&config.addressing, pool_addresses)?;
    let mut steps = Vec::with_capacity(4 + addresses.len() + config.routes.len());
    let mut host_mac_to_restore = None;
    steps.extend(routing::before_link(config));
    match config.mode {
        // A vfio device has no interface: the attach never plans one (the claims' port
        // leaves vfio devices out of a pod's interfaces).
        ResolvedMode::Vfio => {
            return Err(PlanError::ModeNotSupported {
                mode,
                why: "a vfio device gets no interface in the pod (its group device is injected through CDI)",
            });
        }
        ResolvedMode::Macvlan { mode: macvlan_mode } => {
            let kind = ChildKind::Macvlan { mode: macvlan_mode };
            push_child(&mut steps, request, kind, config.interface.hardware_address)?;
        }
        // Validation refuses `hardwareAddress` with ipvlan: the child has the parent's MAC.
        ResolvedMode::Ipvlan { mode: ipvlan_mode, flag } => {
            push_child(&mut steps, request, ChildKind::Ipvlan { mode: ipvlan_mode, flag }, None)?;
        }
        // A VF moves like any exclusive device, its VF settings (MAC included, on the PF and
        // on its netdev) applied at prepare (`claims::vf`).
        ResolvedMode::HostDevice | ResolvedMode::SriovVf => {
            if device.sharing != Sharing::Exclusive {
                return Err(PlanError::ModeDoesNotFitDevice {
                    mode,
                    sharing: device.sharing,
                    device: device.if_name.clone(),
                });
            }
            if device.kind == DeviceKind::Bond {
                return Err(PlanError::CannotMove {
                    device: device.if_name.clone(),
                    kind: device.kind,
                });
            }
            // A VF's MAC is one of its VF settings: prepare set it on the PF, unprepare sets
            // it back there. The netdev takes it from the PF (igbvf at its reset), and a PF
            // that set it refuses the VF another one (igb: "VF attempted to override
            // administratively set MAC address"), so detach leaves the VF's MAC alone.
            if let Some(mac) = config.interface.hardware_address
                && device.mac != Some(mac)
                && config.mode == ResolvedMode::HostDevice
            {
                host_mac_to_restore = Some(device.mac.ok_or_else(|| {
                    PlanError::UnknownOriginalMac { device: device.if_name.clone() }
                })?);
            }
            // A VF's netdev got its MAC at prepare, with the PF's (`claims::vf::apply`).
            let hardware_address = match config.mode {
                ResolvedMode::SriovVf => None,
                _ => config.interface.hardware_address,
            };
            steps.push(Step::MoveIntoPod {
                host_name: device.if_name.clone(),
                pod_name: interface_name.to_owned(),
                mtu: config.interface.mtu,
                hardware_address,
                alias: device_alias(&device.if_name, claim_uid),
            });
            steps.extend(rdma::move_step(config));
        }
    }
    let routed = addresses.clone();
    steps.extend(routing::while_down(config));
    steps.extend(
        addresses.into_iter().map(|address| Step::AddAddress { address, nodad: address.is_ipv6() }),
    );
    steps.push(Step::SetUp);
    steps.extend(routing::after_up(config, &routed));
    Ok(AttachPlan {
        claim_uid: claim_uid.to_owned(),
        pod: pod.clone(),
        mode,
        host_device: device.if_name.clone(),
        interface_name: interface_name.to_owned(),
        host_mtu: device.mtu,
        host_mac_to_restore,
        steps,
        rdma_device: config.rdma.as_ref().map(|rdma| rdma.device.clone()),
    })
}

/// The steps of a child on the shared parent (or on its VLAN sub-interface, ensured first),
/// created in the pod under its final name.
fn push_child(
    steps: &mut Vec<Step>,
    request: &AttachRequest<'_>,
    kind: ChildKind,
    hardware_address: Option<MacAddr>,
) -> Result<(), PlanError> {
    let AttachRequest { config, device, interface_name, .. } = *request;
    if device.sharing == Sharing::Exclusive {
        return Err(PlanError::ModeDoesNotFitDevice {
            mode: config.mode.mode(),
            sharing: device.sharing,
            device: device.if_name.clone(),
        });
    }
    let parent = match config.vlan {
        Some(id) => {
            let vlan = VlanLink {
                parent: device.if_name.clone(),
                id,
                name: vlan_name(&device.if_name, id),
            };
            let name = vlan.name.clone();
            steps.push(Step::EnsureVlan { vlan });
            name
        }
        None => device.if_name.clone(),
    };
    steps.push(Step::CreateChild {
        kind,
        parent,
        name: interface_name.to_owned(),
        mtu: config.interface.mtu,
        hardware_address,
    });
    Ok(())
}

/// Why this build cannot plan `mode` yet, or `None` when [`plan_attach`] handles it. Prepare
/// refuses these modes through [`node_support`], so a claim never reaches the sandbox with
/// one.
#[must_use]
pub fn not_implemented(mode: Mode) -> Option<&'static str> {
    match mode {
        Mode::Macvlan | Mode::Ipvlan | Mode::HostDevice | Mode::SriovVf | Mode::Vfio => None,
    }
}

/// What prepare refuses on this node: modes and VLAN sub-interfaces its kernel lacks (the
/// kernel's reason first: it stays true when the attach is implemented), then modes this
/// build cannot plan ([`not_implemented`]).
#[must_use]
pub fn node_support(kernel: &KernelSupport) -> NodeSupport {
    let mut support = NodeSupport::everything();
    if let Probe::Missing { detail } = &kernel.ipvlan {
        support = support.refuse_mode(
            Mode::Ipvlan,
            format!("ipvlan is not available on this node's kernel ({detail})"),
        );
    }
    if let Probe::Missing { detail } = &kernel.vrf {
        support =
            support.refuse_vrf(format!("VRF is not available on this node's kernel ({detail})"));
    }
    if let Probe::Missing { detail } = &kernel.vlan {
        support = support.refuse_vlan(format!(
            "VLAN sub-interfaces are not available on this node's kernel ({detail})"
        ));
    }
    for mode in [Mode::Macvlan, Mode::Ipvlan, Mode::HostDevice, Mode::SriovVf, Mode::Vfio] {
        if let Some(why) = not_implemented(mode) {
            support = support.refuse_mode(mode, why);
        }
    }
    support
}

fn addresses_of(
    addressing: &Addressing,
    pool_addresses: &[IpNetwork],
) -> Result<Vec<IpNetwork>, PlanError> {
    match addressing {
        Addressing::None | Addressing::Static(_) if !pool_addresses.is_empty() => {
            Err(PlanError::PoolAddresses {
                expected: "without a pool",
                given: pool_addresses.len(),
            })
        }
        Addressing::None => Ok(Vec::new()),
        Addressing::Static(addresses) => Ok(addresses.clone()),
        Addressing::Pool(pool) => {
            if pool_addresses.len() != 1 {
                return Err(PlanError::PoolAddresses {
                    expected: "with one pool address",
                    given: pool_addresses.len(),
                });
            }
            let address = pool_addresses[0];
            if !same_network(pool.subnet, address) {
                return Err(PlanError::PoolAddressOutsidePool { address, subnet: pool.subnet });
            }
            Ok(vec![address])
        }
        // The addresses prepare got from the network's plan: one per family from the node's
        // blocks (with the subnet's prefix), or the claim's static addresses.
        Addressing::Network(network) => {
            let expected = if network.addresses.is_empty() {
                network.families().len()
            } else {
                network.addresses.len()
            };
            if pool_addresses.len() != expected {
                return Err(PlanError::PoolAddresses {
                    expected: "with one address per family of the PodNetwork (or its static addresses)",
                    given: pool_addresses.len(),
                });
            }
            for address in pool_addresses {
                let inside = network.addresses.contains(address)
                    || network.subnets.iter().any(|subnet| same_network(*subnet, *address));
                if !inside {
                    return Err(PlanError::PoolAddressOutsidePool {
                        address: *address,
                        subnet: network.subnets.first().copied().unwrap_or(*address),
                    });
                }
            }
            Ok(pool_addresses.to_vec())
        }
    }
}

fn same_network(subnet: IpNetwork, address: IpNetwork) -> bool {
    subnet.prefix() == address.prefix() && subnet.contains(address.ip())
}
