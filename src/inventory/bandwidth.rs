//! The `netclaim.dev/bandwidth` capacity of a shared parent (DESIGN §2, issue 35): which
//! value a parent publishes, and its request policy.
//!
//! Where the value comes from, first found wins:
//! 1. `--parent-bandwidth <if>=<quantity>`: the operator's word for this node's interface (a
//!    10G NIC behind a 1G uplink, a bond whose reported speed is not what it carries, or a
//!    stable value for a link that is down: sysfs `speed` reads -1 then, `ethtool_ops`
//!    answer `SPEED_UNKNOWN`, and a capacity that came and went with carrier would make
//!    the scheduler's view flap);
//! 2. the link's speed (sysfs `speed` in Mb/s; a veth reports 10000);
//! 3. the PodNetwork's `spec.bandwidth`, for the network's devices on a parent whose link
//!    reports none (a cluster-wide default for NICs that do not say).
//!
//! A parent with none of them publishes no bandwidth capacity. A claim that requests
//! bandwidth then cannot be allocated on it (the scheduler does not pick a device that lacks
//! a capacity the request names); a best-effort claim still can, and gets no ceiling unless
//! its config sets one. Publishing `0` instead would say the parent carries nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::bandwidth::{BANDWIDTH_STEP, BandwidthParseError, BitsPerSecond};

/// One `--parent-bandwidth <if>=<quantity>` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentBandwidth {
    /// The host interface (as in `--shared-parents`: a name or a PCI address).
    pub interface: String,
    /// Its bandwidth capacity.
    pub rate: BitsPerSecond,
}

/// A `--parent-bandwidth` entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParentBandwidthError {
    /// No `=`, or an empty side.
    #[error("expected <interface>=<quantity> (eth1=10G), got {0:?}")]
    Shape(String),
    /// The quantity is not a bandwidth.
    #[error("{interface}={value}: {source}")]
    Quantity {
        /// The interface.
        interface: String,
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: BandwidthParseError,
    },
    /// Zero: the parent would carry nothing.
    #[error("{0}=0: a parent's bandwidth must be above 0 (leave it out when unknown)")]
    Zero(String),
}

impl FromStr for ParentBandwidth {
    type Err = ParentBandwidthError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let shape = || ParentBandwidthError::Shape(text.to_owned());
        let (interface, value) = text.split_once('=').ok_or_else(shape)?;
        let (interface, value) = (interface.trim(), value.trim());
        if interface.is_empty() || value.is_empty() {
            return Err(shape());
        }
        let rate =
            BitsPerSecond::parse(value).map_err(|source| ParentBandwidthError::Quantity {
                interface: interface.to_owned(),
                value: value.to_owned(),
                source,
            })?;
        if rate == BitsPerSecond::ZERO {
            return Err(ParentBandwidthError::Zero(interface.to_owned()));
        }
        Ok(Self { interface: interface.to_owned(), rate })
    }
}

impl fmt::Display for ParentBandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.interface, self.rate)
    }
}

/// The bandwidth a parent publishes: `flag` (its `--parent-bandwidth`), else the link's
/// `speed_mbps`, else `network` (a PodNetwork's `spec.bandwidth`); see the module docs.
#[must_use]
pub fn parent_bandwidth(
    flag: Option<BitsPerSecond>,
    speed_mbps: Option<u32>,
    network: Option<BitsPerSecond>,
) -> Option<BitsPerSecond> {
    let speed =
        speed_mbps.filter(|mbps| *mbps > 0).map(|mbps| BitsPerSecond::from_mbps(mbps.into()));
    flag.or(speed).or(network).filter(|rate| *rate > BitsPerSecond::ZERO)
}

/// The published capacity: the value, and the request policy `{default: 0, validRange:
/// {min: 0, step: 1M}}`. A claim that names no amount consumes nothing (a best-effort
/// claim, no ceiling); a request is rounded up to whole Mb/s, the unit links report and VFs
/// are set in. The default must not be below `min`, or the API server refuses the whole
/// slice (KEP-5075 validation); there is no `max` beyond the value itself.
#[must_use]
pub fn capacity(rate: BitsPerSecond) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(rate.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("0".to_owned())),
            valid_values: None,
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("0".to_owned()),
                max: None,
                step: Some(Quantity(BANDWIDTH_STEP.to_string())),
            }),
        }),
    }
}

