//! `ethtool` of an exclusive device (DESIGN §3): offload features by the kernel's names,
//! ring sizes and channel counts, as written, merged and validated.
//!
//! Only a device that moves whole into one pod (`host-device`, `sriov-vf`) may be tuned: a
//! macvlan or ipvlan child shares its parent's queues and offloads with every other pod on
//! it, and a `vfio` function has no netdev. What the device itself accepts (a feature name
//! this kernel knows, a feature that is not fixed, a ring within the device's maximum) is
//! checked on the device at prepare (`claims::ethtool`), where the device is in the host
//! netns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::validate::{invalid, quoted};
use super::{ConfigError, Mode, NetworkConfig, Rule};

/// The longest feature name: the kernel's strings are `ETH_GSTRING_LEN` (32) bytes with
/// their NUL.
pub const MAX_FEATURE_NAME: usize = 31;

/// `ethtool` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EthtoolConfig {
    /// Offload features on or off, by the kernel's `ETH_SS_FEATURES` names; merged key by
    /// key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<BTreeMap<String, bool>>,
    /// Ring sizes (descriptors per ring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<EthtoolRings>,
    /// Channel counts (queues with their interrupt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<EthtoolChannels>,
}

/// Ring sizes (`ethtool -G`); a field left out is left as the device has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EthtoolRings {
    /// Receive ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx: Option<u32>,
    /// Transmit ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx: Option<u32>,
    /// Receive ring for small packets (few drivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_mini: Option<u32>,
    /// Receive ring for jumbo frames (few drivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_jumbo: Option<u32>,
}

impl EthtoolRings {
    /// Each field with its config path and value, in the kernel's order.
    #[must_use]
    pub fn fields(&self) -> [(&'static str, Option<u32>); 4] {
        [
            ("ethtool.rings.rx", self.rx),
            ("ethtool.rings.rxMini", self.rx_mini),
            ("ethtool.rings.rxJumbo", self.rx_jumbo),
            ("ethtool.rings.tx", self.tx),
        ]
    }

    /// No field set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(|(_, v)| v.is_none())
    }

    fn merge(&mut self, later: EthtoolRings) {
        let EthtoolRings { rx, tx, rx_mini, rx_jumbo } = later;
        self.rx = rx.or(self.rx);
        self.tx = tx.or(self.tx);
        self.rx_mini = rx_mini.or(self.rx_mini);
        self.rx_jumbo = rx_jumbo.or(self.rx_jumbo);
    }
}

/// Channel counts (`ethtool -L`); a field left out is left as the device has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EthtoolChannels {
    /// Receive-only channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx: Option<u32>,
    /// Transmit-only channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx: Option<u32>,
    /// Other channels (link interrupts, SR-IOV mailbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<u32>,
    /// Channels with a receive and a transmit queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combined: Option<u32>,
}

impl EthtoolChannels {
    /// Each field with its config path and value, in the kernel's order.
    #[must_use]
    pub fn fields(&self) -> [(&'static str, Option<u32>); 4] {
        [
            ("ethtool.channels.rx", self.rx),
            ("ethtool.channels.tx", self.tx),
            ("ethtool.channels.other", self.other),
            ("ethtool.channels.combined", self.combined),
        ]
    }

    /// No field set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(|(_, v)| v.is_none())
    }

    fn merge(&mut self, later: EthtoolChannels) {
        let EthtoolChannels { rx, tx, other, combined } = later;
        self.rx = rx.or(self.rx);
        self.tx = tx.or(self.tx);
        self.other = other.or(self.other);
        self.combined = combined.or(self.combined);
    }
}

impl EthtoolConfig {
    /// A later entry on top of this one: features key by key, ring and channel fields one by
    /// one (DESIGN §3: later entries override earlier ones field by field).
    pub(super) fn merge(&mut self, later: EthtoolConfig) {
        let EthtoolConfig { features, rings, channels } = later;
        if let Some(features) = features {
            self.features.get_or_insert_with(BTreeMap::new).extend(features);
        }
        if let Some(rings) = rings {
            self.rings.get_or_insert_with(EthtoolRings::default).merge(rings);
        }
        if let Some(channels) = channels {
            self.channels.get_or_insert_with(EthtoolChannels::default).merge(channels);
        }
    }
}

/// Validated `ethtool` settings: what the prepare applies on the device (never empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EthtoolSettings {
    /// Features on or off, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, bool>,
    /// Ring sizes to set.
    #[serde(default, skip_serializing_if = "EthtoolRings::is_empty")]
    pub rings: EthtoolRings,
    /// Channel counts to set.
    #[serde(default, skip_serializing_if = "EthtoolChannels::is_empty")]
    pub channels: EthtoolChannels,
}

