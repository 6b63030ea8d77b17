//! `claims::vf::VfPort` over rtnetlink on the PF: a VF's settings are attributes of its PF's
//! link. Read with `RTM_GETLINK` and `IFLA_EXT_MASK` `RTEXT_FILTER_VF` (without the mask the
//! kernel leaves `IFLA_VFINFO_LIST` out); each change is one `RTM_SETLINK` on the PF carrying
//! one `IFLA_VF_*` inside `IFLA_VFINFO_LIST`/`IFLA_VF_INFO` (`do_setvfinfo` calls the PF
//! driver's `ndo_set_vf_*` for it, and a driver without one answers `EOPNOTSUPP`).
//!
//! VFs are identified by PCI address: the PF's name and the VF's index are looked up from it
//! in sysfs at each use (`host::sysfs`), because a PF can get another name at boot. The boot
//! id comes from `/proc/sys/kernel/random/boot_id` (a new random UUID at every boot).

use futures::FutureExt as _;
use futures::future::BoxFuture;
use netlink_packet_route::link::{
    LinkAttribute, LinkExtentMask, LinkMessage, LinkVfInfo, VfInfo, VfInfoLinkState, VfInfoMac,
    VfInfoRate, VfInfoSpoofCheck, VfInfoTrust, VfLinkState as NlVfLinkState, VfVlan, VfVlanInfo,
    VlanProtocol,
};
use rtnetlink::{Handle, LinkUnspec};
use std::path::PathBuf;

use crate::claims::vf::{VfChange, VfPort, VfPortError, VfRef, VfState};
use crate::host::netlink::{HostNetlink, link_by_name};
use crate::host::sysfs::{Sysfs, SysfsError};
use crate::model::device::PciAddress;
use crate::model::network_config::{MacAddr, VfLinkState, VfVlanProtocol};

/// The kernel's id of the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// VF settings through the daemon's netlink socket in the host netns (where the PFs are).
#[derive(Clone, Debug)]
pub struct NetlinkVfSettings {
    handle: Handle,
    sysfs: Sysfs,
    boot_id: PathBuf,
}

impl NetlinkVfSettings {
    /// On the host netns socket of `host`, with `/sys` and the kernel's boot id.
    #[must_use]
    pub fn new(host: &HostNetlink) -> Self {
        Self::with_roots(host, Sysfs::default(), BOOT_ID)
    }

    /// As [`Self::new`] with another sysfs and boot id file (tests).
    #[must_use]
    pub fn with_roots(host: &HostNetlink, sysfs: Sysfs, boot_id: impl Into<PathBuf>) -> Self {
        Self { handle: host.handle().clone(), sysfs, boot_id: boot_id.into() }
    }

    /// The PF's link message with its VF list.
    async fn pf_link(&self, pf: &str) -> Result<LinkMessage, VfPortError> {
        let op = format!("RTM_GETLINK {pf} with RTEXT_FILTER_VF");
        link_by_name(&self.handle, pf, &[LinkExtentMask::Vf])
            .await
            .map_err(|err| port_error(&op, err))?
            .ok_or(VfPortError { op, errno: None, message: "no answer".to_owned() })
    }
}

fn port_error(op: &str, err: rtnetlink::Error) -> VfPortError {
    match err {
        rtnetlink::Error::NetlinkError(message) if message.raw_code() != 0 => {
            let errno = -message.raw_code();
            VfPortError {
                op: op.to_owned(),
                errno: Some(errno),
                message: std::io::Error::from_raw_os_error(errno).to_string(),
            }
        }
        other => VfPortError { op: op.to_owned(), errno: None, message: other.to_string() },
    }
}