/// The value of a published bandwidth capacity read back from a slice.
#[must_use]
pub fn from_capacity(capacities: &BTreeMap<String, DeviceCapacity>) -> Option<BitsPerSecond> {
    let capacity = capacities.get(crate::model::bandwidth::BANDWIDTH_CAPACITY)?;
    BitsPerSecond::parse(&capacity.value.0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_entries_parse_and_bad_ones_name_the_fault() {
        let entry: ParentBandwidth = "eth1=10G".parse().unwrap();
        assert_eq!(
            entry,
            ParentBandwidth { interface: "eth1".into(), rate: BitsPerSecond(10_000_000_000) }
        );
        assert_eq!(entry.to_string(), "eth1=10G");
        let pci: ParentBandwidth = "0000:3b:00.1=25G".parse().unwrap();
        assert_eq!(pci.interface, "0000:3b:00.1");
        assert_eq!(
            "eth1".parse::<ParentBandwidth>(),
            Err(ParentBandwidthError::Shape("eth1".into()))
        );
        assert_eq!(
            "=1G".parse::<ParentBandwidth>(),
            Err(ParentBandwidthError::Shape("=1G".into()))
        );
        assert_eq!(
            "eth1=0".parse::<ParentBandwidth>(),
            Err(ParentBandwidthError::Zero("eth1".into()))
        );
        let err = "eth1=fast".parse::<ParentBandwidth>().unwrap_err();
        assert!(err.to_string().starts_with("eth1=fast: not a quantity"), "{err}");
    }

    #[test]
    fn the_flag_wins_then_the_link_speed_then_the_network() {
        let g = |n: u64| BitsPerSecond(n * 1_000_000_000);
        assert_eq!(parent_bandwidth(Some(g(1)), Some(10_000), Some(g(5))), Some(g(1)));
        assert_eq!(parent_bandwidth(None, Some(10_000), Some(g(5))), Some(g(10)));
        assert_eq!(parent_bandwidth(None, None, Some(g(5))), Some(g(5)));
        assert_eq!(parent_bandwidth(None, Some(0), Some(g(5))), Some(g(5)), "0 Mb/s is unknown");
        assert_eq!(parent_bandwidth(None, None, None), None);
    }

    #[test]
    fn the_capacity_carries_the_request_policy_and_reads_back() {
        let published = capacity(BitsPerSecond(10_000_000_000));
        assert_eq!(
            serde_json::to_value(&published).unwrap(),
            serde_json::json!({"value": "10G", "requestPolicy": {
                "default": "0", "validRange": {"min": "0", "step": "1M"}}})
        );
        let map = BTreeMap::from([("netclaim.dev/bandwidth".to_owned(), published)]);
        assert_eq!(from_capacity(&map), Some(BitsPerSecond(10_000_000_000)));
    }

    // The inventory as a node publishes it: which devices carry the capacity, with what.
    mod published {
        use std::sync::Arc;

        use serde_json::json;

        use super::super::super::networks::{NetworkInputs, NodeNetworks};
        use super::super::super::slices::api_device;
        use super::super::super::{Inventory, Selection, SharingMode};
        use super::*;
        use crate::model::device::{Device, HostInterface, LinkKind, Sharing};
        use crate::model::pod_network::PodNetwork;

        const BANDWIDTH: &str = "netclaim.dev/bandwidth";

        fn veth(name: &str, speed_mbps: Option<u32>) -> HostInterface {
            let mut interface = HostInterface::new(7, name, 1500);
            interface.kind = Some(LinkKind::Veth);
            interface.hardware.speed_mbps = speed_mbps;
            interface
        }

        fn selection(mode: SharingMode, flags: &[&str]) -> Selection {
            let entries: Vec<ParentBandwidth> = flags.iter().map(|f| f.parse().unwrap()).collect();
            Selection::new(&[], &[], &["eth1".to_owned()], mode)
                .unwrap()
                .with_parent_bandwidth(&entries)
        }

        /// A served (Ready) macvlan network on eth1 with `spec`.
        fn networks(spec: serde_json::Value) -> NodeNetworks {
            let mut spec = spec;
            spec["parents"] = json!(["eth1"]);
            let network: PodNetwork = serde_json::from_value(json!({
                "metadata": {"name": "medianet"},
                "spec": spec,
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))
            .unwrap();
            let inputs = NetworkInputs {
                pod_networks: Some(Arc::new([("medianet".to_owned(), network)].into())),
                node_labels: Some(Arc::new(BTreeMap::new())),
            };
            NodeNetworks::evaluate("netclaim.dev", &inputs)
        }

        /// The bandwidth capacity of the published devices of eth1, as the slice carries it.
        fn published(inventory: &Inventory) -> Vec<(Sharing, Option<serde_json::Value>)> {
            inventory
                .devices
                .iter()
                .filter(|d: &&Device| d.if_name == "eth1")
                .map(|d| {
                    let api = api_device(d, "netclaim.dev");
                    let capacity = api.capacity.as_ref().and_then(|c| c.get(BANDWIDTH));
                    (d.sharing, capacity.map(|c| serde_json::to_value(c).unwrap()))
                })
                .collect()
        }

        fn policy(value: &str) -> serde_json::Value {
            json!({"value": value, "requestPolicy": {"default": "0",
                "validRange": {"min": "0", "step": "1M"}}})
        }

        #[test]
        fn a_shared_parent_publishes_its_link_speed_a_veth_10g() {
            let inventory = Inventory::build(
                &[veth("eth1", Some(10_000))],
                &selection(SharingMode::Capacity, &[]),
            );
            assert_eq!(published(&inventory), [(Sharing::Shared, Some(policy("10G")))]);
            let api = api_device(&inventory.devices[0], "netclaim.dev");
            assert!(
                api.capacity.unwrap().contains_key("netclaim.dev/interfaces"),
                "the interfaces capacity stays beside it"
            );
        }

        #[test]
        fn the_flag_wins_over_the_link_speed_and_names_by_interface() {
            let flags = ["eth2=5G", "eth1=2500M"];
            let inventory = Inventory::build(
                &[veth("eth1", Some(10_000))],
                &selection(SharingMode::Capacity, &flags),
            );
            assert_eq!(published(&inventory), [(Sharing::Shared, Some(policy("2500M")))]);
        }

        #[test]
        fn an_unknown_bandwidth_publishes_no_capacity_and_slots_never_do() {
            let unknown =
                Inventory::build(&[veth("eth1", None)], &selection(SharingMode::Capacity, &[]));
            assert_eq!(published(&unknown), [(Sharing::Shared, None)]);
            let slots = Inventory::build(
                &[veth("eth1", Some(10_000))],
                &selection(SharingMode::Slots, &["eth1=1G"]),
            );
            let found = published(&slots);
            assert!(found.len() > 1, "{found:?}");
            assert!(
                found
                    .iter()
                    .all(|(sharing, capacity)| *sharing == Sharing::Slot && capacity.is_none()),
                "{found:?}"
            );
        }

        #[test]
        fn a_network_device_takes_the_networks_bandwidth_only_where_the_link_reports_none() {
            let networks = networks(json!({"bandwidth": "4G"}));
            let select = selection(SharingMode::Capacity, &[]);
            let silent = Inventory::build_with(&[veth("eth1", None)], &select, &networks);
            assert_eq!(published(&silent), [(Sharing::Shared, Some(policy("4G")))]);
            let speaking = Inventory::build_with(&[veth("eth1", Some(10_000))], &select, &networks);
            assert_eq!(published(&speaking), [(Sharing::Shared, Some(policy("10G")))]);
            let flagged = Inventory::build_with(
                &[veth("eth1", Some(10_000))],
                &selection(SharingMode::Capacity, &["eth1=1G"]),
                &networks,
            );
            assert_eq!(published(&flagged), [(Sharing::Shared, Some(policy("1G")))]);
        }

        #[test]
        fn a_published_shared_device_reads_back_with_its_bandwidth() {
            let inventory = Inventory::build(
                &[veth("eth1", Some(10_000))],
                &selection(SharingMode::Capacity, &[]),
            );
            let api = api_device(&inventory.devices[0], "netclaim.dev");
            let back =
                super::super::super::slices::shared_device_from_api(&api, "netclaim.dev").unwrap();
            assert_eq!(back, inventory.devices[0]);
        }
    }
}
