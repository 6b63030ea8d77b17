//! What mode `vfio` refuses (DESIGN §3): the PCI function is bound to `vfio-pci` and handed
//! to a userspace driver in the pod (DPDK, a KubeVirt VM) through `/dev/vfio/<group>`. The
//! kernel has no netdev for it any more, so nothing moves into the pod's network namespace
//! and nothing there can carry an address, a route, a name or an MTU: a config asking for
//! one is refused at prepare, naming the field, instead of being silently dropped. A VF keeps
//! its VF settings (VLAN, spoof checking, trust, rates, MAC): the PF applies them whatever
//! driver the VF has.

use super::validate::{invalid, quoted, to_json};
use super::{Addressing, ConfigError, DeviceFacts, DeviceKind, NetworkConfig, Rule};

/// What a userspace driver's device cannot have, for the error.
const NO_NETDEV: &str = "the device is bound to vfio-pci for a userspace driver: it gets no \
                         interface in the pod's network namespace";

/// Refuses what a `vfio` claim cannot have on `device`. `inherited`: the addressing a
/// `PodNetwork` with `ipam` gives the config.
pub(super) fn check(
    cfg: &NetworkConfig,
    device: &DeviceFacts,
    inherited: Option<&Addressing>,
) -> Result<(), ConfigError> {
    let vf = device.kind == DeviceKind::SriovVf;
    if let Some(ipam) = &cfg.ipam
        && (ipam.pool.is_some() || ipam.addresses.as_ref().is_some_and(|a| !a.is_empty()))
    {
        return Err(invalid("ipam", to_json(ipam), Rule::NotWithVfio(NO_NETDEV)));
    }
    if let Some(addressing) = inherited
        && *addressing != Addressing::None
    {
        let name = cfg.pod_network.as_deref().unwrap_or_default();
        return Err(invalid(
            "podNetwork",
            quoted(name),
            Rule::NotWithVfio(
                "the network hands out addresses, and a vfio device has no interface to carry them",
            ),
        ));
    }
    if let Some(routes) = &cfg.routes
        && !routes.is_empty()
    {
        return Err(invalid("routes", to_json(routes), Rule::NotWithVfio(NO_NETDEV)));
    }
    if let Some(interface) = &cfg.interface {
        if let Some(name) = &interface.name {
            return Err(invalid("interface.name", quoted(name), Rule::NotWithVfio(NO_NETDEV)));
        }
        if let Some(mtu) = interface.mtu {
            return Err(invalid("interface.mtu", mtu.to_string(), Rule::NotWithVfio(NO_NETDEV)));
        }
        if let Some(mac) = &interface.hardware_address
            && !vf
        {
            return Err(invalid(
                "interface.hardwareAddress",
                quoted(mac),
                Rule::NotWithVfio(
                    "only a VF's MAC can be set for a userspace driver (on its PF); a whole NIC's driver sets its own",
                ),
            ));
        }
    }
    if !vf && let Some(vlan) = cfg.vlan {
        return Err(invalid(
            "vlan",
            vlan.to_string(),
            Rule::NotWithVfio("only a VF's VLAN is set for a userspace driver (on its PF)"),
        ));
    }
    // What configures the pod's interface, or the netdev the function loses to vfio-pci.
    let netdev_sections = [
        ("routing", cfg.routing.as_ref().map(to_json)),
        ("vrf", cfg.vrf.as_ref().map(to_json)),
        ("sysctls", cfg.sysctls.as_ref().filter(|s| !s.is_empty()).map(to_json)),
        ("ethtool", cfg.ethtool.as_ref().map(to_json)),
        ("bandwidth", cfg.bandwidth.as_ref().map(to_json)),
        (
            "rdma",
            cfg.rdma.filter(|r| *r != super::RdmaConfig::Disabled).map(|r| quoted(r.as_str())),
        ),
    ];
    for (path, value) in netdev_sections {
        if let Some(value) = value {
            return Err(invalid(path, value, Rule::NotWithVfio(NO_NETDEV)));
        }
    }
    if cfg.stats == Some(true) {
        return Err(invalid(
            "stats",
            "true",
            Rule::NotWithVfio(
                "the counters are eBPF programs on the pod's interface, which a vfio device does not have",
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::{
        API_VERSION, ConfigError, DeviceFacts, DeviceKind, KIND, NetworkConfig, NodeSupport,
        ResolvedMode, ResolvedNetworkConfig,
    };
    use crate::model::network_config::Addressing;
    use crate::testing::facts::{FactsBuilder as _, physical_nic};

    fn check(body: Value, device: &DeviceFacts) -> Result<ResolvedNetworkConfig, ConfigError> {
        let mut params = json!({"apiVersion": API_VERSION, "kind": KIND});
        let (Value::Object(map), Value::Object(extra)) = (&mut params, body) else {
            panic!("test parameters must be objects");
        };
        map.extend(extra);
        let config: NetworkConfig = serde_json::from_value(params).expect("a valid document");
        config.validate(device, &NodeSupport::everything())
    }

    fn field(result: Result<ResolvedNetworkConfig, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { path, rule, .. }) => format!("{path}: {rule}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_vf_or_a_whole_nic_is_bound_with_no_interface_and_a_vf_keeps_its_vf_settings() {
        let vf = physical_nic("enp1s0v0").vf(1500);
        let resolved = check(
            json!({"mode": "vfio", "vlan": 100, "sriov": {"trust": true},
                   "interface": {"hardwareAddress": "02:00:00:00:00:01"}}),
            &vf,
        )
        .expect("a VF with VF settings");
        assert_eq!(resolved.mode, ResolvedMode::Vfio);
        assert_eq!(resolved.addressing, Addressing::None);
        assert!(resolved.routes.is_empty());
        assert!(!resolved.stats, "no interface to count on");
        assert_eq!(resolved.vlan, Some(100));
        assert!(resolved.sriov.is_some_and(|s| s.trust), "the VF settings are resolved");
        assert_eq!(resolved.interface.name, None);

        let nic = check(json!({"mode": "vfio"}), &physical_nic("eth1")).expect("a whole NIC");
        assert_eq!((nic.mode, nic.sriov), (ResolvedMode::Vfio, None));
        let pf = physical_nic("eth1").kind(DeviceKind::SriovPf);
        assert_eq!(
            check(json!({"mode": "vfio"}), &pf).ok().map(|r| r.mode),
            Some(ResolvedMode::Vfio)
        );
    }

    #[test]
    fn a_vf_with_an_rdma_function_bound_to_vfio_gets_no_rdma_device() {
        // In shared netns mode `rdma` defaults to shared for any RDMA netdev; bound to
        // vfio-pci the function has no RDMA driver left, so no char devices either.
        let mut rdma = crate::model::rdma::RdmaFacts::new("mlx5_2", 1);
        rdma.netns_mode = Some(crate::model::network_config::RdmaNetnsMode::Shared);
        rdma.char_devices = vec!["/dev/infiniband/uverbs2".into()];
        let vf = physical_nic("enp1s0v0").vf(1500).rdma(rdma);
        assert!(check(json!({"mode": "sriov-vf"}), &vf).unwrap().rdma.is_some());
        assert_eq!(check(json!({"mode": "vfio"}), &vf).unwrap().rdma, None);
    }

    #[test]
    fn vfio_is_never_the_default_and_never_on_a_shared_or_virtual_device() {
        let vf = physical_nic("enp1s0v0").vf(1500);
        assert_eq!(check(json!({}), &vf).ok().map(|r| r.mode), Some(ResolvedMode::SriovVf));
        assert_eq!(
            check(json!({}), &physical_nic("eth1")).ok().map(|r| r.mode),
            Some(ResolvedMode::HostDevice)
        );
        for device in [
            physical_nic("eth1").shared(),
            physical_nic("eth1").slot(),
            physical_nic("veth1").kind(DeviceKind::Virtual),
            physical_nic("bond0").kind(DeviceKind::Bond),
        ] {
            let refused = field(check(json!({"mode": "vfio"}), &device));
            assert!(refused.starts_with("mode: mode not allowed on this device"), "{refused}");
        }
    }

    #[test]
    fn what_needs_an_interface_in_the_pod_is_refused_naming_the_field() {
        let vf = physical_nic("enp1s0v0").vf(1500);
        let nic = physical_nic("eth1");
        let rows: [(Value, &DeviceFacts, &str); 13] = [
            (json!({"ipam": {"addresses": ["10.0.0.5/24"]}}), &vf, "ipam"),
            (json!({"ipam": {"pool": {"subnet": "10.0.0.0/24"}}}), &nic, "ipam"),
            (json!({"routes": [{"destination": "10.1.0.0/16"}]}), &vf, "routes"),
            (json!({"interface": {"name": "dpdk0"}}), &vf, "interface.name"),
            (json!({"interface": {"mtu": 9000}}), &nic, "interface.mtu"),
            (
                json!({"interface": {"hardwareAddress": "02:00:00:00:00:01"}}),
                &nic,
                "interface.hardwareAddress",
            ),
            (json!({"vlan": 7}), &nic, "vlan"),
            (json!({"sriov": {"trust": true}}), &nic, "sriov"),
            (json!({"stats": true}), &vf, "stats"),
            (json!({"routing": {"table": 100}}), &vf, "routing"),
            (json!({"sysctls": {"net.ipv4.conf.net1.rp_filter": "2"}}), &vf, "sysctls"),
            (json!({"rdma": "shared"}), &vf, "rdma"),
            (json!({"macvlan": {"mode": "bridge"}}), &vf, "macvlan"),
        ];
        for (body, device, path) in rows {
            let mut body = body;
            body["mode"] = json!("vfio");
            let refused = field(check(body.clone(), device));
            assert!(refused.starts_with(&format!("{path}: ")), "{body}: {refused}");
            // Sections of another mode are refused as such (`sriov` on a whole NIC too).
            if !["macvlan", "sriov"].contains(&path) {
                assert!(refused.contains("not with mode vfio"), "{refused}");
            }
        }
        // The same fields are fine in other modes (the rows test vfio, not the fields).
        assert!(check(json!({"interface": {"mtu": 1400}}), &nic).is_ok());
    }
}
