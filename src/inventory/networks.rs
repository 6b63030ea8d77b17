//! Which PodNetworks this node carries, and on which of its interfaces (DESIGN §2, §4). Pure.
//!
//! [`NodeNetworks::evaluate`] judges every PodNetwork of this driver for this node: it is
//! *served* when it is not being deleted, is enabled, its `Ready` condition is `True` for its
//! current generation (so an `Invalid` or `Overlaps` network is never published) and its
//! `nodeSelector` selects the node's labels. [`NetworkPlan::resolve`] then maps the served
//! networks' `parents` (interface names or PCI addresses) to the node's interfaces and settles
//! what cannot be published together: two networks with one VLAN on one parent, or a network
//! on a device another network already holds; the older network (creationTimestamp, then
//! name) keeps it and the conflict is reported.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;

use crate::model::device::{AttributeValue, Device, HostInterface, PciAddress, SriovRole};
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::network_config::Mode;
use crate::model::pod_network::{CONDITION_READY, PodNetwork};

/// What decides this node's networks, as the API adapters last saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkInputs {
    /// Every PodNetwork by name; `None` until the first complete list (before it, a network
    /// that is not listed may still exist).
    pub pod_networks: Option<Arc<BTreeMap<String, PodNetwork>>>,
    /// This node's labels; `None` until the Node was read (a node without a Node object has
    /// none).
    pub node_labels: Option<Arc<BTreeMap<String, String>>>,
}

impl NetworkInputs {
    /// Both inputs have been read at least once.
    #[must_use]
    pub fn is_known(&self) -> bool {
        self.pod_networks.is_some() && self.node_labels.is_some()
    }

    /// What has not been read yet, for a log line.
    #[must_use]
    pub fn unknown(&self) -> Vec<&'static str> {
        let mut unknown = Vec::new();
        if self.pod_networks.is_none() {
            unknown.push("the PodNetworks");
        }
        if self.node_labels.is_none() {
            unknown.push("the Node's labels");
        }
        unknown
    }
}

/// An invalid `spec.nodeSelector` (the schema admits only the four operators, so this is
/// about values): Kubernetes selects nothing with an invalid selector, and so do we.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An operator other than `In`, `NotIn`, `Exists`, `DoesNotExist`.
    #[error("spec.nodeSelector.matchExpressions[{index}].operator: unknown operator {operator:?}")]
    Operator {
        /// Index of the expression.
        index: usize,
        /// The operator given.
        operator: String,
    },
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with values.
    #[error(
        "spec.nodeSelector.matchExpressions[{index}].values: operator {operator} {}",
        if *needs_values { "needs at least one value" } else { "takes no values" }
    )]
    Values {
        /// Index of the expression.
        index: usize,
        /// The operator.
        operator: String,
        /// Whether the operator needs values (else it takes none).
        needs_values: bool,
    },
}

/// Whether `selector` selects a node with `labels`. No selector, or an empty one, selects
/// every node (as a Kubernetes `LabelSelector` does); the terms are ANDed.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let Some(selector) = selector else { return Ok(true) };
    let mut matches =
        selector.match_labels.iter().flatten().all(|(key, value)| labels.get(key) == Some(value));
    for (index, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let values = expression.values.as_deref().unwrap_or_default();
        let label = labels.get(&expression.key);
        let values_error = |needs_values| SelectorError::Values {
            index,
            operator: expression.operator.clone(),
            needs_values,
        };
        let holds = match expression.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => return Err(values_error(true)),
            "Exists" | "DoesNotExist" if !values.is_empty() => return Err(values_error(false)),
            "In" => label.is_some_and(|label| values.contains(label)),
            "NotIn" => label.is_none_or(|label| !values.contains(label)),
            "Exists" => label.is_some(),
            "DoesNotExist" => label.is_none(),
            other => {
                return Err(SelectorError::Operator { index, operator: other.to_owned() });
            }
        };
        matches &= holds;
    }
    Ok(matches)
}

/// Why a network of this driver is not served on this node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// `spec.nodeSelector` does not select this node.
    NodeNotSelected,
    /// `spec.nodeSelector` is invalid: it selects no node.
    InvalidSelector(SelectorError),
    /// `metadata.deletionTimestamp` is set.
    Deleting,
    /// `spec.enabled: false`.
    Disabled,
    /// The controller has not judged the current generation yet.
    StaleStatus {
        /// `observedGeneration` of the `Ready` condition (or of the status).
        observed: Option<i64>,
        /// `metadata.generation`.
        generation: Option<i64>,
    },
    /// `Ready` is not `True`.
    NotReady {
        /// Its reason (`Invalid`, `Overlaps`, `Disabled`), empty without a condition.
        reason: String,
        /// Its message.
        message: String,
    },
}

