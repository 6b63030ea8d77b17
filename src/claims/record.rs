//! The prepared claim as recorded in the store and answered to kubelet.

use std::collections::BTreeMap;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::metadata;
use super::preparer::PreparedDevice;
use super::vf::{VfRef, VfState};
use crate::model::device::{AttributeValue, PciAddress};
use crate::model::network_config::{DeviceKind, ResolvedNetworkConfig, Sharing};

/// A claim as prepared: what kubelet got back and what the attach step needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// The claim's UID (the record key).
    pub uid: String,
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// One entry per allocation result of this driver on this node.
    pub devices: Vec<PreparedClaimDevice>,
    /// The pods the claim is reserved for (`status.reservedFor`, resource `pods`), as read at
    /// the first prepare; the attach step finds a pod's claims by these UIDs.
    ///
    /// A network claim serves one pod (a claim reserved for several is refused at prepare,
    /// DESIGN §3), so this holds the one pod kubelet prepared the claim for: kubelet prepares
    /// a claim only once the scheduler reserved it for a pod it is starting. A repeated
    /// prepare answers from the record without an API call (the fast path) and does not
    /// refresh the list: a pod that is added to `reservedFor` later does not get the
    /// interface. That cannot happen for a claim used by one pod; kubelet unprepares the
    /// claim once no pod on the node uses it, and a new pod's prepare reads it afresh.
    /// Older records have no list (empty): their claims attach to no pod until prepared
    /// again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<PodConsumer>,
    /// `metadata.generation` at prepare, for the status conditions' `observedGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// This claim's position in its pod's `spec.resourceClaims`, read with one Pod GET at
    /// prepare so default interface names follow the pod's order (DESIGN §3) without an API
    /// call on the sandbox path. `None` when the pod could not be found, and in records of
    /// the first release (format version 1): those fall back to claim-name order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_index: Option<u32>,
    /// The pod's `spec.resourceClaims[].name` of a claim made from a template (annotation
    /// `resource.kubernetes.io/pod-claim-name`): the container path of its device metadata
    /// uses it. Absent for claims named by the pod and in records before version 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
}

/// A pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodConsumer {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// One prepared device: the attachment's plan input (resolved config, host interface,
/// addresses); the attach step derives its netlink steps from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaimDevice {
    /// Request name of the allocation result.
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// `shareID` of a shared device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Host interface (the parent for shared and slot devices).
    pub if_name: String,
    /// The validated config with defaults.
    pub config: ResolvedNetworkConfig,
    /// Interface addresses (static ones, or the pool lease), CIDR form with host bits.
    pub addresses: Vec<IpNetwork>,
    /// How the device was offered (exclusive, shared, slot); older records lack it and the
    /// attach derives it from the mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// The device type at prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DeviceKind>,
    /// The host interface's MTU at prepare (the parent's for shared devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_mtu: Option<u32>,
    /// The device's published attributes at prepare (for its device metadata file); empty
    /// in records before version 3.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, AttributeValue>,
    /// CDI device ids returned to kubelet with this device: the device metadata of its
    /// request, on the first device of each top-level request. Kept so a repeated prepare
    /// answers the same; empty when metadata is off and in records before version 3.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_device_ids: Vec<String>,
    /// Mode `sriov-vf`: the VF on its PF and its settings as found before prepare changed
    /// them, set back at unprepare in the same boot (records before version 5 have none: no
    /// release before it prepared `sriov-vf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<PreparedVf>,
    /// Mode `vfio`: the PCI function bound to vfio-pci and its IOMMU group (absent in
    /// records of releases before mode `vfio`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio: Option<super::vfio::PreparedVfio>,
    /// `ethtool` settings of an exclusive device and the values they replaced (absent when
    /// the config has none, and in records of releases before `ethtool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<super::ethtool::PreparedEthtool>,
}

/// The VF of a `sriov-vf` device and its settings before the claim (DESIGN §6: identified by
/// PCI address, "before" values of another boot never written back; decision 0018).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedVf {
    /// The VF on its PF as named at prepare: for messages only (records before version 6:
    /// what the start-up migration looks the PCI address up from).
    #[serde(flatten)]
    pub vf: VfRef,
    /// The VF's PCI address, its identity: its PF's current name and its index are looked up
    /// from it whenever the VF is used, because a PF can get another name at boot. Absent in
    /// records before version 6 until the start-up migration found it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::vf::pci_serde")]
    pub pci: Option<PciAddress>,
    /// The boot `before` was read in (`/proc/sys/kernel/random/boot_id`). A reboot resets the
    /// VF, so values of another boot are never set back: the VF keeps what the boot gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// A record of a release before format 3 whose VF could not be identified at the
    /// upgrade: kept for the claim, never set back, never re-applied.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unresolved: bool,
    /// Its settings as read before the first change (in boot `boot_id`).
    pub before: VfState,
}

impl PreparedClaim {
    /// The answer kubelet gets (the same on every repeat). `request_names` carry the
    /// top-level request: kubelet injects a device's CDI ids into the containers whose
    /// `resources.claims[].request` is in that list, and containers can only name top-level
    /// requests (a `firstAvailable` result `net/fast` is requested as `net`).
    #[must_use]
    pub fn kubelet_devices(&self) -> Vec<PreparedDevice> {
        self.devices
            .iter()
            .map(|d| PreparedDevice {
                request_names: vec![metadata::top_level(&d.request).to_owned()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: d.cdi_device_ids.clone(),
                share_id: d.share_id.clone(),
            })
            .collect()
    }
}
