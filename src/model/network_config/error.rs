//! Why a config was rejected: the error naming the field path and the offending value, and the
//! rule the value broke.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::{API_VERSION, DeviceKind, KIND, Mode, Sharing};

/// Which rule a value broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    /// The mode cannot be used on this device.
    #[error("mode not allowed on this device ({sharing}, {kind}; allowed: {allowed})")]
    ModeNotAllowed {
        /// Device sharing.
        sharing: Sharing,
        /// Device type.
        kind: DeviceKind,
        /// The allowed modes, comma separated.
        allowed: String,
    },
    /// A mode-specific section used with another mode.
    #[error("only allowed with mode {needs}, but the mode is {mode}")]
    SectionNeedsMode {
        /// The mode the section belongs to.
        needs: Mode,
        /// The resolved mode.
        mode: Mode,
    },
    /// A required field is missing.
    #[error("required")]
    Missing,
    /// Invalid interface name.
    #[error("invalid interface name: {0}")]
    InterfaceName(&'static str),
    /// MTU out of the allowed range.
    #[error("MTU outside {min}..={max} ({why})")]
    MtuOutOfRange {
        /// Lowest allowed.
        min: u32,
        /// Highest allowed.
        max: u32,
        /// Where the limits come from.
        why: &'static str,
    },
    /// IPv6 needs MTU >= 1280 (RFC 8200 §5; the kernel removes IPv6 from smaller links).
    #[error("an IPv6 address needs an MTU of at least 1280")]
    MtuTooSmallForIpv6,
    /// macvlan passthru takes over the whole parent.
    #[error(
        "passthru allows one child per parent, and no other child next to it \
         (parent has {passthru_children} passthru and {other_children} other children)"
    )]
    Passthru {
        /// Existing passthru children.
        passthru_children: u32,
        /// Existing other children.
        other_children: u32,
    },
    /// The node cannot attach this mode (its kernel lacks the link kind, or this build does
    /// not implement the attach yet): refused at prepare, never at sandbox time.
    #[error("not available on this node: {0}")]
    ModeUnavailable(String),
    /// Mode `vfio` hands the PCI function to a userspace driver: no interface in the pod.
    #[error("not with mode vfio: {0}")]
    NotWithVfio(&'static str),
    /// The node cannot create VLAN sub-interfaces (no 8021q in its kernel).
    #[error("not available on this node: {0}")]
    VlanUnavailable(String),
    /// A parent carries one kind of child: macvlan and ipvlan each take the parent's one
    /// receive handler (`netdev_rx_handler_register` answers `EBUSY` to the second kind).
    #[error(
        "a parent carries one kind of child, and this one already has {count} {existing} \
         children"
    )]
    ChildKindMix {
        /// The kind already on the parent.
        existing: Mode,
        /// How many of them.
        count: u32,
    },
    /// ipvlan children share the parent's MAC address.
    #[error("not allowed with ipvlan (ipvlan children share the parent's MAC address)")]
    HardwareAddressWithIpvlan,
    /// Invalid MAC address.
    #[error("invalid MAC address: {0}")]
    MacAddress(&'static str),
    /// Not an address in CIDR form.
    #[error("invalid CIDR: {0}")]
    Cidr(String),
    /// Not an IP address.
    #[error("invalid IP address: {0}")]
    IpAddress(String),
    /// An address that cannot be given to an interface.
    #[error("address not usable on an interface: {0}")]
    AddressNotUsable(&'static str),
    /// The same address twice.
    #[error("duplicate address")]
    DuplicateAddress,
    /// More addresses than the claim status can report.
    #[error("more than {max} addresses (the limit of networkData.ips)")]
    TooManyAddresses {
        /// The limit.
        max: usize,
    },
    /// Static addresses and a pool in one config.
    #[error("static addresses and a pool are mutually exclusive")]
    AddressesAndPool,
    /// A network with host bits set.
    #[error("host bits set, the network is {network}")]
    NotANetwork {
        /// The network form.
        network: IpNetwork,
    },
    /// An address outside its subnet.
    #[error("not inside {subnet}")]
    NotInSubnet {
        /// The subnet.
        subnet: IpNetwork,
    },
    /// rangeStart after rangeEnd.
    #[error("range start is after the range end {end}")]
    RangeReversed {
        /// The range end.
        end: IpAddr,
    },
    /// Mixed IPv4 and IPv6.
    #[error("address family differs from {other}")]
    FamilyMismatch {
        /// What it was compared with.
        other: String,
    },
    /// A gateway outside every connected subnet.
    #[error("gateway not inside a subnet of the interface ({connected})")]
    GatewayNotConnected {
        /// The connected subnets, comma separated (or "none").
        connected: String,
    },
    /// A default route without a metric would collide with the pod's primary default route.
    #[error(
        "a default route needs a metric > 0 (the pod's primary network already has a \
         default route)"
    )]
    DefaultRouteNeedsMetric,
    /// The same destination and metric twice.
    #[error("duplicate route (same destination and metric as routes[{index}])")]
    DuplicateRoute {
        /// The earlier route.
        index: usize,
    },
    /// More routes than an interface takes.
    #[error("more than {max} routes")]
    TooManyRoutes {
        /// The limit.
        max: usize,
    },
    /// VLAN id out of 1..=4094 (802.1Q reserves 0 and 4095).
    #[error("VLAN id outside 1..=4094")]
    VlanOutOfRange,
    /// VLAN only on shared parents (macvlan/ipvlan) and VFs.
    #[error("VLAN not supported with mode {mode} (only macvlan, ipvlan or sriov-vf)")]
    VlanNotForMode {
        /// The resolved mode.
        mode: Mode,
    },
    /// A number out of range.
    #[error("outside {min}..={max}")]
    OutOfRange {
        /// Lowest allowed.
        min: u64,
        /// Highest allowed.
        max: u64,
    },
    /// Minimum rate above maximum rate.
    #[error("above maxTxRateMbps {max}")]
    MinRateAboveMax {
        /// The maximum rate.
        max: u32,
    },
    /// Not a DNS label (a Kubernetes object name).
    #[error("not a DNS label (lowercase alphanumerics and '-', at most 63)")]
    DnsLabel,
    /// A node-local pool in a config whose `PodNetwork` assigns the addresses.
    #[error(
        "not allowed with podNetwork {pod_network}, which assigns addresses from its subnets \
         (static addresses inside its ipam.staticRanges go in ipam.addresses)"
    )]
    PoolWithPodNetwork {
        /// The network.
        pod_network: String,
    },
    /// A static address of a `PodNetwork` claim outside the network's `staticRanges` (the
    /// only part of the network never carved into blocks, so no node hands it out from one).
    #[error(
        "not inside podNetwork {pod_network}'s ipam.staticRanges ({ranges}): a PodNetwork's \
         static addresses come only from there"
    )]
    NotInStaticRanges {
        /// The network.
        pod_network: String,
        /// Its static ranges, comma separated (or "none").
        ranges: String,
    },
    /// A static address no claim may hold: a subnet's network or broadcast address (IPv4), its
    /// subnet-router anycast address (IPv6), or a gateway of the network.
    #[error("{what} of podNetwork {pod_network}, which no claim may hold")]
    ReservedInNetwork {
        /// The network.
        pod_network: String,
        /// `the gateway spec.ipam.gateways[0]`, `the broadcast address of 10.10.0.0/16`.
        what: String,
    },
    /// The named `PodNetwork` cannot serve claims (missing, being deleted, invalid, ...).
    #[error("{0}")]
    PodNetworkUnusable(String),
    /// A `routing` or `vrf` value refused (`super::routing`).
    #[error("{0}")]
    Routing(super::RoutingRefusal),
    /// A `sysctls` key or value refused (`super::sysctls`).
    #[error("{0}")]
    Sysctl(super::SysctlRefusal),
    /// A `bandwidth` value the driver cannot honour (`model::network_config::BandwidthRule`).
    #[error("{0}")]
    Bandwidth(super::BandwidthRule),
    /// An `rdma` value the device or the node cannot honour (`super::rdma`).
    #[error("{0}")]
    Rdma(super::RdmaRefusal),
    /// An `ethtool` value refused before the device is asked (`super::ethtool`).
    #[error("{0}")]
    Ethtool(super::EthtoolRefusal),
    /// The `PodNetwork`'s own spec is invalid where the claim inherits from it.
    #[error("PodNetwork {pod_network}: {field}: {why}")]
    PodNetworkInvalid {
        /// The network.
        pod_network: String,
        /// The field of the network (`spec.ipam.subnets[0]`).
        field: String,
        /// What is wrong.
        why: String,
    },
}

