//! VF settings of `sriov-vf` claims (DESIGN §3, §5 step 2): what a claim asks of its VF, the
//! changes that get the VF there one field at a time, and the restore of the values found
//! before. The kernel I/O is behind [`VfPort`] (implemented over rtnetlink on the PF by
//! `host::sriov`); this module decides, in order, what to set and what to set back.
//!
//! Every setting is applied on its own `RTM_SETLINK`, so a field the NIC cannot set fails the
//! prepare with an error naming that field, and the fields already applied are set back first.
//! The values read before the first change are kept in the prepared claim and set back at
//! unprepare exactly as read: defaults differ between drivers (spoof checking, trust, the MAC
//! a new VF starts with), so nothing is ever reset to an assumed default. A field whose wanted
//! value equals the current one is not sent at all: a NIC without link-state control (igb)
//! then still takes a claim that leaves `linkState` at `auto`.

pub use super::ports::VfPort;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::network_config::{
    MacAddr, ResolvedNetworkConfig, SriovSettings, VfLinkState, VfVlanProtocol,
};

/// `EOPNOTSUPP`: the PF driver has no `ndo_set_vf_*` for the field (igb: link state).
const EOPNOTSUPP: i32 = 95;
/// `EPROTONOSUPPORT`: the PF driver refuses the VLAN protocol (igb: 802.1ad).
const EPROTONOSUPPORT: i32 = 93;

/// A VF, named the way the PF's netlink calls it: the PF's interface and the VF's index
/// (`virtfn<N>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfRef {
    /// Interface name of the PF in the host netns.
    pub pf: String,
    /// The VF's index on the PF.
    pub index: u32,
}

impl fmt::Display for VfRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VF {} of {}", self.index, self.pf)
    }
}

/// Serde of an optional [`PciAddress`] as its `dddd:bb:dd.f` text.
pub(crate) mod pci_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::model::device::PciAddress;

    #[expect(clippy::ref_option, reason = "serde's `with` hands the field by reference")]
    pub(crate) fn serialize<S: Serializer>(
        pci: &Option<PciAddress>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match pci {
            Some(pci) => serializer.collect_str(pci),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<PciAddress>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| text.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// The settings of one VF as the PF reports them (`IFLA_VFINFO_LIST`, read with
/// `RTEXT_FILTER_VF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfState {
    /// `IFLA_VF_MAC` (all zero: none set by the PF).
    pub mac: MacAddr,
    /// `IFLA_VF_VLAN` id (0: none).
    pub vlan: u16,
    /// `IFLA_VF_VLAN` `QoS`.
    pub qos: u8,
    /// `IFLA_VF_VLAN_LIST` protocol.
    pub vlan_protocol: VfVlanProtocol,
    /// `IFLA_VF_SPOOFCHK`; `None` when the driver does not report it.
    pub spoof_check: Option<bool>,
    /// `IFLA_VF_TRUST`; `None` when the driver does not report it.
    pub trust: Option<bool>,
    /// `IFLA_VF_RATE` minimum, Mbit/s.
    pub min_tx_rate_mbps: u32,
    /// `IFLA_VF_RATE` maximum, Mbit/s.
    pub max_tx_rate_mbps: u32,
    /// `IFLA_VF_LINK_STATE`.
    pub link_state: VfLinkState,
}

/// One `RTM_SETLINK` on the PF: the `IFLA_VF_*` attribute and its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VfChange {
    /// `IFLA_VF_MAC`.
    Mac(MacAddr),
    /// `IFLA_VF_VLAN_LIST` with one `IFLA_VF_VLAN_INFO`.
    Vlan {
        /// VLAN id (0: none).
        id: u16,
        /// `QoS` priority.
        qos: u8,
        /// Tag protocol.
        protocol: VfVlanProtocol,
    },
    /// `IFLA_VF_SPOOFCHK`.
    SpoofCheck(bool),
    /// `IFLA_VF_TRUST`.
    Trust(bool),
    /// `IFLA_VF_RATE` (both rates travel together).
    Rate {
        /// Minimum, Mbit/s.
        min_mbps: u32,
        /// Maximum, Mbit/s.
        max_mbps: u32,
    },
    /// `IFLA_VF_LINK_STATE`.
    LinkState(VfLinkState),
}

