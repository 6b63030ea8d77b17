//! `ethtool` settings of exclusive devices (DESIGN §3): what the device has, the checks
//! against it, the changes in order, and the restore of the values found before. The kernel
//! I/O is behind [`EthtoolPort`] (implemented over the ethtool generic netlink family by
//! `host::ethtool`).
//!
//! Applied at prepare, in the host netns, before the device moves: a refusal then fails the
//! prepare, where kubelet reports it in the pod's events before any container is created, and
//! the values stay with the netdev through its move into the pod (they are the device's, not
//! the namespace's). Set back at unprepare, when the detach has brought the device back.
//!
//! Every check that needs only the device's answer (a feature name the kernel does not know,
//! a fixed feature, a ring above its maximum, a channel kind the device has none of) is made
//! before the first change. Then features, rings and channels are set, each section in one
//! request (the kernel checks channel counts together); the features are read back, since the
//! kernel silently keeps a feature a dependency holds off. On a failure the sections already
//! changed are set back before the error, which names the field, is returned.
//!
//! Features are recorded and set back by their *wanted* bit: restoring what the user had
//! asked for lets the kernel derive the same active set as before.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::model::network_config::{EthtoolChannels, EthtoolRings, EthtoolSettings, feature_path};

/// `EOPNOTSUPP`: the driver has no `ethtool_ops` for it.
const EOPNOTSUPP: i32 = 95;

/// One feature of a device as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureState {
    /// In effect.
    pub active: bool,
    /// Asked for.
    pub wanted: bool,
    /// The user may change it (not `[fixed]`).
    pub changeable: bool,
}

/// Current values and the device's maxima (rings or channels).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limited<T> {
    /// What the device has.
    pub current: T,
    /// The largest the device allows.
    pub max: T,
}

/// Reads and sets a device's ethtool settings in the host netns (`host::ethtool` over the
/// ethtool generic netlink family; a fake in tests).
pub trait EthtoolPort: Send + Sync + 'static {
    /// Every feature the kernel knows, by its `ETH_SS_FEATURES` name, as `dev` has it.
    fn features<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, FeatureState>, EthtoolPortError>>;
    /// Asks for each named feature on or off (one request).
    fn set_features<'a>(
        &'a self,
        dev: &'a str,
        changes: &'a [(String, bool)],
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>>;
    /// The ring sizes and their maxima (`None`: the device has no such ring).
    fn rings<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<Limited<EthtoolRings>, EthtoolPortError>>;
    /// Sets the ring sizes that are `Some` (one request).
    fn set_rings<'a>(
        &'a self,
        dev: &'a str,
        rings: EthtoolRings,
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>>;
    /// The channel counts and their maxima.
    fn channels<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<Limited<EthtoolChannels>, EthtoolPortError>>;
    /// Sets the channel counts that are `Some` (one request).
    fn set_channels<'a>(
        &'a self,
        dev: &'a str,
        channels: EthtoolChannels,
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>>;
    /// The id of the running boot (`/proc/sys/kernel/random/boot_id`): a reboot resets the
    /// NIC, so values read in another boot are not the device's any more.
    fn boot_id(&self) -> Result<String, EthtoolPortError>;
}

/// Why the port could not read or set a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct EthtoolPortError {
    /// What was attempted (`ETHTOOL_MSG_RINGS_SET eth3`).
    pub op: String,
    /// The kernel's errno, when the kernel refused.
    pub errno: Option<i32>,
    /// The kernel's message (with its extended-ACK text) or the socket's.
    pub message: String,
}

/// The values of the fields a claim changes, as found before its prepare (features by
/// their wanted bit), set back at unprepare.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EthtoolBefore {
    /// Each feature the claim sets, with its wanted bit before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, bool>,
    /// The ring sizes the claim sets, as they were.
    #[serde(default, skip_serializing_if = "EthtoolRings::is_empty")]
    pub rings: EthtoolRings,
    /// The channel counts the claim sets, as they were.
    #[serde(default, skip_serializing_if = "EthtoolChannels::is_empty")]
    pub channels: EthtoolChannels,
}

