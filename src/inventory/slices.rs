//! Devices → `resource.k8s.io/v1` ResourceSlices of one pool (pool = node name).
//!
//! A pool may span several slices (at most 128 devices each); every slice of one generation
//! carries the same `generation` and `resourceSliceCount`, which is how consumers tell a
//! complete pool from a half-written one.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Device as ApiDevice, DeviceAttribute, DeviceCapacity, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::naming;
use crate::model::bandwidth::BANDWIDTH_CAPACITY;
use crate::model::device::{AttributeValue, Device, DeviceKind, Sharing};
use crate::model::names::{
    ATTRIBUTE_DOMAIN, CAPACITY_INTERFACES, MAX_DEVICES_PER_SLICE, attr, published_name,
    qualified_name,
};

/// Identity of the pool a node publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolIdentity {
    /// DRA driver name.
    pub driver: String,
    /// Node name, also the pool name.
    pub node: String,
    /// Pool generation.
    pub generation: i64,
}

/// Deterministic name of slice `index` of a node's pool: `<node>-<driver>-<index>` with dots
/// turned into dashes, as one DNS label (a long node name is cut and hashed; the index stays
/// readable at the end).
#[must_use]
pub fn slice_name(pool: &PoolIdentity, index: usize) -> String {
    let suffix = format!("-{index}");
    let prefix = format!("{}-{}", pool.node, pool.driver).replace('.', "-");
    let prefix = naming::fit_label(&prefix, naming::MAX_LABEL_LEN - suffix.len());
    format!("{prefix}{suffix}")
}

