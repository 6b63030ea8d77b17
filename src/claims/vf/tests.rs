//! VF settings against a fake PF that behaves like igb: MAC, VLAN with `QoS`, spoof checking,
//! trust and a maximum rate are set; link state answers `EOPNOTSUPP`, a minimum rate
//! `EINVAL`, 802.1ad `EPROTONOSUPPORT`, a maximum rate above the PF's link speed `EINVAL`
//! (`igb_ndo_set_vf_bw`).

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::sync::Mutex;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use super::*;
use crate::model::device::PciAddress;
use crate::model::network_config::{
    Addressing, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
};

/// An igb-like PF with one VF.
pub(crate) struct FakePf {
    state: Mutex<VfState>,
    pub(crate) sent: Mutex<Vec<VfChange>>,
}

impl FakePf {
    pub(crate) fn new(state: VfState) -> Self {
        Self { state: Mutex::new(state), sent: Mutex::new(Vec::new()) }
    }

    pub(crate) fn state(&self) -> VfState {
        *self.state.lock().unwrap()
    }
}

fn refused(errno: i32) -> VfPortError {
    VfPortError {
        op: "RTM_SETLINK".into(),
        errno: Some(errno),
        message: std::io::Error::from_raw_os_error(errno).to_string(),
    }
}

impl VfPort for FakePf {
    fn read<'a>(&'a self, _vf: &'a VfRef) -> BoxFuture<'a, Result<VfState, VfPortError>> {
        async move { Ok(self.state()) }.boxed()
    }

    fn set<'a>(
        &'a self,
        _vf: &'a VfRef,
        change: VfChange,
    ) -> BoxFuture<'a, Result<(), VfPortError>> {
        async move {
            self.sent.lock().unwrap().push(change);
            let mut state = self.state.lock().unwrap();
            match change {
                VfChange::Mac(mac) => state.mac = mac,
                VfChange::Vlan { protocol: VfVlanProtocol::Ieee8021Ad, .. } => {
                    return Err(refused(EPROTONOSUPPORT));
                }
                VfChange::Vlan { id, qos, protocol } => {
                    (state.vlan, state.qos, state.vlan_protocol) = (id, qos, protocol);
                }
                VfChange::SpoofCheck(on) => state.spoof_check = Some(on),
                VfChange::Trust(on) => state.trust = Some(on),
                VfChange::Rate { min_mbps, .. } if min_mbps != 0 => return Err(refused(22)),
                // igb: a maximum above the PF's link speed (1000 Mb/s here) is EINVAL.
                VfChange::Rate { max_mbps, .. } if max_mbps > 1000 => return Err(refused(22)),
                VfChange::Rate { max_mbps, .. } => state.max_tx_rate_mbps = max_mbps,
                VfChange::LinkState(_) => return Err(refused(EOPNOTSUPP)),
            }
            Ok(())
        }
        .boxed()
    }

    fn set_netdev_mac<'a>(
        &'a self,
        _if_name: &'a str,
        _mac: MacAddr,
    ) -> BoxFuture<'a, Result<(), VfPortError>> {
        async move { Ok(()) }.boxed()
    }

    fn pci_address<'a>(
        &'a self,
        _vf: &'a VfRef,
    ) -> BoxFuture<'a, Result<Option<PciAddress>, VfPortError>> {
        async move { Ok(Some(FAKE_PF_VF)) }.boxed()
    }

    fn locate(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfRef>, VfPortError>> {
        let found = (pci == FAKE_PF_VF).then(|| VfRef { pf: "eth9".into(), index: 1 });
        async move { Ok(found) }.boxed()
    }

    fn boot_id(&self) -> Result<String, VfPortError> {
        Ok("boot-0".into())
    }
}

/// The PCI address of [`FakePf`]'s one VF (VF 1 of `eth9`).
pub(crate) const FAKE_PF_VF: PciAddress = PciAddress { domain: 0, bus: 9, device: 0, function: 1 };