impl NotServed {
    /// Whether the network still selects this node (it is only not usable right now), so
    /// its parents stay reserved for it.
    #[must_use]
    pub fn selects_node(&self) -> bool {
        !matches!(self, Self::NodeNotSelected | Self::InvalidSelector(_))
    }
}

impl fmt::Display for NotServed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeNotSelected => f.write_str("spec.nodeSelector does not select this node"),
            Self::InvalidSelector(err) => write!(f, "{err}"),
            Self::Deleting => f.write_str("being deleted"),
            Self::Disabled => f.write_str("spec.enabled is false"),
            Self::StaleStatus { observed, generation } => write!(
                f,
                "status is for generation {}, the spec is generation {} (the controller has not judged it yet)",
                observed.map_or_else(|| "none".to_owned(), |g| g.to_string()),
                generation.map_or_else(|| "none".to_owned(), |g| g.to_string()),
            ),
            Self::NotReady { reason, .. } if reason.is_empty() => {
                f.write_str("no Ready condition yet")
            }
            Self::NotReady { reason, message } => {
                write!(f, "Ready is not True ({reason}: {message})")
            }
        }
    }
}

/// Whether this node serves `network` now; `labels` are the node's. The provider is the
/// caller's filter (a network of another driver is not ours to judge).
pub fn serving(network: &PodNetwork, labels: &BTreeMap<String, String>) -> Result<(), NotServed> {
    match selector_matches(network.spec.node_selector.as_ref(), labels) {
        Ok(true) => {}
        Ok(false) => return Err(NotServed::NodeNotSelected),
        Err(err) => return Err(NotServed::InvalidSelector(err)),
    }
    if network.metadata.deletion_timestamp.is_some() {
        return Err(NotServed::Deleting);
    }
    if !network.spec.enabled {
        return Err(NotServed::Disabled);
    }
    let status = network.status.as_ref();
    let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_READY));
    // The condition's own observedGeneration when set, else the status's: a condition of
    // an older generation says nothing about the current spec.
    let observed = ready
        .and_then(|c| c.observed_generation)
        .or_else(|| status.and_then(|s| s.observed_generation));
    let generation = network.metadata.generation;
    if generation.is_some() && observed != generation {
        return Err(NotServed::StaleStatus { observed, generation });
    }
    match ready {
        Some(condition) if condition.status == "True" => Ok(()),
        Some(condition) => Err(NotServed::NotReady {
            reason: condition.reason.clone(),
            message: condition.message.clone(),
        }),
        None => Err(NotServed::NotReady { reason: String::new(), message: String::new() }),
    }
}

/// Whether pods of `mode` get a child link on a shared parent (else they take a device).
#[must_use]
pub fn is_shared_mode(mode: Mode) -> bool {
    matches!(mode, Mode::Macvlan | Mode::Ipvlan)
}

/// A PodNetwork of this driver as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNetwork {
    /// Its name.
    pub name: String,
    /// `spec.mode`, macvlan when absent.
    pub mode: Mode,
    /// `spec.vlan`, `None` for untagged (0).
    pub vlan: Option<u16>,
    /// `spec.interfaceCapacity`.
    pub capacity: u32,
    /// `spec.bandwidth`, where it parses (the controller reports one that does not).
    pub bandwidth: Option<crate::model::bandwidth::BitsPerSecond>,
    /// `spec.parents`.
    pub parents: Vec<String>,
    /// Served here now, or why not.
    pub state: Result<(), NotServed>,
    /// `metadata.creationTimestamp`: the older network wins a conflict.
    created: Option<Timestamp>,
}

impl NodeNetwork {
    /// Whether it is served on this node now.
    #[must_use]
    pub fn is_served(&self) -> bool {
        self.state.is_ok()
    }

    /// Whether `parent` (an entry of `spec.parents`) names `interface`: by name, or by the
    /// PCI address of a real NIC function (a VLAN or macvlan on top of it shares the
    /// address but is not the device).
    fn names(parent: &str, interface: &HostInterface) -> bool {
        parent == interface.name
            || (interface.kind.is_none()
                && interface.hardware.pci.as_ref().is_some_and(|pci| {
                    parent.parse::<PciAddress>().is_ok_and(|wanted| wanted == pci.address)
                }))
    }

