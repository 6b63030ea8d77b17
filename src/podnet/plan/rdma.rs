//! The RDMA step of an attach plan: with `rdma: exclusive` (validated at prepare: the node is
//! in exclusive RDMA netns mode and the device's driver can move), the netdev's RDMA device
//! follows the netdev into the pod netns, right after it, and goes back before it at detach
//! ([`super::AttachPlan::teardown`] reverses the steps).
//!
//! Why right after the netdev: a pod's RDMA user opens the device by name from its own netns,
//! and in exclusive mode the kernel shows it only there (`rdma_dev_access_netns`); the move
//! resets every user context of the device (`disassociate_ucontext`), which is harmless before
//! the pod's containers start. Why back before the netdev: a detach leaves both in the host,
//! and an RDMA device whose netns is destroyed first is moved back by the kernel anyway
//! (`rdma_dev_exit_net`), so the undo finds nothing left to do.

use crate::model::network_config::{RdmaMode, ResolvedNetworkConfig};

use super::Step;

/// The step that moves the config's RDMA device into the pod, when it moves (`exclusive`).
#[must_use]
pub fn move_step(config: &ResolvedNetworkConfig) -> Option<Step> {
    config
        .rdma
        .as_ref()
        .filter(|rdma| rdma.mode == RdmaMode::Exclusive)
        .map(|rdma| Step::MoveRdmaIntoPod { device: rdma.device.clone() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use crate::model::network_config::Sharing;
    use crate::model::network_config::{
        Addressing, MacvlanMode, RdmaMode, ResolvedMode, ResolvedRdma,
    };
    use crate::podnet::plan::tests::{config, device, pod};
    use crate::podnet::plan::{AttachRequest, Step, UndoStep, plan_attach};

    fn rdma(mode: RdmaMode) -> ResolvedRdma {
        ResolvedRdma {
            mode,
            device: "mlx5_0".to_owned(),
            char_devices: vec!["/dev/infiniband/uverbs0".into()],
        }
    }

    #[test]
    fn an_exclusive_rdma_device_follows_its_netdev_and_returns_first() {
        let mut cfg = config(
            ResolvedMode::HostDevice,
            Addressing::Static(vec!["10.1.0.2/24".parse().unwrap()]),
            vec![],
        );
        cfg.rdma = Some(rdma(RdmaMode::Exclusive));
        let dev = device("eth2", Sharing::Exclusive);
        let pod = pod();
        let request = AttachRequest {
            claim_uid: "u1",
            config: &cfg,
            device: &dev,
            pod: &pod,
            interface_name: "net1",
            pool_addresses: &[],
        };
        let plan = plan_attach(&request).unwrap();
        assert!(matches!(plan.steps[0], Step::MoveIntoPod { .. }), "{:?}", plan.steps);
        assert_eq!(plan.steps[1], Step::MoveRdmaIntoPod { device: "mlx5_0".to_owned() });
        let teardown = plan.teardown();
        assert_eq!(teardown[0], UndoStep::MoveRdmaToHost { device: "mlx5_0".to_owned() });
        assert!(matches!(teardown[1], UndoStep::MoveToHost { .. }), "{teardown:?}");
        assert_eq!(teardown.len(), 2);
    }

    #[test]
    fn a_shared_rdma_device_and_a_child_plan_no_move() {
        let address = Addressing::Static(vec!["10.1.0.2/24".parse().unwrap()]);
        let mut cfg = config(ResolvedMode::HostDevice, address.clone(), vec![]);
        cfg.rdma = Some(rdma(RdmaMode::Shared));
        let pod = pod();
        let exclusive = device("eth2", Sharing::Exclusive);
        let mut macvlan =
            config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, address, vec![]);
        macvlan.rdma = Some(rdma(RdmaMode::Shared));
        let parent = device("eth1", Sharing::Shared);
        for (cfg, dev) in [(&cfg, &exclusive), (&macvlan, &parent)] {
            let plan = plan_attach(&AttachRequest {
                claim_uid: "u1",
                config: cfg,
                device: dev,
                pod: &pod,
                interface_name: "net1",
                pool_addresses: &[],
            })
            .unwrap();
            assert!(
                !plan.steps.iter().any(|s| matches!(s, Step::MoveRdmaIntoPod { .. })),
                "{:?}",
                plan.steps
            );
        }
    }
}