/// Why a config was rejected; every variant names the field and the offending value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `parameters` is larger than the API server accepts for opaque device configuration
    /// (resource.k8s.io `OpaqueParametersMaxLength`): bounded work under the state lock.
    #[error("config entry {entry}: parameters: {value}, more than the {max} bytes allowed")]
    TooLarge {
        /// Index of the entry.
        entry: usize,
        /// Its encoded size (`12000 bytes`).
        value: String,
        /// The limit.
        max: usize,
    },
    /// `parameters` is not a JSON object.
    #[error("config entry {entry}: parameters: {value}: not a JSON object")]
    NotAnObject {
        /// Index of the entry in the allocation's config list.
        entry: usize,
        /// The value (JSON).
        value: String,
    },
    /// Missing or unsupported `apiVersion`.
    #[error("config entry {entry}: apiVersion: {value}: expected {API_VERSION}")]
    ApiVersion {
        /// Index of the entry.
        entry: usize,
        /// The value (JSON), `<missing>` when absent.
        value: String,
    },
    /// Missing or unsupported `kind`.
    #[error("config entry {entry}: kind: {value}: expected {KIND}")]
    Kind {
        /// Index of the entry.
        entry: usize,
        /// The value (JSON), `<missing>` when absent.
        value: String,
    },
    /// Strict decoding failed: unknown field, wrong type, unknown enum value.
    #[error("config entry {entry}: {path}: {value}: {source}")]
    Decode {
        /// Index of the entry.
        entry: usize,
        /// Field path (`interface.mtu`).
        path: String,
        /// The offending value (JSON), `<missing>` when absent.
        value: String,
        /// The decoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// The merged config breaks a rule.
    #[error("{path}: {value}: {rule}")]
    Invalid {
        /// Field path (`routes[1].gateway`).
        path: String,
        /// The offending value.
        value: String,
        /// The rule.
        rule: Rule,
    },
}

impl ConfigError {
    /// The field path the error is about.
    #[must_use]
    pub fn path(&self) -> &str {
        match self {
            ConfigError::NotAnObject { .. } | ConfigError::TooLarge { .. } => "parameters",
            ConfigError::ApiVersion { .. } => "apiVersion",
            ConfigError::Kind { .. } => "kind",
            ConfigError::Decode { path, .. } | ConfigError::Invalid { path, .. } => path,
        }
    }

    /// The offending value.
    #[must_use]
    pub fn value(&self) -> &str {
        match self {
            ConfigError::NotAnObject { value, .. }
            | ConfigError::TooLarge { value, .. }
            | ConfigError::ApiVersion { value, .. }
            | ConfigError::Kind { value, .. }
            | ConfigError::Decode { value, .. }
            | ConfigError::Invalid { value, .. } => value,
        }
    }

    /// The broken rule, for errors found after decoding.
    #[must_use]
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            ConfigError::Invalid { rule, .. } => Some(rule),
            _ => None,
        }
    }
}
