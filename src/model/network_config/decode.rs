//! One config entry of an allocation (`status.allocation.devices.config`), which requests it
//! applies to, and the strict decoding of its opaque `parameters`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{API_VERSION, ConfigError, KIND, NetworkConfig};

/// Where a config entry came from (`DeviceAllocationConfiguration.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConfigSource {
    /// `FromClass`: the `DeviceClass` config.
    #[serde(rename = "FromClass")]
    Class,
    /// `FromClaim`: the claim's own config.
    #[serde(rename = "FromClaim")]
    Claim,
}

impl ConfigSource {
    /// Parses `DeviceAllocationConfiguration.source` (`FromClass` / `FromClaim`).
    #[must_use]
    pub fn from_api(source: &str) -> Option<ConfigSource> {
        match source {
            "FromClass" => Some(ConfigSource::Class),
            "FromClaim" => Some(ConfigSource::Claim),
            _ => None,
        }
    }
}

/// One entry of `status.allocation.devices.config` for this driver.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    /// Class or claim.
    pub source: ConfigSource,
    /// The requests it applies to; empty means every request.
    pub requests: Vec<String>,
    /// The opaque `parameters` object.
    pub parameters: Value,
}

impl ConfigEntry {
    /// Whether this entry applies to the allocation result of `request`. A result of a
    /// `firstAvailable` request is named `<req>/<sub>`, and an entry naming `<req>` applies
    /// to it (Kubernetes matches config to the main request name).
    #[must_use]
    pub fn applies_to(&self, request: &str) -> bool {
        if self.requests.is_empty() {
            return true;
        }
        let main = request.split_once('/').map_or(request, |(main, _)| main);
        self.requests.iter().any(|r| r == request || r == main)
    }
}

pub(super) const MISSING: &str = "<missing>";

/// The API server's limit on one opaque device configuration's `parameters`
/// (resource.k8s.io `OpaqueParametersMaxLength`, 10 KiB).
pub const MAX_PARAMETERS_BYTES: usize = 10 * 1024;

/// Strictly decodes one entry's `parameters`; `entry` is its index, for messages.
pub fn decode(entry: usize, parameters: &Value) -> Result<NetworkConfig, ConfigError> {
    let size = serde_json::to_string(parameters).map_or(usize::MAX, |text| text.len());
    if size > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::TooLarge {
            entry,
            value: format!("{size} bytes"),
            max: MAX_PARAMETERS_BYTES,
        });
    }
    let Some(object) = parameters.as_object() else {
        return Err(ConfigError::NotAnObject { entry, value: parameters.to_string() });
    };
    match object.get("apiVersion") {
        Some(Value::String(v)) if v == API_VERSION => {}
        other => {
            return Err(ConfigError::ApiVersion {
                entry,
                value: other.map_or_else(|| MISSING.to_owned(), Value::to_string),
            });
        }
    }
    match object.get("kind") {
        Some(Value::String(v)) if v == KIND => {}
        other => {
            return Err(ConfigError::Kind {
                entry,
                value: other.map_or_else(|| MISSING.to_owned(), Value::to_string),
            });
        }
    }
    serde_path_to_error::deserialize(parameters).map_err(|err| {
        let path = err.path().clone();
        ConfigError::Decode {
            entry,
            path: path.to_string(),
            value: value_at(parameters, &path).map_or_else(|| MISSING.to_owned(), Value::to_string),
            source: err.into_inner(),
        }
    })
}

/// The JSON value at a decoder path, to quote it in the error.
fn value_at<'v>(root: &'v Value, path: &serde_path_to_error::Path) -> Option<&'v Value> {
    use serde_path_to_error::Segment;
    let mut current = root;
    for segment in path {
        current = match segment {
            Segment::Seq { index } => current.get(*index)?,
            Segment::Map { key } => current.get(key.as_str())?,
            Segment::Enum { .. } | Segment::Unknown => return Some(current),
        };
    }
    Some(current)
}
