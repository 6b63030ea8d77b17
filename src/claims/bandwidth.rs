//! The egress ceiling of one allocated device (DESIGN §2, §3 `bandwidth`; issue 35): what the
//! allocation consumed of a shared parent's `netclaim.dev/bandwidth` capacity, the claim's
//! own `bandwidth.limit`, and the checks the scheduler cannot make, refused at prepare naming
//! the field. Pure.
//!
//! The scheduler keeps the sum of what allocations consume within each device's capacity.
//! It cannot see that two PodNetworks publish devices on one parent (each device has its own
//! capacity), nor a best-effort claim's config limit, nor that a slot device stands for a
//! shared parent; those are checked here.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::ClaimError;
use super::allocation::AllocatedResult;
use crate::model::bandwidth::{
    BANDWIDTH_CAPACITY, BitsPerSecond, IngressPolicy, ResolvedBandwidth,
};
use crate::model::network_config::{
    BandwidthRule, ConfigError, DeviceFacts, ResolvedNetworkConfig, Rule, Sharing,
};

/// The field a capacity request is written in, for messages.
pub const REQUEST_FIELD: &str = "capacity.requests[netclaim.dev/bandwidth]";

/// What the claim asked and the allocation consumed of `netclaim.dev/bandwidth` for one
/// result, as written (the text, so that a message can quote it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultBandwidth {
    /// `spec.devices.requests[].{exactly,firstAvailable[]}.capacity.requests` of the result's
    /// request.
    pub requested: Option<String>,
    /// `status.allocation.devices.results[].consumedCapacity`.
    pub consumed: Option<String>,
}

/// Reads [`ResultBandwidth`] of `result` from `claim`. A capacity name is read qualified
/// (as published, decision 0023) or unqualified (the driver's own domain, which Kubernetes
/// 1.38 accepts in claims).
#[must_use]
pub fn of_result(claim: &ResourceClaim, result: &DeviceRequestAllocationResult) -> ResultBandwidth {
    let consumed = pick(result.consumed_capacity.as_ref()).map(|q| q.0.clone());
    let (main, sub) = match result.request.split_once('/') {
        Some((main, sub)) => (main, Some(sub)),
        None => (result.request.as_str(), None),
    };
    let request = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.devices.as_ref())
        .and_then(|devices| devices.requests.as_ref())
        .and_then(|requests| requests.iter().find(|r| r.name == main));
    let capacity = request.and_then(|request| match sub {
        None => request.exactly.as_ref().and_then(|e| e.capacity.as_ref()),
        Some(sub) => request
            .first_available
            .as_ref()
            .and_then(|subs| subs.iter().find(|s| s.name == sub))
            .and_then(|s| s.capacity.as_ref()),
    });
    let requested = pick(capacity.and_then(|c| c.requests.as_ref())).map(|q| q.0.clone());
    ResultBandwidth { requested, consumed }
}

/// The bandwidth entry of a capacity map, qualified or not.
fn pick(map: Option<&BTreeMap<String, Quantity>>) -> Option<&Quantity> {
    let map = map?;
    let unqualified = BANDWIDTH_CAPACITY.rsplit_once('/').map_or(BANDWIDTH_CAPACITY, |(_, n)| n);
    map.get(BANDWIDTH_CAPACITY).or_else(|| map.get(unqualified))
}

/// What the node knows of a device's bandwidth at prepare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceBandwidth {
    /// The most any one device of this host interface publishes as `netclaim.dev/bandwidth`
    /// (shared parents), else the device's link speed (exclusive devices); `None`: unknown,
    /// nothing is refused for it.
    pub capacity: Option<BitsPerSecond>,
}