/// A host with several PFs and their VFs, by PCI address, that can reboot: every VF comes
/// back blank ([`fresh`]) with a new boot id, and the PFs may come back under other names.
/// Takes every setting; records each `set` with the VF it went to.
pub(crate) struct FakeHost {
    state: Mutex<HostState>,
    pub(crate) sent: Mutex<Vec<(VfRef, VfChange)>>,
    /// The VFs' netdevs by PCI address (none unless [`Self::name_netdev`] gave one).
    netdevs: Mutex<Vec<(PciAddress, String)>>,
    /// Each MAC written to a netdev, with the name it went to.
    pub(crate) netdev_macs: Mutex<Vec<(String, MacAddr)>>,
    /// A `set` this matches is refused with `EINVAL` (after being recorded in `sent`).
    pub(crate) refuse: Mutex<Option<RefuseWhen>>,
}

/// Which VF changes the fake host refuses.
pub(crate) type RefuseWhen = fn(&VfChange) -> bool;

struct HostState {
    boot: u32,
    vfs: Vec<(PciAddress, VfRef, VfState)>,
}

impl FakeHost {
    /// VFs `(pci, pf, index, state)`.
    pub(crate) fn new(vfs: &[(&str, &str, u32, VfState)]) -> Self {
        let vfs = vfs
            .iter()
            .map(|(pci, pf, index, state)| {
                (pci.parse().unwrap(), VfRef { pf: (*pf).into(), index: *index }, *state)
            })
            .collect();
        Self {
            state: Mutex::new(HostState { boot: 1, vfs }),
            sent: Mutex::new(Vec::new()),
            netdevs: Mutex::new(Vec::new()),
            netdev_macs: Mutex::new(Vec::new()),
            refuse: Mutex::new(None),
        }
    }

    /// The VF at `pci` has a netdev named `name` now (as udev names it at each boot).
    pub(crate) fn name_netdev(&self, pci: &str, name: &str) {
        let pci: PciAddress = pci.parse().unwrap();
        let mut netdevs = self.netdevs.lock().unwrap();
        netdevs.retain(|(p, _)| *p != pci);
        netdevs.push((pci, name.to_owned()));
    }

    /// The settings of the VF at `pci`.
    pub(crate) fn state_of(&self, pci: &str) -> VfState {
        let pci: PciAddress = pci.parse().unwrap();
        self.state.lock().unwrap().vfs.iter().find(|(p, _, _)| *p == pci).unwrap().2
    }

    /// Sets the VF at `pci` as an administrator would.
    pub(crate) fn configure(&self, pci: &str, state: VfState) {
        let pci: PciAddress = pci.parse().unwrap();
        let mut host = self.state.lock().unwrap();
        host.vfs.iter_mut().find(|(p, _, _)| *p == pci).unwrap().2 = state;
    }

    /// A reboot: a new boot id, every VF blank, and each PF named in `renames` (`(pci of a
    /// VF, its PF's new name)`) under its new name.
    pub(crate) fn reboot(&self, renames: &[(&str, &str)]) {
        let mut host = self.state.lock().unwrap();
        host.boot += 1;
        let renames: Vec<(PciAddress, String)> =
            renames.iter().map(|(pci, pf)| (pci.parse().unwrap(), (*pf).to_owned())).collect();
        for (pci, vf, state) in &mut host.vfs {
            *state = fresh();
            if let Some((_, pf)) = renames.iter().find(|(p, _)| p == pci) {
                vf.pf.clone_from(pf);
            }
        }
    }
}

impl VfPort for FakeHost {
    fn read<'a>(&'a self, vf: &'a VfRef) -> BoxFuture<'a, Result<VfState, VfPortError>> {
        let found = self.state.lock().unwrap().vfs.iter().find(|(_, v, _)| v == vf).map(|e| e.2);
        async move { found.ok_or_else(|| refused(19)) }.boxed()
    }