    /// The interfaces that carry this network for `parent`: the parent itself, or for
    /// `sriov-vf` on a PF, its VFs.
    fn targets<'a>(&self, parent: &str, interfaces: &'a [HostInterface]) -> Vec<&'a HostInterface> {
        let Some(found) = interfaces.iter().find(|i| Self::names(parent, i)) else {
            return Vec::new();
        };
        let pci = found.hardware.pci.as_ref();
        let is_vf = pci.is_some_and(|p| matches!(p.sriov, SriovRole::VirtualFunction { .. }));
        match (self.mode, pci) {
            (Mode::SriovVf, Some(pf)) if !is_vf => interfaces
                .iter()
                .filter(|i| {
                    i.hardware.pci.as_ref().is_some_and(|p| match &p.sriov {
                        SriovRole::VirtualFunction { pf_address, pf_name, .. } => {
                            *pf_address == pf.address || pf_name.as_deref() == Some(&found.name)
                        }
                        _ => false,
                    })
                })
                .collect(),
            _ => vec![found],
        }
    }
}

/// The PodNetworks of this driver, judged for this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeNetworks {
    /// Oldest first (creationTimestamp, then name).
    networks: Vec<NodeNetwork>,
}

impl NodeNetworks {
    /// Judges every PodNetwork of `driver` in `inputs` (unknown inputs count as no
    /// networks and no labels).
    #[must_use]
    pub fn evaluate(driver: &str, inputs: &NetworkInputs) -> Self {
        let no_labels = BTreeMap::new();
        let labels = inputs.node_labels.as_deref().unwrap_or(&no_labels);
        let mut networks: Vec<NodeNetwork> = inputs
            .pod_networks
            .iter()
            .flat_map(|all| all.iter())
            .filter(|(_, network)| network.spec.provider == driver)
            .map(|(name, network)| NodeNetwork {
                name: name.clone(),
                mode: network.spec.mode.unwrap_or(Mode::Macvlan),
                vlan: Some(network.spec.vlan).filter(|vlan| *vlan != 0),
                capacity: network.spec.interface_capacity,
                bandwidth: network.spec.bandwidth.as_ref().and_then(|b| b.parse().ok()),
                parents: network.spec.parents.clone(),
                state: serving(network, labels),
                created: network.metadata.creation_timestamp.as_ref().map(|time| time.0),
            })
            .collect();
        // Objects from the API always have a creation time; ones without (built in code)
        // count as the newest.
        networks.sort_by(|a, b| {
            (a.created.is_none(), a.created, &a.name).cmp(&(
                b.created.is_none(),
                b.created,
                &b.name,
            ))
        });
        Self { networks }
    }

    /// Every network of this driver, oldest first.
    #[must_use]
    pub fn all(&self) -> &[NodeNetwork] {
        &self.networks
    }

    /// The network `name`, if it is one of this driver's.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&NodeNetwork> {
        self.networks.iter().find(|n| n.name == name)
    }

    /// Whether a device kept published while its NIC sits in a pod (discovery cannot see
    /// it) may keep its `podNetwork` tag: the network is still served and still names the
    /// device (by interface name or PCI address, or its PF for `sriov-vf`).
    #[must_use]
    pub fn keeps_tag(&self, device: &Device) -> bool {
        let string = |name: &str| match device.attributes.get(&format!("{ATTRIBUTE_DOMAIN}/{name}"))
        {
            Some(AttributeValue::String(value)) => Some(value.as_str()),
            _ => None,
        };
        let Some(network) = string(attr::POD_NETWORK).and_then(|name| self.get(name)) else {
            return false;
        };
        let pci = string(attr::PCI_ADDRESS).and_then(|a| a.parse::<PciAddress>().ok());
        let pf = string(attr::PF_NAME).filter(|_| network.mode == Mode::SriovVf);
        network.is_served()
            && !is_shared_mode(network.mode)
            && network.parents.iter().any(|parent| {
                *parent == device.if_name
                    || pci.is_some_and(|pci| parent.parse::<PciAddress>().is_ok_and(|p| p == pci))
                    || pf.is_some_and(|pf| parent == pf)
            })
    }
}

/// A served shared-mode network on one parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedNetwork {
    /// The network.
    pub network: String,
    /// Its VLAN, `None` untagged.
    pub vlan: Option<u16>,
    /// Its `interfaceCapacity`.
    pub capacity: u32,
    /// Its `bandwidth`: the parent's bandwidth capacity where the link reports none.
    pub bandwidth: Option<crate::model::bandwidth::BitsPerSecond>,
}

/// Why two networks cannot both be published on one interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConflictKind {
    /// Both are shared networks with this VLAN (0: untagged) on one parent: their children
    /// would sit on one netdev, in one broadcast domain.
    SameVlan(u16),
    /// One of them takes the whole device (host-device, sriov-vf): a device carries one
    /// network.
    OneDevice,
}