/// The settings of VF `index` in a PF's `IFLA_VFINFO_LIST`, `None` when the list has no
/// entry for it.
#[must_use]
pub fn vf_state(pf: &LinkMessage, index: u32) -> Option<VfState> {
    let entries = pf.attributes.iter().find_map(|a| match a {
        LinkAttribute::VfInfoList(list) => Some(list),
        _ => None,
    })?;
    let entry = entries.iter().find(|LinkVfInfo(infos)| {
        infos.iter().any(|info| matches!(info, VfInfo::Mac(mac) if mac.vf_id == index))
    })?;
    let mut state = VfState {
        mac: MacAddr([0; 6]),
        vlan: 0,
        qos: 0,
        vlan_protocol: VfVlanProtocol::Ieee8021Q,
        spoof_check: None,
        trust: None,
        min_tx_rate_mbps: 0,
        max_tx_rate_mbps: 0,
        link_state: VfLinkState::Auto,
    };
    for info in &entry.0 {
        match info {
            VfInfo::Mac(mac) => {
                let mut octets = [0; 6];
                octets.copy_from_slice(&mac.mac[..6]);
                state.mac = MacAddr(octets);
            }
            VfInfo::Vlan(vlan) => {
                state.vlan = u16::try_from(vlan.vlan_id).unwrap_or(u16::MAX);
                state.qos = u8::try_from(vlan.qos).unwrap_or(u8::MAX);
            }
            VfInfo::VlanList(list) => {
                if let Some(VfVlan::Info(info)) = list.first() {
                    state.vlan_protocol = match info.protocol {
                        VlanProtocol::Ieee8021Ad => VfVlanProtocol::Ieee8021Ad,
                        _ => VfVlanProtocol::Ieee8021Q,
                    };
                }
            }
            VfInfo::Rate(rate) => {
                state.min_tx_rate_mbps = rate.min_tx_rate;
                state.max_tx_rate_mbps = rate.max_tx_rate;
            }
            // netlink-packet-route reads the kernel's -1 ("the driver does not report it")
            // as false.
            VfInfo::SpoofCheck(check) => state.spoof_check = Some(check.enabled),
            VfInfo::Trust(trust) => state.trust = Some(trust.enabled),
            VfInfo::LinkState(link) => {
                state.link_state = match link.state {
                    NlVfLinkState::Enable => VfLinkState::Enable,
                    NlVfLinkState::Disable => VfLinkState::Disable,
                    _ => VfLinkState::Auto,
                };
            }
            _ => {}
        }
    }
    Some(state)
}

/// The `IFLA_VF_*` attribute of one change, and its name for errors.
fn vf_info(index: u32, change: VfChange) -> (VfInfo, &'static str) {
    match change {
        VfChange::Mac(mac) => (VfInfo::Mac(VfInfoMac::new(index, &mac.0)), "IFLA_VF_MAC"),
        VfChange::Vlan { id, qos, protocol } => {
            let protocol = match protocol {
                VfVlanProtocol::Ieee8021Q => VlanProtocol::Ieee8021Q,
                VfVlanProtocol::Ieee8021Ad => VlanProtocol::Ieee8021Ad,
            };
            let info = VfVlanInfo::new(index, u32::from(id), u32::from(qos), protocol);
            (VfInfo::VlanList(vec![VfVlan::Info(info)]), "IFLA_VF_VLAN_LIST")
        }
        VfChange::SpoofCheck(on) => {
            (VfInfo::SpoofCheck(VfInfoSpoofCheck::new(index, on)), "IFLA_VF_SPOOFCHK")
        }
        VfChange::Trust(on) => (VfInfo::Trust(VfInfoTrust::new(index, on)), "IFLA_VF_TRUST"),
        VfChange::Rate { min_mbps, max_mbps } => {
            (VfInfo::Rate(VfInfoRate::new(index, min_mbps, max_mbps)), "IFLA_VF_RATE")
        }
        VfChange::LinkState(state) => {
            let state = match state {
                VfLinkState::Auto => NlVfLinkState::Auto,
                VfLinkState::Enable => NlVfLinkState::Enable,
                VfLinkState::Disable => NlVfLinkState::Disable,
            };
            (VfInfo::LinkState(VfInfoLinkState::new(index, state)), "IFLA_VF_LINK_STATE")
        }
    }
}

impl VfPort for NetlinkVfSettings {
    fn read<'a>(&'a self, vf: &'a VfRef) -> BoxFuture<'a, Result<VfState, VfPortError>> {
        async move {
            let link = self.pf_link(&vf.pf).await?;
            vf_state(&link, vf.index).ok_or_else(|| VfPortError {
                op: format!("RTM_GETLINK {} with RTEXT_FILTER_VF", vf.pf),
                errno: None,
                message: format!("the PF reports no VF {}", vf.index),
            })
        }
        .boxed()
    }

