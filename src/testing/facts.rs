//! [`DeviceFacts`] of made-up NICs: one literal ([`physical_nic`]) and the changes tests make
//! to it ([`FactsBuilder`]), so a new `DeviceFacts` field is filled in one place.

use crate::model::network_config::{DeviceFacts, DeviceKind, Sharing};

/// A physical NIC `if_name` as discovery reports a plain one: exclusive, MTU 1500 (68–9000),
/// not a VF, no children yet.
#[must_use]
pub fn physical_nic(if_name: &str) -> DeviceFacts {
    DeviceFacts {
        sharing: Sharing::Exclusive,
        kind: DeviceKind::Physical,
        if_name: if_name.to_owned(),
        mtu: 1500,
        min_mtu: 68,
        max_mtu: 9000,
        pf_mtu: None,
        passthru_children: 0,
        other_children: 0,
        ipvlan_children: 0,
        rdma: None,
    }
}

/// Changes to made-up facts, chained after [`physical_nic`]: `physical_nic("eth2").shared()`.
pub trait FactsBuilder: Sized {
    /// Offered with `sharing`.
    #[must_use]
    fn sharing(self, sharing: Sharing) -> Self;
    /// Offered as a shared parent (macvlan/ipvlan children).
    #[must_use]
    fn shared(self) -> Self {
        self.sharing(Sharing::Shared)
    }
    /// Offered as one slot of a shared parent.
    #[must_use]
    fn slot(self) -> Self {
        self.sharing(Sharing::Slot)
    }
    /// Of device type `kind`.
    #[must_use]
    fn kind(self, kind: DeviceKind) -> Self;
    /// An SR-IOV VF whose PF has MTU `pf_mtu`.
    #[must_use]
    fn vf(self, pf_mtu: u32) -> Self;
    /// Current MTU `mtu`.
    #[must_use]
    fn mtu(self, mtu: u32) -> Self;
    /// Accepting MTUs from `min` to `max`.
    #[must_use]
    fn mtu_range(self, min: u32, max: u32) -> Self;
    /// Carrying `passthru` macvlan children in passthru mode and `other` in other modes.
    #[must_use]
    fn macvlan_children(self, passthru: u32, other: u32) -> Self;
    /// Carrying `count` ipvlan children.
    #[must_use]
    fn ipvlan_children(self, count: u32) -> Self;
    /// With the RDMA function `rdma` (the parent's, for a shared device).
    #[must_use]
    fn rdma(self, rdma: crate::model::rdma::RdmaFacts) -> Self;
}

impl FactsBuilder for DeviceFacts {
    fn sharing(self, sharing: Sharing) -> Self {
        DeviceFacts { sharing, ..self }
    }

    fn kind(self, kind: DeviceKind) -> Self {
        DeviceFacts { kind, ..self }
    }

    fn vf(self, pf_mtu: u32) -> Self {
        DeviceFacts { kind: DeviceKind::SriovVf, pf_mtu: Some(pf_mtu), ..self }
    }

    fn mtu(self, mtu: u32) -> Self {
        DeviceFacts { mtu, ..self }
    }

    fn mtu_range(self, min: u32, max: u32) -> Self {
        DeviceFacts { min_mtu: min, max_mtu: max, ..self }
    }

    fn macvlan_children(self, passthru: u32, other: u32) -> Self {
        DeviceFacts { passthru_children: passthru, other_children: other, ..self }
    }

    fn ipvlan_children(self, count: u32) -> Self {
        DeviceFacts { ipvlan_children: count, ..self }
    }

    fn rdma(self, rdma: crate::model::rdma::RdmaFacts) -> Self {
        DeviceFacts { rdma: Some(rdma), ..self }
    }
}
