//! `data.ethtool` of a claim's status (DESIGN §3 `ethtool`): the offload features, ring sizes
//! and channel counts the prepare applied to an exclusive device, as the claim asked for them
//! (the prepare fails when the device does not take them, so what is recorded is what the
//! device has).

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::status::DeviceKey;
use crate::model::network_config::EthtoolSettings;

/// The field of `data` it goes in.
const ETHTOOL_FIELD: &str = "ethtool";

/// Adds `data.ethtool` to the entry of each device in `applied`.
pub(super) fn annotate(
    entries: &mut [AllocatedDeviceStatus],
    applied: &[(DeviceKey, EthtoolSettings)],
) {
    for (key, settings) in applied {
        let entry = entries.iter_mut().find(|e| {
            e.driver == key.driver
                && e.pool == key.pool
                && e.device == key.device
                && e.share_id == key.share_id
        });
        if let Some(entry) = entry
            && let Some(RawExtension(serde_json::Value::Object(fields))) = entry.data.as_mut()
            && let Ok(value) = serde_json::to_value(settings)
        {
            fields.insert(ETHTOOL_FIELD.to_owned(), value);
        }
    }
}
