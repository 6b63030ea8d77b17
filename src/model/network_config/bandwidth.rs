//! Validation of a config's `bandwidth` section against the allocated device (DESIGN §3,
//! issue 35): what can be checked before the allocation's consumed capacity is looked at.
//! The claim service completes the ceiling at prepare (`claims::bandwidth`).

use super::validate::{invalid, quoted};
use super::{ConfigError, DeviceFacts, Mode, NetworkConfig, ResolvedMode, Sharing};
use crate::model::bandwidth::{
    BANDWIDTH_STEP, BandwidthParseError, BitsPerSecond, IngressPolicy, ResolvedBandwidth,
};
use crate::model::support::NodeSupport;

/// Why a `bandwidth` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BandwidthRule {
    /// Not a bandwidth quantity.
    #[error("{0}")]
    Parse(#[from] BandwidthParseError),
    /// A zero limit; no ceiling is written by leaving the field out.
    #[error("must be above 0 (leave bandwidth.limit out for no ceiling)")]
    Zero,
    /// Slot devices are exclusive devices standing for one child each: the scheduler has no
    /// bandwidth capacity to count a share against (DESIGN §2).
    #[error(
        "the parent is published in slots mode (--sharing-mode slots, or auto without \
         consumable capacity), which cannot account bandwidth: use a cluster with \
         DRAConsumableCapacity, or leave bandwidth out"
    )]
    SlotsMode,
    /// A mode whose interface has no netdev in the pod to hold to a rate.
    #[error("mode {0} cannot enforce a bandwidth ceiling")]
    ModeCannotEnforce(Mode),
    /// A VF's rate is set in whole Mb/s (`IFLA_VF_RATE.max_tx_rate`).
    #[error("a VF's max_tx_rate is set in whole Mb/s: use a multiple of 1M")]
    VfWholeMbps,
    /// Two settings of one VF rate.
    #[error("sriov.maxTxRateMbps {0} sets the same VF rate: set one of the two")]
    VfRateTwice(u32),
    /// Above what the device can carry.
    #[error("above the {capacity} bit/s {what}")]
    AboveCapacity {
        /// The capacity.
        capacity: BitsPerSecond,
        /// Whose (`netclaim.dev/bandwidth capacity of parent eth1`, `link speed of eth3`).
        what: String,
    },
    /// Ingress policing needs a rate.
    #[error(
        "police needs a ceiling: set bandwidth.limit or request capacity netclaim.dev/bandwidth"
    )]
    PoliceWithoutCeiling,
    /// This node cannot police (its eBPF programs are not available).
    #[error("this node cannot police ingress: {0}; leave bandwidth.ingress out")]
    PoliceUnavailable(String),
    /// A VF's ceiling is the PF's hardware rate; nothing on the node sees its ingress.
    #[error(
        "ingress policing is not available with mode sriov-vf (its ceiling is the VF's \
         hardware max_tx_rate, set on the PF); leave bandwidth.ingress out"
    )]
    PoliceOnVf,
}

/// Resolves the `bandwidth` section of `cfg` for `mode` on `device`; `None` when the config
/// has none.
pub(super) fn resolve(
    cfg: &NetworkConfig,
    mode: ResolvedMode,
    device: &DeviceFacts,
    support: &NodeSupport,
) -> Result<Option<ResolvedBandwidth>, ConfigError> {
    let Some(section) = &cfg.bandwidth else { return Ok(None) };
    let refuse = |path: &str, value: String, rule: BandwidthRule| {
        invalid(path, value, super::Rule::Bandwidth(rule))
    };
    if device.sharing == Sharing::Slot {
        return Err(refuse("bandwidth", "slots".to_owned(), BandwidthRule::SlotsMode));
    }
    if !can_enforce(mode.mode()) {
        return Err(refuse(
            "bandwidth",
            mode.mode().to_string(),
            BandwidthRule::ModeCannotEnforce(mode.mode()),
        ));
    }
    // The programs police on the pod's interface. A VF gets no program (its egress ceiling
    // is the PF's `IFLA_VF_RATE`, and the CreateContainer gate hooks nothing on it), so a
    // policer there would be accepted and never enforced: refused instead.
    if section.ingress == Some(IngressPolicy::Police) {
        if mode == ResolvedMode::SriovVf {
            return Err(refuse(
                "bandwidth.ingress",
                "police".to_owned(),
                BandwidthRule::PoliceOnVf,
            ));
        }
        if let Some(why) = support.police_refusal() {
            let rule = BandwidthRule::PoliceUnavailable(why.to_owned());
            return Err(refuse("bandwidth.ingress", "police".to_owned(), rule));
        }
    }
    let limit = match &section.limit {
        None => None,
        Some(text) => {
            let value = quoted(&text.0);
            let rate =
                text.parse().map_err(|e| refuse("bandwidth.limit", value.clone(), e.into()))?;
            if rate == BitsPerSecond::ZERO {
                return Err(refuse("bandwidth.limit", value, BandwidthRule::Zero));
            }
            if mode == ResolvedMode::SriovVf {
                if !rate.get().is_multiple_of(BANDWIDTH_STEP.get()) {
                    return Err(refuse("bandwidth.limit", value, BandwidthRule::VfWholeMbps));
                }
                let set = cfg.sriov.as_ref().and_then(|s| s.max_tx_rate_mbps).unwrap_or(0);
                if set != 0 {
                    return Err(refuse("bandwidth.limit", value, BandwidthRule::VfRateTwice(set)));
                }
            }
            Some(rate)
        }
    };
    Ok(Some(ResolvedBandwidth::from_limit(limit, section.ingress.unwrap_or_default())))
}