/// A config field that becomes VF settings, in the order they are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VfField {
    /// `interface.hardwareAddress`.
    Mac,
    /// `vlan` with `sriov.qos` (sent with the protocol found on the VF).
    Vlan,
    /// `sriov.vlanProtocol`.
    VlanProtocol,
    /// `sriov.spoofCheck`.
    SpoofCheck,
    /// `sriov.trust`.
    Trust,
    /// `sriov.maxTxRateMbps` (sent with the minimum found on the VF).
    MaxTxRate,
    /// `sriov.minTxRateMbps`.
    MinTxRate,
    /// `sriov.linkState`.
    LinkState,
}

impl VfField {
    const ALL: [VfField; 8] = [
        VfField::Mac,
        VfField::Vlan,
        VfField::VlanProtocol,
        VfField::SpoofCheck,
        VfField::Trust,
        VfField::MaxTxRate,
        VfField::MinTxRate,
        VfField::LinkState,
    ];

    /// The config path the field comes from, as errors name it.
    #[must_use]
    pub fn path(self) -> &'static str {
        match self {
            VfField::Mac => "interface.hardwareAddress",
            VfField::Vlan => "vlan",
            VfField::VlanProtocol => "sriov.vlanProtocol",
            VfField::SpoofCheck => "sriov.spoofCheck",
            VfField::Trust => "sriov.trust",
            VfField::MaxTxRate => "sriov.maxTxRateMbps",
            VfField::MinTxRate => "sriov.minTxRateMbps",
            VfField::LinkState => "sriov.linkState",
        }
    }

    /// Whether `a` and `b` differ in this field.
    fn differs(self, a: &VfState, b: &VfState) -> bool {
        match self {
            VfField::Mac => a.mac != b.mac,
            VfField::Vlan => (a.vlan, a.qos) != (b.vlan, b.qos),
            VfField::VlanProtocol => a.vlan_protocol != b.vlan_protocol,
            VfField::SpoofCheck => a.spoof_check != b.spoof_check,
            VfField::Trust => a.trust != b.trust,
            VfField::MaxTxRate => a.max_tx_rate_mbps != b.max_tx_rate_mbps,
            VfField::MinTxRate => a.min_tx_rate_mbps != b.min_tx_rate_mbps,
            VfField::LinkState => a.link_state != b.link_state,
        }
    }

    /// The message that sets this field (and the fields travelling with it) as in `state`.
    /// `None` for a flag the driver does not report (nothing to set it to).
    fn change_to(self, state: &VfState) -> Option<VfChange> {
        Some(match self {
            VfField::Mac => VfChange::Mac(state.mac),
            VfField::Vlan | VfField::VlanProtocol => {
                VfChange::Vlan { id: state.vlan, qos: state.qos, protocol: state.vlan_protocol }
            }
            VfField::SpoofCheck => VfChange::SpoofCheck(state.spoof_check?),
            VfField::Trust => VfChange::Trust(state.trust?),
            VfField::MaxTxRate | VfField::MinTxRate => VfChange::Rate {
                min_mbps: state.min_tx_rate_mbps,
                max_mbps: state.max_tx_rate_mbps,
            },
            VfField::LinkState => VfChange::LinkState(state.link_state),
        })
    }

    /// `state` with this field taken from `wanted`.
    fn take(self, mut state: VfState, wanted: &VfState) -> VfState {
        match self {
            VfField::Mac => state.mac = wanted.mac,
            VfField::Vlan => (state.vlan, state.qos) = (wanted.vlan, wanted.qos),
            VfField::VlanProtocol => state.vlan_protocol = wanted.vlan_protocol,
            VfField::SpoofCheck => state.spoof_check = wanted.spoof_check,
            VfField::Trust => state.trust = wanted.trust,
            VfField::MaxTxRate => state.max_tx_rate_mbps = wanted.max_tx_rate_mbps,
            VfField::MinTxRate => state.min_tx_rate_mbps = wanted.min_tx_rate_mbps,
            VfField::LinkState => state.link_state = wanted.link_state,
        }
        state
    }

    /// The field's value in `state`, for error messages.
    fn value(self, state: &VfState) -> String {
        let flag = |v: Option<bool>| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
        match self {
            VfField::Mac => state.mac.to_string(),
            VfField::Vlan => format!("{} (qos {})", state.vlan, state.qos),
            VfField::VlanProtocol => state.vlan_protocol.as_str().to_owned(),
            VfField::SpoofCheck => flag(state.spoof_check),
            VfField::Trust => flag(state.trust),
            VfField::MaxTxRate => state.max_tx_rate_mbps.to_string(),
            VfField::MinTxRate => state.min_tx_rate_mbps.to_string(),
            VfField::LinkState => link_state_name(state.link_state).to_owned(),
        }
    }
}