/// The `ethtool` settings of one prepared device and the values they replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedEthtool {
    /// The device's interface name in the host netns (the detach brings it back under it).
    pub if_name: String,
    /// What the config asks for (validated).
    pub settings: EthtoolSettings,
    /// The boot `before` was read in: values of another boot are never set back (a reboot
    /// resets the NIC, and what the boot configured since stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The values found before the first change; `None` until they are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<EthtoolBefore>,
}

/// Why `ethtool` settings could not be applied or restored; names the config field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EthtoolError {
    /// The device could not be read.
    #[error("{field}: reading {dev}: {source}")]
    Read {
        /// The config section (`ethtool.rings`).
        field: &'static str,
        /// The host interface.
        dev: String,
        /// The cause.
        #[source]
        source: EthtoolPortError,
    },
    /// The driver has no such settings at all (`EOPNOTSUPP` on the read).
    #[error("{field}: {dev} has no such settings (its driver answers EOPNOTSUPP: {source})")]
    NoSuchSettings {
        /// The config section.
        field: &'static str,
        /// The host interface.
        dev: String,
        /// The kernel's answer.
        #[source]
        source: EthtoolPortError,
    },
    /// The running kernel has no feature of this name.
    #[error(
        "{path}: {value}: the node's kernel has no such feature (names from its ETH_SS_FEATURES \
         string set, e.g. rx-checksum, tx-tcp-segmentation)"
    )]
    UnknownFeature {
        /// `ethtool.features["name"]`.
        path: String,
        /// The value asked for.
        value: bool,
    },
    /// The feature is fixed on this device at the other value.
    #[error("{path}: {value}: fixed at {active} on {dev} (the driver does not let it change)")]
    FixedFeature {
        /// `ethtool.features["name"]`.
        path: String,
        /// The value asked for.
        value: bool,
        /// What the device has.
        active: bool,
        /// The host interface.
        dev: String,
    },
    /// The kernel took the request but the feature did not change.
    #[error(
        "{path}: {value}: {dev} kept it {active} (a feature it depends on is off, or the driver \
         refused it)"
    )]
    FeatureNotTaken {
        /// `ethtool.features["name"]`.
        path: String,
        /// The value asked for.
        value: bool,
        /// What the device has after the request.
        active: bool,
        /// The host interface.
        dev: String,
    },
    /// The device reports no ring or channel of that kind.
    #[error("{path}: {value}: {dev} has no such {what}")]
    NoSuchKind {
        /// `ethtool.rings.rxMini`.
        path: &'static str,
        /// The value asked for.
        value: u32,
        /// `ring`, `channel kind`.
        what: &'static str,
        /// The host interface.
        dev: String,
    },
    /// Above what the device allows.
    #[error("{path}: {value}: above the maximum of {dev}, {max}")]
    AboveMax {
        /// `ethtool.rings.rx`.
        path: &'static str,
        /// The value asked for.
        value: u32,
        /// The device's maximum.
        max: u32,
        /// The host interface.
        dev: String,
    },
    /// The kernel or driver refused the change.
    #[error("{field}: {value}: {dev} refused it ({source})")]
    Refused {
        /// The config section.
        field: &'static str,
        /// The values asked for.
        value: String,
        /// The host interface.
        dev: String,
        /// The kernel's answer.
        #[source]
        source: EthtoolPortError,
    },
    /// A value found before could not be set back.
    #[error("{dev}: restoring {field} to {value}: {source}")]
    Restore {
        /// The config section.
        field: &'static str,
        /// The values found before.
        value: String,
        /// The host interface.
        dev: String,
        /// The kernel's answer.
        #[source]
        source: EthtoolPortError,
    },
    /// The boot id could not be read.
    #[error("reading the boot id: {source}")]
    BootId {
        /// The cause.
        #[source]
        source: EthtoolPortError,
    },
}

