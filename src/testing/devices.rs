//! A fixed device inventory behind the [`DeviceSource`] port: the devices a test names, with
//! their facts, attributes and parent limits, instead of the host's discovery.

use std::collections::BTreeMap;

use crate::claims::{DeviceSource, LookupError};
use crate::model::bandwidth::BitsPerSecond;
use crate::model::device::AttributeValue;
use crate::model::network_config::DeviceFacts;

/// One device of a [`FixedDevices`].
#[derive(Debug, Clone)]
struct Device {
    facts: DeviceFacts,
    attributes: BTreeMap<String, AttributeValue>,
}

/// Devices by name, each with its facts and published attributes; a name not listed is
/// [`LookupError::NotFound`], or the [`FixedDevices::any`] device when one is given.
#[derive(Debug, Clone, Default)]
pub struct FixedDevices {
    devices: BTreeMap<String, Device>,
    any: Option<Device>,
    parent_limits: BTreeMap<String, u32>,
    parent_bandwidth: BTreeMap<String, BitsPerSecond>,
}

impl FixedDevices {
    /// No devices yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Every name is one device with `facts` and `attributes` (a node where whatever the
    /// allocator picked is the same parent).
    #[must_use]
    pub fn any(facts: DeviceFacts, attributes: BTreeMap<String, AttributeValue>) -> Self {
        FixedDevices { any: Some(Device { facts, attributes }), ..Self::default() }
    }

    /// Adds device `name` with `facts`, published with `attributes`.
    #[must_use]
    pub fn device(
        mut self,
        name: &str,
        facts: DeviceFacts,
        attributes: BTreeMap<String, AttributeValue>,
    ) -> Self {
        self.devices.insert(name.to_owned(), Device { facts, attributes });
        self
    }

    /// Host interface `if_name` may carry at most `limit` sub-interfaces
    /// ([`DeviceSource::parent_limit`]; unlisted: no limit).
    #[must_use]
    pub fn parent_limit(mut self, if_name: &str, limit: u32) -> Self {
        self.parent_limits.insert(if_name.to_owned(), limit);
        self
    }

    /// Host interface `if_name` publishes `rate` as `netclaim.dev/bandwidth`
    /// ([`DeviceSource::parent_bandwidth`]; unlisted: none).
    #[must_use]
    pub fn parent_bandwidth(mut self, if_name: &str, rate: BitsPerSecond) -> Self {
        self.parent_bandwidth.insert(if_name.to_owned(), rate);
        self
    }

    fn find(&self, name: &str) -> Result<&Device, LookupError> {
        self.devices
            .get(name)
            .or(self.any.as_ref())
            .ok_or_else(|| LookupError::NotFound(name.to_owned()))
    }
}

/// The attributes of a plain device: its `netclaim.dev/ifName`.
#[must_use]
pub fn if_name_attribute(if_name: &str) -> BTreeMap<String, AttributeValue> {
    [("netclaim.dev/ifName".to_owned(), AttributeValue::String(if_name.to_owned()))].into()
}

impl DeviceSource for FixedDevices {
    async fn facts(&self, name: &str) -> Result<DeviceFacts, LookupError> {
        Ok(self.find(name)?.facts.clone())
    }

    async fn attributes(
        &self,
        name: &str,
    ) -> Result<BTreeMap<String, AttributeValue>, LookupError> {
        Ok(self.find(name)?.attributes.clone())
    }

    async fn parent_limit(&self, if_name: &str) -> Result<Option<u32>, LookupError> {
        Ok(self.parent_limits.get(if_name).copied())
    }

    async fn parent_bandwidth(&self, if_name: &str) -> Result<Option<BitsPerSecond>, LookupError> {
        Ok(self.parent_bandwidth.get(if_name).copied())
    }
}