fn link_state_name(state: VfLinkState) -> &'static str {
    match state {
        VfLinkState::Auto => "auto",
        VfLinkState::Enable => "enable",
        VfLinkState::Disable => "disable",
    }
}

/// Why the port could not read or set a VF.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct VfPortError {
    /// What was attempted (`RTM_SETLINK IFLA_VF_TRUST on eth0`).
    pub op: String,
    /// The kernel's errno, when the kernel refused.
    pub errno: Option<i32>,
    /// The kernel's or the socket's message.
    pub message: String,
}

/// Why VF settings could not be applied or restored; names the config field and the VF.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VfError {
    /// The PF's report of the VF could not be read.
    #[error("{vf}: reading its settings on the PF: {source}")]
    Read {
        /// The VF.
        vf: VfRef,
        /// The cause.
        #[source]
        source: VfPortError,
    },
    /// The NIC cannot set the field (the PF driver answered `EOPNOTSUPP` or
    /// `EPROTONOSUPPORT`).
    #[error("{field}: {value}: not supported by this NIC ({vf}: {source})")]
    Unsupported {
        /// The config field.
        field: &'static str,
        /// The value asked for.
        value: String,
        /// The VF.
        vf: VfRef,
        /// The kernel's answer.
        #[source]
        source: VfPortError,
    },
    /// The PF refused the value for another reason.
    #[error("{field}: {value}: the PF refused it ({vf}: {source})")]
    Refused {
        /// The config field.
        field: &'static str,
        /// The value asked for.
        value: String,
        /// The VF.
        vf: VfRef,
        /// The kernel's answer.
        #[source]
        source: VfPortError,
    },
    /// The driver does not report the flag, so a change could never be set back exactly.
    #[error(
        "{field}: {value}: this NIC does not report the setting, so it could not be restored ({vf})"
    )]
    NotReported {
        /// The config field.
        field: &'static str,
        /// The value asked for.
        value: String,
        /// The VF.
        vf: VfRef,
    },
    /// Finding the VF in sysfs failed.
    #[error("{what}: looking it up in sysfs: {source}")]
    Locate {
        /// The VF looked for (`VF 1 of eth9`, `the VF at PCI 0000:09:00.1`).
        what: String,
        /// The cause.
        #[source]
        source: VfPortError,
    },
    /// No VF of that identity on this node (SR-IOV disabled, fewer VFs, or another PF).
    #[error("{what}: no such VF on this node")]
    NotFound {
        /// The VF looked for.
        what: String,
    },
    /// A record of a release before format 3 whose VF could not be identified by PCI address
    /// at the upgrade.
    #[error(
        "{vf}: recorded by a release before state format 3 and not found by PCI address at the \
         upgrade, so its settings are neither re-applied nor set back; unprepare the claim"
    )]
    Unidentified {
        /// The VF as that release named it.
        vf: VfRef,
    },
    /// The boot id could not be read.
    #[error("reading the boot id: {source}")]
    BootId {
        /// The cause.
        #[source]
        source: VfPortError,
    },
    /// A value found before the claim could not be set back.
    #[error("{vf}: restoring {field} to {value}: {source}")]
    Restore {
        /// The config field.
        field: &'static str,
        /// The value found before the claim.
        value: String,
        /// The VF.
        vf: VfRef,
        /// The kernel's answer.
        #[source]
        source: VfPortError,
    },
}

