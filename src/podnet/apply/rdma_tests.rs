//! The RDMA step of an attach against the fake kernel: the RDMA device follows its netdev into
//! the pod and back, a failure at any call leaves both where they were, and a destroyed pod
//! netns gives both back (the kernel's `default_device_exit` and `rdma_dev_exit_net`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::sync::Arc;

use super::*;
use crate::model::network_config::{
    Addressing, RdmaMode, ResolvedMode, ResolvedNetworkConfig, ResolvedRdma, Sharing,
};
use crate::podnet::failing::{FailingOps, FailurePlan};
use crate::podnet::fake::FakeKernel;
use crate::podnet::plan::tests::{config, device, pod, route};
use crate::podnet::plan::{AttachRequest, plan_attach};

/// `EOPNOTSUPP`: what the kernel answers a move of a device whose driver cannot change netns.
const EOPNOTSUPP: i32 = 95;

fn rdma_config() -> ResolvedNetworkConfig {
    let mut cfg = config(
        ResolvedMode::HostDevice,
        Addressing::Static(vec!["10.10.1.5/24".parse().unwrap()]),
        vec![route("10.20.0.0/16", Some("10.10.1.1"), None)],
    );
    cfg.interface.mtu = 1500;
    cfg.rdma = Some(ResolvedRdma {
        mode: RdmaMode::Exclusive,
        device: "mlx5_0".to_owned(),
        char_devices: vec!["/dev/infiniband/uverbs0".into()],
    });
    cfg
}

fn rdma_plan() -> AttachPlan {
    let mut dev = device("ens4", Sharing::Exclusive);
    dev.mtu = 9000;
    let pod = pod();
    plan_attach(&AttachRequest {
        claim_uid: "uid-9",
        config: &rdma_config(),
        device: &dev,
        pod: &pod,
        interface_name: "net1",
        pool_addresses: &[],
    })
    .unwrap()
}

/// A kernel with the NIC (index 10) and its RDMA device (index 11) in the host.
fn kernel() -> Arc<FakeKernel> {
    let kernel = FakeKernel::new();
    kernel.add_host_link("ens4", 9000, None);
    kernel.add_rdma_device("mlx5_0");
    Arc::new(kernel)
}