const FEATURES: &str = "ethtool.features";
const RINGS: &str = "ethtool.rings";
const CHANNELS: &str = "ethtool.channels";

fn read_error(field: &'static str, dev: &str, source: EthtoolPortError) -> EthtoolError {
    if source.errno == Some(EOPNOTSUPP) {
        EthtoolError::NoSuchSettings { field, dev: dev.to_owned(), source }
    } else {
        EthtoolError::Read { field, dev: dev.to_owned(), source }
    }
}

/// Reads what `settings` would change on `dev` and checks every value against the device
/// before anything is changed. Returns the values to record as "before".
pub async fn check(
    port: &dyn EthtoolPort,
    dev: &str,
    settings: &EthtoolSettings,
) -> Result<EthtoolBefore, EthtoolError> {
    let mut before = EthtoolBefore::default();
    if !settings.features.is_empty() {
        let found = port.features(dev).await.map_err(|e| read_error(FEATURES, dev, e))?;
        for (name, value) in &settings.features {
            let Some(state) = found.get(name) else {
                return Err(EthtoolError::UnknownFeature {
                    path: feature_path(name),
                    value: *value,
                });
            };
            if !state.changeable && state.active != *value {
                return Err(EthtoolError::FixedFeature {
                    path: feature_path(name),
                    value: *value,
                    active: state.active,
                    dev: dev.to_owned(),
                });
            }
            before.features.insert(name.clone(), state.wanted);
        }
    }
    if !settings.rings.is_empty() {
        let found = port.rings(dev).await.map_err(|e| read_error(RINGS, dev, e))?;
        let fields = (found.current.fields(), found.max.fields());
        before.rings =
            rings_from(within(settings.rings.fields(), fields.0, fields.1, "ring", dev)?);
    }
    if !settings.channels.is_empty() {
        let found = port.channels(dev).await.map_err(|e| read_error(CHANNELS, dev, e))?;
        let fields = (found.current.fields(), found.max.fields());
        let wanted = settings.channels.fields();
        before.channels = channels_from(within(wanted, fields.0, fields.1, "channel kind", dev)?);
    }
    Ok(before)
}