    fn set<'a>(
        &'a self,
        vf: &'a VfRef,
        change: VfChange,
    ) -> BoxFuture<'a, Result<(), VfPortError>> {
        async move {
            self.sent.lock().unwrap().push((vf.clone(), change));
            if self.refuse.lock().unwrap().is_some_and(|refuse| refuse(&change)) {
                return Err(refused(22));
            }
            let mut host = self.state.lock().unwrap();
            let state = &mut host.vfs.iter_mut().find(|(_, v, _)| v == vf).ok_or(refused(19))?.2;
            match change {
                VfChange::Mac(mac) => state.mac = mac,
                VfChange::Vlan { id, qos, protocol } => {
                    (state.vlan, state.qos, state.vlan_protocol) = (id, qos, protocol);
                }
                VfChange::SpoofCheck(on) => state.spoof_check = Some(on),
                VfChange::Trust(on) => state.trust = Some(on),
                VfChange::Rate { min_mbps, max_mbps } => {
                    (state.min_tx_rate_mbps, state.max_tx_rate_mbps) = (min_mbps, max_mbps);
                }
                VfChange::LinkState(link) => state.link_state = link,
            }
            Ok(())
        }
        .boxed()
    }

    fn set_netdev_mac<'a>(
        &'a self,
        if_name: &'a str,
        mac: MacAddr,
    ) -> BoxFuture<'a, Result<(), VfPortError>> {
        async move {
            self.netdev_macs.lock().unwrap().push((if_name.to_owned(), mac));
            // ENODEV for a name no VF netdev has (named ones only).
            let named = self.netdevs.lock().unwrap().iter().any(|(_, n)| n == if_name);
            if named { Ok(()) } else { Err(refused(19)) }
        }
        .boxed()
    }

    fn netdev(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<String>, VfPortError>> {
        let found =
            self.netdevs.lock().unwrap().iter().find(|(p, _)| *p == pci).map(|e| e.1.clone());
        async move { Ok(found) }.boxed()
    }

    fn pci_address<'a>(
        &'a self,
        vf: &'a VfRef,
    ) -> BoxFuture<'a, Result<Option<PciAddress>, VfPortError>> {
        let found = self.state.lock().unwrap().vfs.iter().find(|(_, v, _)| v == vf).map(|e| e.0);
        async move { Ok(found) }.boxed()
    }

    fn locate(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfRef>, VfPortError>> {
        let found =
            self.state.lock().unwrap().vfs.iter().find(|(p, _, _)| *p == pci).map(|e| e.1.clone());
        async move { Ok(found) }.boxed()
    }

    fn boot_id(&self) -> Result<String, VfPortError> {
        Ok(format!("boot-{}", self.state.lock().unwrap().boot))
    }
}

fn vf() -> VfRef {
    VfRef { pf: "enp1s0".into(), index: 1 }
}

/// What igb reports for a VF nobody configured.
pub(crate) fn fresh() -> VfState {
    VfState {
        mac: MacAddr([0; 6]),
        vlan: 0,
        qos: 0,
        vlan_protocol: VfVlanProtocol::Ieee8021Q,
        spoof_check: Some(true),
        trust: Some(false),
        min_tx_rate_mbps: 0,
        max_tx_rate_mbps: 0,
        link_state: VfLinkState::Auto,
    }
}

fn config(mac: Option<&str>, vlan: Option<u16>, sriov: SriovSettings) -> ResolvedNetworkConfig {
    ResolvedNetworkConfig {
        pod_network: None,
        mode: ResolvedMode::SriovVf,
        interface: ResolvedInterface {
            name: None,
            mtu: 1500,
            hardware_address: mac.map(|m| m.parse().unwrap()),
        },
        addressing: Addressing::None,
        routes: vec![],
        vlan,
        sriov: Some(sriov),
        stats: true,
        routing: crate::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    }
}

fn defaults() -> SriovSettings {
    SriovSettings {
        qos: 0,
        spoof_check: true,
        trust: false,
        max_tx_rate_mbps: 0,
        min_tx_rate_mbps: 0,
        link_state: VfLinkState::Auto,
        vlan_protocol: VfVlanProtocol::Ieee8021Q,
    }
}

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    futures::executor::block_on(future)
}