/// Two networks that want one interface; only the older is published there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NetworkConflict {
    /// The host interface.
    pub if_name: String,
    /// The older network, published.
    pub kept: String,
    /// The newer network, not published on this interface.
    pub dropped: String,
    /// What they clash on.
    pub kind: ConflictKind,
}

impl fmt::Display for NetworkConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { if_name, kept, dropped, kind } = self;
        match kind {
            ConflictKind::SameVlan(0) => write!(
                f,
                "PodNetworks {kept} and {dropped} are both untagged on parent {if_name} (networks on one parent need distinct VLANs): only {kept}, the older, is published there"
            ),
            ConflictKind::SameVlan(vlan) => write!(
                f,
                "PodNetworks {kept} and {dropped} both use VLAN {vlan} on parent {if_name} (networks on one parent need distinct VLANs): only {kept}, the older, is published there"
            ),
            ConflictKind::OneDevice => write!(
                f,
                "PodNetworks {kept} and {dropped} both want device {if_name}, which can carry one network: only {kept}, the older, is published there"
            ),
        }
    }
}

/// A served network's parent that this node does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingParent {
    /// The network.
    pub network: String,
    /// The `spec.parents` entry.
    pub parent: String,
}

/// The served networks placed on this node's interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkPlan {
    /// Shared-mode networks published on each parent interface, oldest first.
    pub shared: BTreeMap<String, Vec<SharedNetwork>>,
    /// Exclusive devices tagged with a network, by interface name.
    pub exclusive: BTreeMap<String, String>,
    /// Parents of a shared-mode network that selects this node but is not served now
    /// (disabled, not ready, being deleted), by interface name: not published as exclusive
    /// devices, since its pods' children may still sit on them.
    pub reserved: BTreeMap<String, String>,
    /// What could not be published together, sorted.
    pub conflicts: Vec<NetworkConflict>,
    /// Parents of served networks not found on this node.
    pub missing: Vec<MissingParent>,
}

impl NetworkPlan {
    /// Places the served networks (oldest first, so the older one keeps what two want) on
    /// `interfaces`.
    #[must_use]
    pub fn resolve(networks: &NodeNetworks, interfaces: &[HostInterface]) -> Self {
        let mut plan = Self::default();
        for network in networks.all().iter().filter(|n| n.is_served()) {
            for parent in &network.parents {
                let targets = network.targets(parent, interfaces);
                if targets.is_empty() {
                    plan.missing.push(MissingParent {
                        network: network.name.clone(),
                        parent: parent.clone(),
                    });
                }
                for target in targets {
                    plan.place(network, &target.name);
                }
            }
        }
        for network in networks.all() {
            let reserves = match &network.state {
                Ok(()) => false,
                Err(why) => why.selects_node() && is_shared_mode(network.mode),
            };
            if !reserves {
                continue;
            }
            for parent in &network.parents {
                for target in network.targets(parent, interfaces) {
                    if !plan.shared.contains_key(&target.name)
                        && !plan.exclusive.contains_key(&target.name)
                    {
                        plan.reserved.entry(target.name.clone()).or_insert(network.name.clone());
                    }
                }
            }
        }
        plan.conflicts.sort();
        plan.conflicts.dedup();
        plan
    }

    fn place(&mut self, network: &NodeNetwork, if_name: &str) {
        let shared = self.shared.get(if_name).map(Vec::as_slice).unwrap_or_default();
        let holder = match (self.exclusive.get(if_name), is_shared_mode(network.mode)) {
            (Some(owner), _) => Some((owner.clone(), ConflictKind::OneDevice)),
            (None, true) => shared
                .iter()
                .find(|s| s.vlan == network.vlan)
                .map(|s| (s.network.clone(), ConflictKind::SameVlan(network.vlan.unwrap_or(0)))),
            (None, false) => shared.first().map(|s| (s.network.clone(), ConflictKind::OneDevice)),
        };
        match holder {
            // One network naming one device twice (by name and by PCI address).
            Some((owner, _)) if owner == network.name => {}
            Some((kept, kind)) => self.conflicts.push(NetworkConflict {
                if_name: if_name.to_owned(),
                kept,
                dropped: network.name.clone(),
                kind,
            }),
            None if is_shared_mode(network.mode) => {
                self.shared.entry(if_name.to_owned()).or_default().push(SharedNetwork {
                    network: network.name.clone(),
                    vlan: network.vlan,
                    capacity: network.capacity,
                    bandwidth: network.bandwidth,
                });
            }
            None => {
                self.exclusive.insert(if_name.to_owned(), network.name.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests;