/// Why an `ethtool` value was refused before the device was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EthtoolRefusal {
    /// The device is not moved whole into the pod.
    #[error(
        "only for a device that moves whole into the pod (mode host-device or sriov-vf), but the \
         mode is {0}: a macvlan or ipvlan child shares its parent's queues and offloads with \
         other pods, and a vfio function has no netdev"
    )]
    NotExclusive(Mode),
    /// Not a feature name as the kernel spells them.
    #[error(
        "not a feature name: the kernel's ETH_SS_FEATURES names (e.g. rx-checksum, \
         tx-tcp-segmentation) are 1..31 lower-case letters, digits, '-' and '_'"
    )]
    FeatureName,
    /// A ring of no descriptors.
    #[error("a ring holds at least one descriptor")]
    EmptyRing,
}

fn refused(path: impl Into<String>, value: String, why: EthtoolRefusal) -> ConfigError {
    invalid(path, value, Rule::Ethtool(why))
}

/// The `ethtool` settings of `cfg` for a device attached in `mode`: `None` when it asks for
/// nothing.
pub fn resolve_ethtool(
    cfg: &NetworkConfig,
    mode: Mode,
) -> Result<Option<EthtoolSettings>, ConfigError> {
    let Some(ethtool) = &cfg.ethtool else { return Ok(None) };
    let settings = EthtoolSettings {
        features: ethtool.features.clone().unwrap_or_default(),
        rings: ethtool.rings.unwrap_or_default(),
        channels: ethtool.channels.unwrap_or_default(),
    };
    if settings == EthtoolSettings::default() {
        return Ok(None);
    }
    if !matches!(mode, Mode::HostDevice | Mode::SriovVf) {
        return Err(refused(
            "ethtool",
            super::validate::to_json(ethtool),
            EthtoolRefusal::NotExclusive(mode),
        ));
    }
    for name in settings.features.keys() {
        let ok = !name.is_empty()
            && name.len() <= MAX_FEATURE_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(refused(feature_path(name), quoted(name), EthtoolRefusal::FeatureName));
        }
    }
    for (path, value) in settings.rings.fields() {
        if value == Some(0) {
            return Err(refused(path, "0".to_owned(), EthtoolRefusal::EmptyRing));
        }
    }
    Ok(Some(settings))
}

/// The config path of feature `name` (`ethtool.features["rx-checksum"]`).
#[must_use]
pub fn feature_path(name: &str) -> String {
    format!("ethtool.features[{name:?}]")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use serde_json::json;

    use super::*;
    use crate::model::network_config::decode;

    fn config(body: serde_json::Value) -> NetworkConfig {
        let mut params = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
        let serde_json::Value::Object(fields) = body else { panic!("an object") };
        params.as_object_mut().unwrap().extend(fields);
        decode(0, &params).unwrap()
    }

    #[test]
    fn entries_merge_features_key_by_key_and_rings_and_channels_field_by_field() {
        let mut merged =
            config(json!({"ethtool": {"features": {"rx-gro": false, "rx-checksum": true},
            "rings": {"rx": 512, "tx": 512}, "channels": {"combined": 4}}}));
        merged.merge(config(json!({"ethtool": {"features": {"rx-checksum": false},
            "rings": {"tx": 1024}, "channels": {"other": 1}}})));
        let settings = resolve_ethtool(&merged, Mode::HostDevice).unwrap().unwrap();
        assert_eq!(
            settings.features,
            [("rx-checksum".into(), false), ("rx-gro".into(), false)].into()
        );
        assert_eq!((settings.rings.rx, settings.rings.tx), (Some(512), Some(1024)));
        assert_eq!((settings.channels.combined, settings.channels.other), (Some(4), Some(1)));
    }

    #[test]
    fn only_exclusive_modes_and_valid_values_are_accepted() {
        let asked = config(json!({"ethtool": {"features": {"rx-gro": false}}}));
        assert!(resolve_ethtool(&asked, Mode::SriovVf).unwrap().is_some());
        for mode in [Mode::Macvlan, Mode::Ipvlan, Mode::Vfio] {
            let err = resolve_ethtool(&asked, mode).unwrap_err().to_string();
            assert!(
                err.starts_with(
                    "ethtool: {\"features\":{\"rx-gro\":false}}: only for a device that moves whole"
                ),
                "{err}"
            );
        }
        // Nothing asked: nothing to do, in any mode.
        assert_eq!(resolve_ethtool(&config(json!({"ethtool": {}})), Mode::Macvlan).unwrap(), None);
        for (body, message) in [
            (
                json!({"features": {"RX-GRO": true}}),
                "ethtool.features[\"RX-GRO\"]: \"RX-GRO\": not a feature name",
            ),
            (json!({"features": {"": true}}), "ethtool.features[\"\"]: \"\": not a feature name"),
            (
                json!({"features": {"a-name-far-longer-than-the-kernel-allows": true}}),
                "not a feature name",
            ),
            (
                json!({"rings": {"rxJumbo": 0}}),
                "ethtool.rings.rxJumbo: 0: a ring holds at least one descriptor",
            ),
        ] {
            let err = resolve_ethtool(&config(json!({"ethtool": body})), Mode::HostDevice)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{message:?} missing in {err}");
        }
        // Strict decoding: an unknown field is named.
        let params = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
            "ethtool": {"rings": {"rxmini": 8}}});
        let err = decode(0, &params).unwrap_err().to_string();
        assert!(err.contains("unknown field `rxmini`"), "{err}");
    }
}
