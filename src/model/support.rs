//! What this node can attach, as data the core decides with (DESIGN §2): the child link kinds
//! the node's kernel offers, probed once at start by `host::kernel_probe`, and the modes that
//! are refused with the reason, which `podnet::plan::node_support` derives from both. Pure data:
//! the probe's I/O stays in `host/`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::network_config::Mode;

/// What the start-up probe found out about one link kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "result")]
pub enum Probe {
    /// The kernel created and deleted such a link.
    Available,
    /// The kernel refused the link kind itself (`rtnl_newlink` answers `EOPNOTSUPP` when no
    /// `rtnl_link_ops` is registered for the kind, even after `request_module`): the module
    /// is not there.
    Missing {
        /// What the kernel answered.
        detail: String,
    },
    /// The probe could not tell (it was not run, or failed for another reason). The kind is
    /// then accepted at prepare: refusing every claim on a node that may well have the module
    /// would be worse than an attach error that names the errno.
    Unknown {
        /// Why the probe could not tell.
        detail: String,
    },
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Available => f.write_str("available"),
            Probe::Missing { detail } => write!(f, "missing ({detail})"),
            Probe::Unknown { detail } => write!(f, "unknown ({detail})"),
        }
    }
}

/// The link kinds whose support varies between kernels (modules Debian builds as `=m` that a
/// minimal kernel may lack). macvlan and veth are not probed: the driver's baseline needs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelSupport {
    /// `IFLA_INFO_KIND` `ipvlan` (module `ipvlan`).
    pub ipvlan: Probe,
    /// `IFLA_INFO_KIND` `vlan` (module `8021q`): VLAN sub-interfaces of shared parents.
    pub vlan: Probe,
    /// `IFLA_INFO_KIND` `vrf` (module `vrf`): `vrf` in a claim's config.
    #[serde(default = "Probe::not_probed")]
    pub vrf: Probe,
    /// Qdisc kind `fq` (module `sch_fq`): bandwidth ceilings by Earliest Departure Time,
    /// else by `tbf` (`attach::bandwidth`).
    #[serde(default = "Probe::not_probed")]
    pub fq: Probe,
}

impl KernelSupport {
    /// Nothing probed: every kind unknown (accepted at prepare).
    #[must_use]
    pub fn unprobed() -> Self {
        let unknown = || Probe::Unknown { detail: "not probed".to_owned() };
        Self { ipvlan: unknown(), vlan: unknown(), vrf: unknown(), fq: unknown() }
    }
}

impl Probe {
    /// [`Probe::Unknown`]: not probed.
    #[must_use]
    pub fn not_probed() -> Self {
        Probe::Unknown { detail: "not probed".to_owned() }
    }
}

/// Which modes and features prepare refuses on this node, each with the reason that ends up
/// in the claim's error. Built once at start (`podnet::plan::node_support`); everything not
/// listed is accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSupport {
    refused_modes: BTreeMap<&'static str, String>,
    refused_vlan: Option<String>,
    no_vrf: Option<String>,
    no_police: Option<String>,
}

impl NodeSupport {
    /// Everything accepted.
    #[must_use]
    pub fn everything() -> Self {
        Self::default()
    }

    /// Refuses `mode` with `why`; the first reason given for a mode is kept (the caller
    /// gives the most fundamental one first).
    #[must_use]
    pub fn refuse_mode(mut self, mode: Mode, why: impl Into<String>) -> Self {
        self.refused_modes.entry(mode.as_str()).or_insert_with(|| why.into());
        self
    }

    /// Refuses VLAN sub-interfaces of shared parents (`vlan` with macvlan or ipvlan) with
    /// `why`.
    #[must_use]
    pub fn refuse_vlan(mut self, why: impl Into<String>) -> Self {
        self.refused_vlan.get_or_insert_with(|| why.into());
        self
    }

    /// Why `mode` cannot be attached on this node, or `None` when it can.
    #[must_use]
    pub fn mode_refusal(&self, mode: Mode) -> Option<&str> {
        self.refused_modes.get(mode.as_str()).map(String::as_str)
    }

    /// Refuses `vrf` in a config with `why`.
    #[must_use]
    pub fn refuse_vrf(mut self, why: impl Into<String>) -> Self {
        self.no_vrf.get_or_insert_with(|| why.into());
        self
    }

    /// Why a VRF cannot be created on this node, or `None` when it can.
    #[must_use]
    pub fn vrf_refusal(&self) -> Option<&str> {
        self.no_vrf.as_deref()
    }

    /// Refuses `bandwidth.ingress: police` with `why` (the node's eBPF programs, which police,
    /// are not available).
    #[must_use]
    pub fn refuse_police(mut self, why: impl Into<String>) -> Self {
        self.no_police.get_or_insert_with(|| why.into());
        self
    }

    /// Why ingress cannot be policed on this node, or `None` when it can.
    #[must_use]
    pub fn police_refusal(&self) -> Option<&str> {
        self.no_police.as_deref()
    }

    /// Why a VLAN sub-interface cannot be created on this node, or `None` when it can.
    #[must_use]
    pub fn vlan_refusal(&self) -> Option<&str> {
        self.refused_vlan.as_deref()
    }
}
