//! VF settings against a fake PF that behaves like igb: MAC, VLAN with `QoS`, spoof checking,
//! trust and a maximum rate are set; link state answers `EOPNOTSUPP`, a minimum rate
//! `EINVAL`, 802.1ad `EPROTONOSUPPORT`.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::sync::Mutex;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use super::*;
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
