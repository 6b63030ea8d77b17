//! Fake-kernel tests of the pipelined batches (issue 36): what goes in one batch, and a failure
//! in the middle of a batch whose later requests still run and are undone.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::sync::Arc;

use super::*;
use crate::model::network_config::{
    Addressing, MacvlanMode, PolicyRouting, ResolvedMode, ResolvedNetworkConfig, RoutingSettings,
    Sharing,
};
use crate::podnet::failing::{FailingOps, FailurePlan};
use crate::podnet::fake::FakeKernel;
use crate::podnet::plan::tests::{config, device, pod, route};
use crate::podnet::plan::{AttachRequest, plan_attach};

const EBUSY: i32 = 16;

/// A dual-stack macvlan on `eth1` (index 10; the child gets 11) with one route, optionally
/// with source-based routing.
fn plan(policy: bool) -> AttachPlan {
    let mut cfg: ResolvedNetworkConfig = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        Addressing::Static(vec!["10.10.1.5/24".parse().unwrap(), "fd00:10::5/64".parse().unwrap()]),
        vec![route("10.20.0.0/16", Some("10.10.1.1"), None)],
    );
    if policy {
        cfg.routing = RoutingSettings {
            policy: Some(PolicyRouting { table: 1000, source_rules: true }),
            vrf: None,
            sysctls: Vec::new(),
        };
    }
    plan_attach(&AttachRequest {
        claim_uid: "uid-1",
        config: &cfg,
        device: &device("eth1", Sharing::Shared),
        pod: &pod(),
        interface_name: "net1",
        pool_addresses: &[],
    })
    .unwrap()
}

fn kernel() -> Arc<FakeKernel> {
    let kernel = FakeKernel::new();
    kernel.add_host_link("eth1", 1500, None);
    Arc::new(kernel)
}

#[tokio::test]
async fn everything_after_the_link_goes_in_one_batch_and_so_do_quiesce_and_detach() {
    let kernel = kernel();
    let vlans = VlanUsers::new();
    let plan = plan(false);
    attach(&kernel, &vlans, &plan).await.unwrap();
    // Two addresses, up, the route.
    assert_eq!(kernel.batches(), [4]);
    quiesce(&kernel, &plan).await.unwrap();
    assert_eq!(kernel.batches(), [4, 2]);
    assert_eq!(kernel.leftovers().0, 0, "addresses left after quiesce");
    assert!(detach(&kernel, &vlans, &plan).await.is_clean());
    assert_eq!(kernel.batches(), [4, 2, 1]);
    assert!(kernel.links(Side::Pod).is_empty());
}

#[tokio::test]
async fn a_failure_in_the_middle_of_a_batch_runs_the_rest_and_undoes_every_success() {
    let kernel = kernel();
    kernel.fail_on("add address fd00:10::5/64", EBUSY);
    let plan = plan(false);
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.unwrap_err();
    assert_eq!(err.index, 2, "{err}");
    assert_eq!(err.step, plan.steps[2]);
    assert_eq!(err.cause.errno(), Some(EBUSY));
    assert!(err.undo_failures.is_empty(), "{err}");
    assert_eq!(
        kernel.log()[1..],
        [
            "add address 10.10.1.5/24 on 11",
            "add address fd00:10::5/64 on 11 nodad -> errno 16",
            // After the failure, in the same batch.
            "set 11 up",
            "add route 10.20.0.0/16 via 10.10.1.1 dev 11",
            // The rollback: every success, newest first, the pod-side ones as one batch.
            "delete route 10.20.0.0/16 via 10.10.1.1 dev 11",
            "set 11 down",
            "delete address 10.10.1.5/24 on 11",
            "delete pod link 11",
        ]
    );
    assert_eq!(kernel.batches(), [4, 3]);
    assert!(kernel.links(Side::Pod).is_empty());
    assert_eq!(kernel.leftovers(), (0, 0));
}

#[tokio::test]
async fn an_injected_failure_leaves_the_rest_of_the_batch_to_the_kernel_as_one_batch() {
    let fake = kernel();
    // Calls: 1 create, 2 and 3 the addresses, 4 up, 5 the route, 6 and 7 the table's
    // subnets... the failure is the first rule's (the batch's last but one request).
    let counting = FailurePlan::new(0, 0);
    attach(&FailingOps::new(kernel(), Arc::clone(&counting)), &VlanUsers::new(), &plan(true))
        .await
        .unwrap();
    let calls = counting.calls();
    let plan = plan(true);
    let failing = FailingOps::new(Arc::clone(&fake), FailurePlan::new(calls - 1, EBUSY));
    let err = attach(&failing, &VlanUsers::new(), &plan).await.unwrap_err();
    assert!(matches!(plan.steps[err.index], Step::AddRule { .. }), "{err}");
    assert_eq!(err.cause.errno(), Some(EBUSY));
    let batch = usize::try_from(calls).unwrap() - 1;
    // The batch without the failed request reached the kernel, the second rule included;
    // the rollback undid all of it in one batch.
    assert_eq!(fake.batches(), [batch - 1, batch - 1]);
    assert!(fake.log().iter().any(|line| line.starts_with("delete rule from fd00:10::5")));
    assert!(fake.links(Side::Pod).is_empty());
    assert_eq!(fake.leftovers(), (0, 0));
    assert!(fake.routing_leftovers().is_empty(), "{:?}", fake.routing_leftovers());
}

#[tokio::test]
async fn detach_removes_the_rules_and_the_link_in_one_batch_even_when_a_rule_fails() {
    let kernel = kernel();
    let vlans = VlanUsers::new();
    let plan = plan(true);
    attach(&kernel, &vlans, &plan).await.unwrap();
    kernel.fail_on("delete rule from fd00", EBUSY);
    let report = detach(&kernel, &vlans, &plan).await;
    assert_eq!(kernel.batches().last(), Some(&3), "two rules and the link");
    let failed: Vec<&UndoStep> = report
        .steps
        .iter()
        .filter(|(_, outcome)| matches!(outcome, UndoOutcome::Failed(_)))
        .map(|(step, _)| step)
        .collect();
    assert!(matches!(failed[..], [UndoStep::DeleteRule { .. }]), "{report:?}");
    // The link went after the failed rule, in the same batch.
    assert!(kernel.links(Side::Pod).is_empty());
    assert_eq!(kernel.routing_leftovers().rules.len(), 1);
    // Detach again (reconcile): the rule goes, the link is already gone.
    assert!(detach(&kernel, &vlans, &plan).await.is_clean());
    assert!(kernel.routing_leftovers().is_empty());
}