    fn set<'a>(
        &'a self,
        vf: &'a VfRef,
        change: VfChange,
    ) -> BoxFuture<'a, Result<(), VfPortError>> {
        async move {
            let index = self.pf_link(&vf.pf).await?.header.index;
            let (info, name) = vf_info(vf.index, change);
            let op = format!("RTM_SETLINK {name} on {} VF {}", vf.pf, vf.index);
            let message = LinkUnspec::new_with_index(index)
                .append_extra_attribute(LinkAttribute::VfInfoList(vec![LinkVfInfo(vec![info])]))
                .build();
            self.handle.link().set(message).execute().await.map_err(|err| port_error(&op, err))
        }
        .boxed()
    }

    fn set_netdev_mac<'a>(
        &'a self,
        if_name: &'a str,
        mac: MacAddr,
    ) -> BoxFuture<'a, Result<(), VfPortError>> {
        async move {
            let op = format!("RTM_SETLINK IFLA_ADDRESS {mac} on {if_name}");
            let message = LinkUnspec::new_with_name(if_name).address(mac.0.to_vec()).build();
            self.handle.link().set(message).execute().await.map_err(|err| port_error(&op, err))
        }
        .boxed()
    }

    fn pci_address<'a>(
        &'a self,
        vf: &'a VfRef,
    ) -> BoxFuture<'a, Result<Option<PciAddress>, VfPortError>> {
        // A few small sysfs reads: not worth a blocking-pool hop.
        let found = self.sysfs.vf_pci_address(&vf.pf, vf.index).map_err(|err| {
            sysfs_error(format!("reading the PCI address of VF {} of {}", vf.index, vf.pf), &err)
        });
        async move { found }.boxed()
    }

    fn locate(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfRef>, VfPortError>> {
        let found = self
            .sysfs
            .locate_vf(pci)
            .map(|found| found.map(|(pf, index)| VfRef { pf, index }))
            .map_err(|err| sysfs_error(format!("finding the PF of the VF at PCI {pci}"), &err));
        async move { found }.boxed()
    }

    fn netdev(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<String>, VfPortError>> {
        let found = self
            .sysfs
            .pci_netdev(pci)
            .map_err(|err| sysfs_error(format!("finding the netdev of the VF at PCI {pci}"), &err));
        async move { found }.boxed()
    }

    fn boot_id(&self) -> Result<String, VfPortError> {
        std::fs::read_to_string(&self.boot_id).map(|text| text.trim().to_owned()).map_err(|err| {
            VfPortError {
                op: format!("reading {}", self.boot_id.display()),
                errno: err.raw_os_error(),
                message: err.to_string(),
            }
        })
    }
}

fn sysfs_error(op: String, err: &SysfsError) -> VfPortError {
    VfPortError { op, errno: err.source.raw_os_error(), message: err.to_string() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use netlink_packet_route::link::VfInfoVlan;

    use super::*;

    #[test]
    fn a_pf_report_gives_each_vf_its_own_settings() {
        let entry = |index: u32, vlan: u32, trust: bool| {
            LinkVfInfo(vec![
                VfInfo::Mac(VfInfoMac::new(index, &[2, 0, 0, 0, 0, 7])),
                VfInfo::Vlan(VfInfoVlan::new(index, vlan, 3)),
                VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
                    index,
                    vlan,
                    3,
                    VlanProtocol::Ieee8021Q,
                ))]),
                VfInfo::Rate(VfInfoRate::new(index, 0, 100)),
                VfInfo::SpoofCheck(VfInfoSpoofCheck::new(index, false)),
                VfInfo::Trust(VfInfoTrust::new(index, trust)),
                VfInfo::LinkState(VfInfoLinkState::new(index, NlVfLinkState::Auto)),
            ])
        };
        let mut link = LinkMessage::default();
        link.attributes
            .push(LinkAttribute::VfInfoList(vec![entry(0, 5, false), entry(1, 7, true)]));
        let state = vf_state(&link, 1).unwrap();
        assert_eq!(
            state,
            VfState {
                mac: MacAddr([2, 0, 0, 0, 0, 7]),
                vlan: 7,
                qos: 3,
                vlan_protocol: VfVlanProtocol::Ieee8021Q,
                spoof_check: Some(false),
                trust: Some(true),
                min_tx_rate_mbps: 0,
                max_tx_rate_mbps: 100,
                link_state: VfLinkState::Auto,
            }
        );
        assert_eq!(vf_state(&link, 0).unwrap().vlan, 5);
        assert_eq!(vf_state(&link, 2), None);
        assert_eq!(vf_state(&LinkMessage::default(), 0), None);
    }
}