/// Completes `config.bandwidth` of `result` on `facts` with the allocation's consumed
/// capacity, and refuses what the node cannot honour: bandwidth on a slot device, a consumed
/// amount or a limit above the device's capacity, consumed amounts on one parent that add up
/// above it across networks (`on_parent`: what other devices on the same host interface
/// consumed, prepared or earlier in this claim), ingress policing without a ceiling.
pub fn complete(
    config: &mut ResolvedNetworkConfig,
    result: &AllocatedResult,
    facts: &DeviceFacts,
    device: DeviceBandwidth,
    on_parent: impl Iterator<Item = BitsPerSecond>,
) -> Result<(), ClaimError> {
    let refuse = |path: &str, value: String, rule: BandwidthRule| ClaimError::Config {
        request: result.request.clone(),
        device: result.device.clone(),
        source: Box::new(ConfigError::Invalid {
            path: path.to_owned(),
            value,
            rule: Rule::Bandwidth(rule),
        }),
    };
    let asked = &result.bandwidth;
    if facts.sharing == Sharing::Slot {
        if let Some(requested) = &asked.requested {
            return Err(refuse(REQUEST_FIELD, quoted(requested), BandwidthRule::SlotsMode));
        }
        // Validation already refused a `bandwidth` section on a slot device.
        return Ok(());
    }
    let consumed = match &asked.consumed {
        None => BitsPerSecond::ZERO,
        Some(text) => BitsPerSecond::parse(text)
            .map_err(|e| refuse(REQUEST_FIELD, quoted(text), BandwidthRule::Parse(e)))?,
    };
    if let Some(capacity) = device.capacity {
        let what = || match facts.sharing {
            Sharing::Exclusive => format!("link speed of {}", facts.if_name),
            _ => format!("{BANDWIDTH_CAPACITY} of parent {}", facts.if_name),
        };
        if consumed > capacity {
            let rule = BandwidthRule::AboveCapacity { capacity, what: what() };
            return Err(refuse(REQUEST_FIELD, consumed.to_string(), rule));
        }
        let others: u64 = on_parent.map(BitsPerSecond::get).fold(0, u64::saturating_add);
        if consumed > BitsPerSecond::ZERO && others.saturating_add(consumed.get()) > capacity.get()
        {
            let rule = BandwidthRule::AboveCapacity {
                capacity,
                what: format!(
                    "{} together with the {} already allocated on it (every network on a parent shares it)",
                    what(),
                    BitsPerSecond(others)
                ),
            };
            return Err(refuse(REQUEST_FIELD, consumed.to_string(), rule));
        }
        if let Some(limit) = config.bandwidth.and_then(|b| b.limit)
            && limit > capacity
        {
            let rule = BandwidthRule::AboveCapacity { capacity, what: what() };
            return Err(refuse("bandwidth.limit", limit.to_string(), rule));
        }
    }
    if consumed > BitsPerSecond::ZERO || config.bandwidth.is_some() {
        config.bandwidth = Some(config.bandwidth.unwrap_or_default().with_consumed(consumed));
    }
    if let Some(section) = config.bandwidth
        && section.ingress == IngressPolicy::Police
        && section.ceiling.is_none()
    {
        return Err(refuse(
            "bandwidth.ingress",
            "police".to_owned(),
            BandwidthRule::PoliceWithoutCeiling,
        ));
    }
    Ok(())
}

/// What a prepared device consumed of its parent's bandwidth (config limits are not
/// counted: the scheduler does not count them either).
#[must_use]
pub fn consumed(config: &ResolvedNetworkConfig) -> BitsPerSecond {
    config.bandwidth.and_then(|b: ResolvedBandwidth| b.consumed).unwrap_or_default()
}

fn quoted(text: &str) -> String {
    format!("{text:?}")
}

/// [`DeviceBandwidth`] of a resolved device: its parent's published bandwidth when shared,
/// else its link speed (the `speedMbps` attribute, read in either name form).
#[must_use]
pub fn device_bandwidth(
    facts: &DeviceFacts,
    parent_bandwidth: Option<BitsPerSecond>,
    attributes: &std::collections::BTreeMap<String, crate::model::device::AttributeValue>,
) -> DeviceBandwidth {
    use crate::model::device::AttributeValue;
    use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
    let capacity = match facts.sharing {
        Sharing::Shared | Sharing::Slot => parent_bandwidth,
        Sharing::Exclusive => attributes
            .get(&format!("{ATTRIBUTE_DOMAIN}/{}", attr::SPEED_MBPS))
            .or_else(|| attributes.get(attr::SPEED_MBPS))
            .and_then(|value| match value {
                AttributeValue::Int(mbps) => u64::try_from(*mbps).ok().filter(|m| *m > 0),
                _ => None,
            })
            .map(BitsPerSecond::from_mbps),
    };
    DeviceBandwidth { capacity }
}
