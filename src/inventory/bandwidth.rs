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
}