/// Every mode this build attaches gives the pod a netdev a qdisc, an eBPF program or the
/// PF's VF rate can hold to a rate. A mode without one (a device bound to vfio-pci for a VM)
/// is refused here when it arrives.
fn can_enforce(mode: Mode) -> bool {
    matches!(mode, Mode::Macvlan | Mode::Ipvlan | Mode::HostDevice | Mode::SriovVf)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::bandwidth::{BitsPerSecond, IngressPolicy};
    use crate::model::network_config::{NodeSupport, decode};
    use crate::testing::facts::{FactsBuilder as _, physical_nic};

    fn check(
        config: serde_json::Value,
        device: &DeviceFacts,
    ) -> Result<Option<ResolvedBandwidth>, String> {
        check_on(config, device, &NodeSupport::default())
    }

    fn check_on(
        config: serde_json::Value,
        device: &DeviceFacts,
        support: &NodeSupport,
    ) -> Result<Option<ResolvedBandwidth>, String> {
        let mut params = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
        let serde_json::Value::Object(fields) = config else { panic!("an object") };
        params.as_object_mut().unwrap().extend(fields);
        let cfg = decode(0, &params).map_err(|e| e.to_string())?;
        cfg.validate(device, support).map(|r| r.bandwidth).map_err(|e| e.to_string())
    }

    #[test]
    fn police_on_a_node_without_the_programs_is_refused_naming_the_field() {
        let shared = physical_nic("eth2").shared();
        let police = json!({"bandwidth": {"limit": "100M", "ingress": "police"}});
        let without = NodeSupport::default().refuse_police("no BPF file system");
        let err = check_on(police.clone(), &shared, &without).unwrap_err();
        assert!(
            err.contains("bandwidth.ingress: police: this node cannot police ingress: no BPF"),
            "{err}"
        );
        assert!(check_on(json!({"bandwidth": {"limit": "100M"}}), &shared, &without).is_ok());
        assert!(check(police, &shared).is_ok(), "a node with the programs polices");
    }

    #[test]
    fn a_vf_takes_whole_megabits_and_one_rate_setting() {
        let vf = physical_nic("eth9v1").vf(9000);
        let ok = check(json!({"bandwidth": {"limit": "300M"}}), &vf).unwrap().unwrap();
        assert_eq!(ok.ceiling.unwrap().rate, BitsPerSecond(300_000_000));
        let err = check(json!({"bandwidth": {"limit": "1500k"}}), &vf).unwrap_err();
        assert!(
            err.contains("bandwidth.limit: \"1500k\": a VF's max_tx_rate is set in whole Mb/s"),
            "{err}"
        );
        let err =
            check(json!({"bandwidth": {"limit": "1G"}, "sriov": {"maxTxRateMbps": 100}}), &vf)
                .unwrap_err();
        assert!(err.contains("sriov.maxTxRateMbps 100 sets the same VF rate"), "{err}");
        let zero_rate = json!({"bandwidth": {"limit": "1G"}, "sriov": {"maxTxRateMbps": 0}});
        assert!(check(zero_rate, &vf).is_ok(), "0 is no rate");
        // Nothing polices a VF's ingress: accepted, it would never be enforced.
        let err =
            check(json!({"bandwidth": {"limit": "300M", "ingress": "police"}}), &vf).unwrap_err();
        assert!(
            err.contains(
                "bandwidth.ingress: police: ingress policing is not available with mode sriov-vf"
            ),
            "{err}"
        );
    }

    #[test]
    fn no_section_is_none_and_ingress_alone_has_no_ceiling_yet() {
        let shared = physical_nic("eth2").shared();
        assert_eq!(check(json!({}), &shared), Ok(None));
        let police = check(json!({"bandwidth": {"ingress": "police"}}), &shared).unwrap().unwrap();
        assert_eq!((police.ingress, police.ceiling), (IngressPolicy::Police, None));
        let err = check(json!({"bandwidth": {}}), &physical_nic("eth2").slot()).unwrap_err();
        assert!(
            err.contains("bandwidth: slots:") && err.contains("cannot account bandwidth"),
            "{err}"
        );
        let err = check(json!({"bandwidth": {"limit": "1G", "burst": "1M"}}), &shared).unwrap_err();
        assert!(err.contains("bandwidth"), "{err}");
    }
}