/// What a claim asks of its VF: `before` with the config's values put in. A MAC the config
/// does not set stays as found; every other setting has a value (DESIGN §3 defaults: no VLAN,
/// `QoS` 0, 802.1Q, spoof checking on, not trusted, no rate limits, link state auto). The
/// maximum rate is `sriov.maxTxRateMbps`, else the egress ceiling `bandwidth.limit` resolved
/// ([`ceiling_mbps`]).
///
/// Every path that sets a VF (prepare, the attach's re-apply after a reboot, the migration
/// of old records) derives the VF's state from the prepared claim's resolved config through
/// this function, so the ceiling travels with the config already persisted there: no field
/// of its own in the VF record or its snapshot.
#[must_use]
pub fn wanted(before: &VfState, config: &ResolvedNetworkConfig) -> VfState {
    let sriov = config.sriov.unwrap_or(SriovSettings {
        qos: 0,
        spoof_check: true,
        trust: false,
        max_tx_rate_mbps: 0,
        min_tx_rate_mbps: 0,
        link_state: VfLinkState::Auto,
        vlan_protocol: VfVlanProtocol::Ieee8021Q,
    });
    VfState {
        mac: config.interface.hardware_address.unwrap_or(before.mac),
        vlan: config.vlan.unwrap_or(0),
        qos: sriov.qos,
        vlan_protocol: sriov.vlan_protocol,
        spoof_check: Some(sriov.spoof_check),
        trust: Some(sriov.trust),
        min_tx_rate_mbps: sriov.min_tx_rate_mbps,
        max_tx_rate_mbps: match sriov.max_tx_rate_mbps {
            0 => ceiling_mbps(config).unwrap_or(0),
            set => set,
        },
        link_state: sriov.link_state,
    }
}

/// The VF's `max_tx_rate` (Mb/s) that holds it to the resolved egress ceiling
/// (`bandwidth.limit`; issue 35), when the config has one and `sriov.maxTxRateMbps` does not
/// set the rate itself (validation refuses both together, and a limit not in whole Mb/s, so
/// the rounding up never raises a ceiling). A VF's traffic leaves through the NIC's own
/// switch, never through a qdisc of the host or the pod: the PF's hardware rate limiter
/// (`IFLA_VF_RATE`) is the one place to hold it. `None`: no ceiling.
#[must_use]
pub fn ceiling_mbps(config: &ResolvedNetworkConfig) -> Option<u32> {
    if config.sriov.is_some_and(|s| s.max_tx_rate_mbps != 0) {
        return None;
    }
    let rate = config.bandwidth?.ceiling?.rate;
    Some(u32::try_from(rate.mbps_ceil()).unwrap_or(u32::MAX)).filter(|mbps| *mbps > 0)
}

/// `err` of [`apply`] for `config`, naming `bandwidth.limit` (with the rate asked) instead of
/// `sriov.maxTxRateMbps` when the maximum rate came from the ceiling: the user wrote the
/// limit, not the VF field.
#[must_use]
pub fn name_ceiling(err: VfError, config: &ResolvedNetworkConfig) -> VfError {
    let Some(mbps) = ceiling_mbps(config) else { return err };
    let rate = config.bandwidth.and_then(|b| b.ceiling).map(|c| c.rate);
    let named = |field: &mut &'static str, value: &mut String| {
        if *field == VfField::MaxTxRate.path()
            && let Some(rate) = rate
        {
            *field = "bandwidth.limit";
            *value = format!("{rate} (the VF's max_tx_rate {mbps} Mb/s)");
        }
    };
    let mut err = err;
    match &mut err {
        VfError::Unsupported { field, value, .. }
        | VfError::Refused { field, value, .. }
        | VfError::NotReported { field, value, .. } => named(field, value),
        _ => {}
    }
    err
}