type Fields = [(&'static str, Option<u32>); 4];

/// Checks each wanted field against the device's current value and maximum; returns the
/// current values of the wanted fields (the rest `None`).
fn within(
    wanted: Fields,
    current: Fields,
    max: Fields,
    what: &'static str,
    dev: &str,
) -> Result<[Option<u32>; 4], EthtoolError> {
    let mut before = [None; 4];
    for (i, (path, value)) in wanted.into_iter().enumerate() {
        let Some(value) = value else { continue };
        // A kind the driver does not report at all is absent from both (`None`); drivers
        // that report 0/0 for a kind they lack are caught by the maximum.
        let (Some(now), max) = (current[i].1, max[i].1) else {
            return Err(EthtoolError::NoSuchKind { path, value, what, dev: dev.to_owned() });
        };
        if let Some(max) = max
            && value > max
        {
            return Err(EthtoolError::AboveMax { path, value, max, dev: dev.to_owned() });
        }
        before[i] = Some(now);
    }
    Ok(before)
}

fn rings_from([rx, rx_mini, rx_jumbo, tx]: [Option<u32>; 4]) -> EthtoolRings {
    EthtoolRings { rx, tx, rx_mini, rx_jumbo }
}

fn channels_from([rx, tx, other, combined]: [Option<u32>; 4]) -> EthtoolChannels {
    EthtoolChannels { rx, tx, other, combined }
}

fn show<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

/// The sections of a change, in the order they are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Features,
    Rings,
    Channels,
}

/// Applies `settings` to `dev` (checked by [`check`], whose answer is `before`). On a
/// failure every section already changed is set back to `before` (the last first) before
/// the error is returned.
pub async fn apply(
    port: &dyn EthtoolPort,
    dev: &str,
    settings: &EthtoolSettings,
    before: &EthtoolBefore,
) -> Result<(), EthtoolError> {
    let mut changed = Vec::new();
    let outcome = apply_sections(port, dev, settings, &mut changed).await;
    if outcome.is_err() {
        for section in changed.into_iter().rev() {
            if let Err(err) = set_back(port, dev, before, section).await {
                tracing::warn!(dev, %err, "setting ethtool values back after a failed prepare");
            }
        }
    }
    outcome
}

async fn apply_sections(
    port: &dyn EthtoolPort,
    dev: &str,
    settings: &EthtoolSettings,
    changed: &mut Vec<Section>,
) -> Result<(), EthtoolError> {
    if !settings.features.is_empty() {
        let asked: Vec<(String, bool)> =
            settings.features.iter().map(|(n, v)| (n.clone(), *v)).collect();
        // Counted as changed before the request: a request the kernel half-applied (the
        // features before the one it refused) is set back too.
        changed.push(Section::Features);
        port.set_features(dev, &asked).await.map_err(|source| EthtoolError::Refused {
            field: FEATURES,
            value: show(&settings.features),
            dev: dev.to_owned(),
            source,
        })?;
        let now = port.features(dev).await.map_err(|e| read_error(FEATURES, dev, e))?;
        for (name, value) in &settings.features {
            let active = now.get(name).map_or(!value, |s| s.active);
            if active != *value {
                return Err(EthtoolError::FeatureNotTaken {
                    path: feature_path(name),
                    value: *value,
                    active,
                    dev: dev.to_owned(),
                });
            }
        }
    }
    if !settings.rings.is_empty() {
        changed.push(Section::Rings);
        port.set_rings(dev, settings.rings).await.map_err(|source| EthtoolError::Refused {
            field: RINGS,
            value: show(&settings.rings),
            dev: dev.to_owned(),
            source,
        })?;
    }
    if !settings.channels.is_empty() {
        changed.push(Section::Channels);
        port.set_channels(dev, settings.channels).await.map_err(|source| {
            EthtoolError::Refused {
                field: CHANNELS,
                value: show(&settings.channels),
                dev: dev.to_owned(),
                source,
            }
        })?;
    }
    Ok(())
}

/// Sets one section of `dev` back to `before`.
async fn set_back(
    port: &dyn EthtoolPort,
    dev: &str,
    before: &EthtoolBefore,
    section: Section,
) -> Result<(), EthtoolError> {
    let restore = |field, value: String| {
        move |source| EthtoolError::Restore { field, value, dev: dev.to_owned(), source }
    };
    match section {
        Section::Features if !before.features.is_empty() => {
            let changes: Vec<(String, bool)> =
                before.features.iter().map(|(n, v)| (n.clone(), *v)).collect();
            port.set_features(dev, &changes)
                .await
                .map_err(restore(FEATURES, show(&before.features)))
        }
        Section::Rings if !before.rings.is_empty() => {
            port.set_rings(dev, before.rings).await.map_err(restore(RINGS, show(&before.rings)))
        }
        Section::Channels if !before.channels.is_empty() => port
            .set_channels(dev, before.channels)
            .await
            .map_err(restore(CHANNELS, show(&before.channels))),
        _ => Ok(()),
    }
}

/// Sets every section of `dev` that `before` holds back to it: channels, rings, then
/// features (the order that undoes [`apply`]). Every section is tried; the first failure is
/// returned (unprepare then fails and kubelet retries it).
pub async fn restore(
    port: &dyn EthtoolPort,
    dev: &str,
    before: &EthtoolBefore,
) -> Result<(), EthtoolError> {
    let mut first_error = None;
    for section in [Section::Channels, Section::Rings, Section::Features] {
        if let Err(err) = set_back(port, dev, before, section).await {
            tracing::warn!(dev, %err, "restoring ethtool values");
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
pub(crate) mod tests;