#[test]
fn defaults_on_a_fresh_vf_send_nothing_so_a_nic_without_link_state_control_takes_them() {
    let pf = FakePf::new(fresh());
    let before =
        run(apply(&pf, &vf(), "enp1s0v1", &wanted(&fresh(), &config(None, None, defaults()))));
    assert_eq!(before.unwrap(), fresh());
    assert!(pf.sent.lock().unwrap().is_empty());
}

#[test]
fn each_field_goes_in_its_own_message_and_unprepare_sets_back_exactly_what_was_found() {
    // Not the defaults: restore must give these back, not assumed ones.
    let found = VfState {
        mac: "02:00:00:00:00:aa".parse().unwrap(),
        vlan: 7,
        qos: 3,
        spoof_check: Some(false),
        trust: Some(true),
        max_tx_rate_mbps: 100,
        ..fresh()
    };
    let pf = FakePf::new(found);
    let sriov = SriovSettings { qos: 5, max_tx_rate_mbps: 200, ..defaults() };
    let cfg = config(Some("02:00:00:00:00:bb"), Some(42), sriov);
    let want = wanted(&found, &cfg);
    assert_eq!(run(apply(&pf, &vf(), "enp1s0v1", &want)).unwrap(), found);
    assert_eq!(pf.state(), want);
    assert_eq!(
        *pf.sent.lock().unwrap(),
        [
            VfChange::Mac("02:00:00:00:00:bb".parse().unwrap()),
            VfChange::Vlan { id: 42, qos: 5, protocol: VfVlanProtocol::Ieee8021Q },
            VfChange::SpoofCheck(true),
            VfChange::Trust(false),
            VfChange::Rate { min_mbps: 0, max_mbps: 200 },
        ]
    );
    run(restore(&pf, &vf(), &found)).unwrap();
    assert_eq!(pf.state(), found);
    // A second restore (kubelet repeats unprepare) finds nothing to do.
    pf.sent.lock().unwrap().clear();
    run(restore(&pf, &vf(), &found)).unwrap();
    assert!(pf.sent.lock().unwrap().is_empty());
}

#[test]
fn a_field_the_nic_cannot_set_is_named_and_the_fields_before_it_are_set_back() {
    let cases = [
        (
            SriovSettings { link_state: VfLinkState::Enable, ..defaults() },
            "sriov.linkState: enable: not supported by this NIC (VF 1 of enp1s0: ",
        ),
        (
            SriovSettings { min_tx_rate_mbps: 10, max_tx_rate_mbps: 100, ..defaults() },
            "sriov.minTxRateMbps: 10: the PF refused it (VF 1 of enp1s0: ",
        ),
        (
            SriovSettings { vlan_protocol: VfVlanProtocol::Ieee8021Ad, ..defaults() },
            "sriov.vlanProtocol: 802.1ad: not supported by this NIC (VF 1 of enp1s0: ",
        ),
    ];
    for (sriov, message) in cases {
        let pf = FakePf::new(fresh());
        let sriov = SriovSettings { trust: true, qos: 1, ..sriov };
        let cfg = config(Some("02:00:00:00:00:bb"), Some(9), sriov);
        let err = run(apply(&pf, &vf(), "enp1s0v1", &wanted(&fresh(), &cfg))).unwrap_err();
        assert!(err.to_string().starts_with(message), "{err}");
        assert_eq!(pf.state(), fresh(), "{message}: everything set back");
    }
}

#[test]
fn a_flag_the_driver_does_not_report_is_refused_only_when_the_claim_changes_it() {
    let unreported = VfState { trust: None, ..fresh() };
    let pf = FakePf::new(unreported);
    let cfg = config(None, None, defaults());
    let want = wanted(&unreported, &cfg);
    let err = run(apply(&pf, &vf(), "enp1s0v1", &want)).unwrap_err();
    assert!(matches!(err, VfError::NotReported { field: "sriov.trust", .. }), "{err}");
    assert!(pf.sent.lock().unwrap().is_empty());
}