/// Applies `wanted` to `vf` field by field and returns the values found before, which
/// [`restore`] sets back. On a failure the fields already changed are set back (in reverse
/// order) before the error, which names the field, is returned.
///
/// A new MAC is first set on the VF's netdev `netdev` (the VF asks its PF through the
/// mailbox), then on the PF: once the PF has set a MAC, a VF that is not trusted may not set
/// one itself (igb: "VF attempted to override administratively set MAC address"), and the
/// netdev would only take the PF's at the driver's next reset. The attach then moves the VF
/// without touching its MAC. A refusal there is logged, not fatal: the PF's MAC is what
/// counts, and the VF takes it at its next reset.
pub async fn apply(
    port: &dyn VfPort,
    vf: &VfRef,
    netdev: &str,
    wanted: &VfState,
) -> Result<VfState, VfError> {
    let before = port.read(vf).await.map_err(|source| VfError::Read { vf: vf.clone(), source })?;
    if wanted.mac != before.mac
        && let Err(err) = port.set_netdev_mac(netdev, wanted.mac).await
    {
        tracing::warn!(%vf, netdev, %err,
            "setting the MAC on the VF's netdev; it takes the PF's at its next reset");
    }
    let mut current = before;
    let mut applied: Vec<(VfField, VfState)> = Vec::new();
    for field in VfField::ALL {
        if !field.differs(&current, wanted) {
            continue;
        }
        let next = field.take(current, wanted);
        let failure = match (field.change_to(&current), field.change_to(&next)) {
            // A flag the driver does not report: a change could not be set back.
            (None, _) | (_, None) => Some(VfError::NotReported {
                field: field.path(),
                value: field.value(wanted),
                vf: vf.clone(),
            }),
            (Some(_), Some(change)) => port.set(vf, change).await.err().map(|source| {
                let (field, value, vf) = (field.path(), field.value(wanted), vf.clone());
                if matches!(source.errno, Some(EOPNOTSUPP | EPROTONOSUPPORT)) {
                    VfError::Unsupported { field, value, vf, source }
                } else {
                    VfError::Refused { field, value, vf, source }
                }
            }),
        };
        if let Some(err) = failure {
            roll_back(port, vf, &applied).await;
            return Err(err);
        }
        applied.push((field, current));
        current = next;
    }
    Ok(before)
}

/// Sets back the fields of a failed [`apply`], the last first; a failure here is logged (the
/// prepare already fails with the cause, and the claim is not recorded).
async fn roll_back(port: &dyn VfPort, vf: &VfRef, applied: &[(VfField, VfState)]) {
    for (field, previous) in applied.iter().rev() {
        let Some(change) = field.change_to(previous) else { continue };
        if let Err(err) = port.set(vf, change).await {
            tracing::warn!(%vf, field = field.path(), %err,
                "setting a VF field back after a failed prepare");
        }
    }
}

/// Sets every field of `vf` that differs from `before` back to the value found before the
/// claim. All fields are tried; the first failure is returned (unprepare then fails and
/// kubelet retries it, which reads the VF afresh).
pub async fn restore(port: &dyn VfPort, vf: &VfRef, before: &VfState) -> Result<(), VfError> {
    let now = port.read(vf).await.map_err(|source| VfError::Read { vf: vf.clone(), source })?;
    let mut first_error = None;
    let mut current = now;
    for field in VfField::ALL {
        if !field.differs(&current, before) {
            continue;
        }
        // The VLAN and rate messages carry their companion fields: set them as found before
        // in one go.
        let target = match field {
            VfField::Vlan | VfField::VlanProtocol => {
                VfField::VlanProtocol.take(VfField::Vlan.take(current, before), before)
            }
            VfField::MaxTxRate | VfField::MinTxRate => {
                VfField::MinTxRate.take(VfField::MaxTxRate.take(current, before), before)
            }
            _ => field.take(current, before),
        };
        let Some(change) = field.change_to(&target) else { continue };
        match port.set(vf, change).await {
            Ok(()) => current = target,
            Err(source) => {
                tracing::warn!(%vf, field = field.path(), %source, "restoring a VF field");
                first_error.get_or_insert(VfError::Restore {
                    field: field.path(),
                    value: field.value(before),
                    vf: vf.clone(),
                    source,
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
pub(crate) mod tests;