/// Builds the pool's slices: devices sorted by name, split at 128.
///
/// An empty inventory still yields one empty slice, so consumers see the pool (and its
/// generation) and know this node has nothing to offer rather than nothing published yet.
#[must_use]
pub fn build_slices(pool: &PoolIdentity, devices: &[Device]) -> Vec<ResourceSlice> {
    let mut sorted: Vec<&Device> = devices.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let chunks: Vec<&[&Device]> =
        if sorted.is_empty() { vec![&[]] } else { sorted.chunks(MAX_DEVICES_PER_SLICE).collect() };
    // A node has at most a few thousand interfaces; the count always fits.
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| ResourceSlice {
            metadata: ObjectMeta { name: Some(slice_name(pool, index)), ..ObjectMeta::default() },
            spec: ResourceSliceSpec {
                driver: pool.driver.clone(),
                node_name: Some(pool.node.clone()),
                pool: ResourcePool {
                    name: pool.node.clone(),
                    generation: pool.generation,
                    resource_slice_count: count,
                },
                devices: Some(
                    chunk.iter().map(|device| api_device(device, &pool.driver)).collect(),
                ),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

/// One device in API form, as a slice of `driver` carries it: attributes in the driver's own
/// domain unqualified (`ifName`), others qualified (`resource.kubernetes.io/pcieRoot`), the
/// capacity qualified (`netclaim.dev/interfaces`; decision 0023).
#[must_use]
pub fn api_device(device: &Device, driver: &str) -> ApiDevice {
    let attributes: BTreeMap<String, DeviceAttribute> = device
        .attributes
        .iter()
        .map(|(key, value)| (published_name(key, driver).to_owned(), api_attribute(value)))
        .collect();
    let (allow_multiple_allocations, capacity) = match (device.sharing, device.shared_capacity) {
        (Sharing::Shared, Some(capacity)) => (
            Some(true),
            Some(BTreeMap::from([(
                CAPACITY_INTERFACES.to_owned(),
                DeviceCapacity {
                    value: Quantity(capacity.to_string()),
                    // One allocation is one sub-interface: a request that names no amount
                    // consumes 1, and no other amount is accepted, so a claim can neither take
                    // 0 (unbounded sharing) nor reserve slots it will not use.
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(Quantity("1".to_owned())),
                        valid_values: Some(vec![Quantity("1".to_owned())]),
                        valid_range: None,
                    }),
                },
            )])),
        ),
        _ => (None, None),
    };
    // The second capacity of a shared parent, when its bandwidth is known (`inventory::bandwidth`).
    let capacity = capacity.map(|mut capacities| {
        if let Some(rate) = device.bandwidth {
            capacities.insert(BANDWIDTH_CAPACITY.to_owned(), super::bandwidth::capacity(rate));
        }
        capacities
    });
    ApiDevice {
        name: device.name.clone(),
        attributes: Some(attributes),
        allow_multiple_allocations,
        capacity,
        ..ApiDevice::default()
    }
}

/// An exclusive device read back from a published slice, for keeping a NIC published while
/// it sits in a pod across a daemon restart (discovery cannot see it in the host netns, and
/// the publisher has no earlier publication of its own). `None` for shared or slot devices
/// (they never move) and for devices without our `ifName` and `type` attributes. Attribute
/// names are read in both forms (unqualified as this release writes them in the driver's own
/// domain, qualified as earlier releases did) and keyed fully qualified, as the inventory
/// keys them.
#[must_use]
pub fn exclusive_device_from_api(device: &ApiDevice, driver: &str) -> Option<Device> {
    if device.allow_multiple_allocations == Some(true) || device.capacity.is_some() {
        return None;
    }
    let attributes = read_attributes(device, driver)?;
    let string = |name: &str| string_attribute(&attributes, name);
    let kind = match device_kind(&string(attr::TYPE)?)? {
        // Bonds and VLANs are only ever shared parents; a slot device names its parent.
        DeviceKind::Bond | DeviceKind::Vlan => return None,
        kind => kind,
    };
    // Slot devices are exclusive in the API but stand for a shared parent.
    if string(attr::SHARING).as_deref() != Some("exclusive") {
        return None;
    }
    Some(Device {
        name: device.name.clone(),
        if_name: string(attr::IF_NAME)?,
        kind,
        sharing: Sharing::Exclusive,
        shared_capacity: None,
        bandwidth: None,
        slot_index: None,
        attributes,
    })
}

/// A shared device (`allowMultipleAllocations` with our `interfaces` capacity) read back
/// from a published slice: what the node published before a restart, so a change of sharing
/// mode made across the restart can wait while claims prepared on it exist. `None` for
/// other devices. Attribute names are read in both forms, like
/// [`exclusive_device_from_api`].
#[must_use]
pub fn shared_device_from_api(device: &ApiDevice, driver: &str) -> Option<Device> {
    if device.allow_multiple_allocations != Some(true) {
        return None;
    }
    let capacities = device.capacity.as_ref()?;
    let capacity = capacities.get(CAPACITY_INTERFACES)?.value.0.parse().ok()?;
    let bandwidth = super::bandwidth::from_capacity(capacities);
    let attributes = read_attributes(device, driver)?;
    let string = |name: &str| string_attribute(&attributes, name);
    Some(Device {
        name: device.name.clone(),
        if_name: string(attr::IF_NAME)?,
        kind: device_kind(&string(attr::TYPE)?)?,
        sharing: Sharing::Shared,
        shared_capacity: Some(capacity),
        bandwidth,
        slot_index: None,
        attributes,
    })
}

/// The attributes of an API device keyed fully qualified (see [`qualified_name`]); values
/// of other types than string, int and bool are left out.
fn read_attributes(device: &ApiDevice, driver: &str) -> Option<BTreeMap<String, AttributeValue>> {
    let attributes = device
        .attributes
        .as_ref()?
        .iter()
        .filter_map(|(key, value)| {
            let value = match (&value.string, value.int, value.bool) {
                (Some(text), None, None) => AttributeValue::String(text.clone()),
                (None, Some(number), None) => AttributeValue::Int(number),
                (None, None, Some(flag)) => AttributeValue::Bool(flag),
                _ => return None,
            };
            Some((qualified_name(key, driver), value))
        })
        .collect();
    Some(attributes)
}

fn string_attribute(attributes: &BTreeMap<String, AttributeValue>, name: &str) -> Option<String> {
    match attributes.get(&format!("{ATTRIBUTE_DOMAIN}/{name}")) {
        Some(AttributeValue::String(text)) => Some(text.clone()),
        _ => None,
    }
}

/// The device type from its `type` attribute.
fn device_kind(text: &str) -> Option<DeviceKind> {
    [
        DeviceKind::Physical,
        DeviceKind::SriovPf,
        DeviceKind::SriovVf,
        DeviceKind::Virtual,
        DeviceKind::Bond,
        DeviceKind::Vlan,
    ]
    .into_iter()
    .find(|kind| kind.as_str() == text)
}

fn api_attribute(value: &AttributeValue) -> DeviceAttribute {
    match value {
        AttributeValue::String(text) => {
            DeviceAttribute { string: Some(text.clone()), ..DeviceAttribute::default() }
        }
        AttributeValue::Int(number) => {
            DeviceAttribute { int: Some(*number), ..DeviceAttribute::default() }
        }
        AttributeValue::Bool(flag) => {
            DeviceAttribute { bool: Some(*flag), ..DeviceAttribute::default() }
        }
    }
}