#[tokio::test]
async fn the_rdma_device_moves_after_its_netdev_and_returns_before_it() {
    let kernel = kernel();
    let vlans = VlanUsers::new();
    let plan = rdma_plan();
    let attached = attach(&kernel, &vlans, &plan).await.unwrap();
    assert_eq!(attached.rdma_device.as_deref(), Some("mlx5_0"));
    assert_eq!(kernel.rdma_side("mlx5_0"), Some(Side::Pod));
    let log = kernel.log();
    assert!(log[0].starts_with("move 10 to pod as net1"), "{log:?}");
    assert_eq!(log[1], "move rdma 11 from host");
    let report = detach(&kernel, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(matches!(report.steps[0], (UndoStep::MoveRdmaToHost { .. }, UndoOutcome::Done)));
    assert_eq!(kernel.rdma_side("mlx5_0"), Some(Side::Host));
    let log = kernel.log();
    assert_eq!(log[log.len() - 2], "move rdma 11 from pod");
    assert!(log[log.len() - 1].starts_with("move 110 to host as ens4 mtu=9000"), "{log:?}");
    assert_eq!(kernel.links(Side::Host), ["ens4"]);
}

#[tokio::test]
async fn a_driver_that_refuses_the_move_fails_the_attach_and_the_netdev_comes_back() {
    let kernel = kernel();
    kernel.fail_on("move rdma", EOPNOTSUPP);
    let err = attach(&kernel, &VlanUsers::new(), &rdma_plan()).await.unwrap_err();
    assert_eq!(err.index, 1, "{err}");
    assert_eq!(err.cause.errno(), Some(EOPNOTSUPP));
    assert!(err.to_string().contains("move RDMA device mlx5_0 into the pod"), "{err}");
    assert!(err.undo_failures.is_empty(), "{err}");
    assert_eq!(kernel.rdma_side("mlx5_0"), Some(Side::Host));
    assert_eq!(kernel.get(Side::Host, "ens4").unwrap().mtu, 9000);
    assert!(kernel.links(Side::Pod).is_empty());
}

#[tokio::test]
async fn an_rdma_device_missing_from_the_host_is_a_named_error() {
    let kernel = FakeKernel::new();
    kernel.add_host_link("ens4", 9000, None);
    let err = attach(&kernel, &VlanUsers::new(), &rdma_plan()).await.unwrap_err();
    assert!(err.to_string().contains("no RDMA device named mlx5_0 in the host netns"), "{err}");
    assert_eq!(kernel.links(Side::Host), ["ens4"]);
}

#[tokio::test]
async fn a_destroyed_pod_netns_gives_the_rdma_device_back_and_detach_has_nothing_to_move() {
    let kernel = kernel();
    let vlans = VlanUsers::new();
    let plan = rdma_plan();
    attach(&kernel, &vlans, &plan).await.unwrap();
    kernel.destroy_pod_netns();
    assert_eq!(kernel.rdma_side("mlx5_0"), Some(Side::Host));
    // The NIC comes back under its pod-side name with our alias.
    kernel.add_host_link("net1", 1500, Some("netclaim.dev/device host=ens4 claim=uid-9"));
    let report = detach(&kernel, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(matches!(report.steps[0], (UndoStep::MoveRdmaToHost { .. }, UndoOutcome::AlreadyGone)));
    assert!(matches!(report.steps[1], (UndoStep::MoveToHost { .. }, UndoOutcome::Done)));
    assert!(!kernel.log().iter().any(|line| line.contains("move rdma 11 from pod")));
    assert_eq!(kernel.rdma_side("mlx5_0"), Some(Side::Host));
}

#[tokio::test]
async fn a_failure_injected_at_every_call_leaves_the_nic_and_its_rdma_device_in_the_host() {
    let plan = rdma_plan();
    let counting = FailurePlan::new(0, 0);
    attach(&FailingOps::new(kernel(), Arc::clone(&counting)), &VlanUsers::new(), &plan)
        .await
        .unwrap();
    let calls = counting.calls();
    assert!(calls >= 5, "{calls} calls");
    for fail_at in 1..=calls {
        let kernel = kernel();
        let failing =
            FailingOps::new(Arc::clone(&kernel), FailurePlan::new(fail_at, nix::libc::EBUSY));
        let err = attach(&failing, &VlanUsers::new(), &plan).await.unwrap_err();
        let context = format!("call {fail_at} of {calls} failed: {err}");
        assert_eq!(err.cause.errno(), Some(nix::libc::EBUSY), "{context}");
        assert!(err.undo_failures.is_empty(), "{context}");
        assert_eq!(kernel.rdma_side("mlx5_0"), Some(Side::Host), "{context}");
        assert_eq!(kernel.links(Side::Host), ["ens4"], "{context}");
        assert_eq!(kernel.get(Side::Host, "ens4").unwrap().mtu, 9000, "{context}");
        assert!(kernel.links(Side::Pod).is_empty(), "{context}");
        assert_eq!(kernel.leftovers(), (0, 0), "{context}");
    }
    // A detach whose RDMA move back fails goes on with the netdev and reports the step.
    let kernel = kernel();
    attach(&kernel, &VlanUsers::new(), &plan).await.unwrap();
    kernel.fail_on("move rdma 11 from pod", nix::libc::EBUSY);
    let report = detach(&kernel, &VlanUsers::new(), &plan).await;
    assert!(!report.is_clean());
    assert!(matches!(report.steps[0], (UndoStep::MoveRdmaToHost { .. }, UndoOutcome::Failed(_))));
    assert!(matches!(report.steps[1], (UndoStep::MoveToHost { .. }, UndoOutcome::Done)));
}