#[test]
fn a_restore_that_fails_names_the_field_and_still_tries_the_others() {
    let found = VfState { link_state: VfLinkState::Enable, trust: Some(true), ..fresh() };
    let pf = FakePf::new(fresh());
    let err = run(restore(&pf, &vf(), &found)).unwrap_err();
    assert!(matches!(err, VfError::Restore { field: "sriov.linkState", .. }), "{err}");
    assert_eq!(pf.state().trust, Some(true));
}

fn limited(sriov: Option<SriovSettings>, limit: &str) -> ResolvedNetworkConfig {
    use crate::model::bandwidth::{BitsPerSecond, IngressPolicy, ResolvedBandwidth};
    let rate = BitsPerSecond::parse(limit).unwrap();
    ResolvedNetworkConfig {
        sriov,
        bandwidth: Some(ResolvedBandwidth::from_limit(Some(rate), IngressPolicy::None)),
        ..config(None, Some(5), defaults())
    }
}

#[test]
fn a_bandwidth_limit_is_the_vfs_max_tx_rate_and_is_set_back_as_found() {
    // An administrator's rate before the claim: restore gives it back, not 0.
    let found = VfState { max_tx_rate_mbps: 100, ..fresh() };
    for sriov in [None, Some(defaults())] {
        let cfg = limited(sriov, "300M");
        assert_eq!(ceiling_mbps(&cfg), Some(300));
        let want = wanted(&found, &cfg);
        assert_eq!((want.max_tx_rate_mbps, want.min_tx_rate_mbps), (300, 0));
        let pf = FakePf::new(found);
        run(apply(&pf, &vf(), "enp1s0v1", &want)).unwrap();
        assert_eq!(pf.state().max_tx_rate_mbps, 300);
        assert!(pf.sent.lock().unwrap().contains(&VfChange::Rate { min_mbps: 0, max_mbps: 300 }));
        run(restore(&pf, &vf(), &found)).unwrap();
        assert_eq!(pf.state(), found);
    }
    // Without a ceiling the rate is the config's (0: none), whatever was found.
    assert_eq!(ceiling_mbps(&config(None, None, defaults())), None);
    assert_eq!(wanted(&found, &config(None, None, defaults())).max_tx_rate_mbps, 0);
    // `sriov.maxTxRateMbps` sets the rate itself (validation refuses both together).
    let both = limited(Some(SriovSettings { max_tx_rate_mbps: 50, ..defaults() }), "300M");
    assert_eq!((ceiling_mbps(&both), wanted(&found, &both).max_tx_rate_mbps), (None, 50));
}

#[test]
fn a_rate_the_pf_refuses_names_bandwidth_limit_and_the_fields_before_it_are_set_back() {
    // Above the PF's 1000 Mb/s link: igb answers EINVAL. VLAN 5 went first and is set back.
    let cfg = limited(None, "2G");
    let pf = FakePf::new(fresh());
    let err = run(apply(&pf, &vf(), "enp1s0v1", &wanted(&fresh(), &cfg))).unwrap_err();
    assert!(matches!(err, VfError::Refused { field: "sriov.maxTxRateMbps", .. }), "{err}");
    let err = name_ceiling(err, &cfg).to_string();
    assert!(
        err.starts_with(
            "bandwidth.limit: 2G (the VF's max_tx_rate 2000 Mb/s): the PF refused it (VF 1 of enp1s0: "
        ),
        "{err}"
    );
    assert_eq!(pf.state(), fresh(), "VLAN 5 set back");
    // Another field's error, or a rate of sriov.maxTxRateMbps, keeps its own name.
    let link = VfError::Unsupported {
        field: "sriov.linkState",
        value: "enable".into(),
        vf: vf(),
        source: refused(EOPNOTSUPP),
    };
    assert_eq!(name_ceiling(link.clone(), &cfg), link);
    let own = VfError::Refused {
        field: "sriov.maxTxRateMbps",
        value: "2000".into(),
        vf: vf(),
        source: refused(22),
    };
    let set = config(None, None, SriovSettings { max_tx_rate_mbps: 2000, ..defaults() });
    assert_eq!(name_ceiling(own.clone(), &set), own);
}
