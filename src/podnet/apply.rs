//! Executes attach plans through [`LinkPort`]: runs the steps in order, undoes every completed
//! step in reverse order when one fails, and detaches (never failing) at sandbox stop.

use std::collections::{BTreeMap, BTreeSet};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use crate::model::network_config::{MacAddr, Mode, Route};

use super::plan::{
    AttachPlan, RouteDisplay, Step, UndoStep, VlanLink, VlanOwner, parse_device_alias,
    parse_vlan_alias, vlan_alias, vlan_owner,
};
use super::ports::{
    EADDRNOTAVAIL, EEXIST, ENETUNREACH, ENODEV, ESRCH, LinkOpError, LinkPort, LinkState,
    PodLinkConfig, PodRequest, Side,
};

mod batch;
#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod rdma_tests;
mod routing;
#[cfg(test)]
mod tests;

/// The interface an attach produced, for the claim status (`networkData`, `NetworkStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedInterface {
    /// Pod-side name.
    pub name: String,
    /// The mode it was made with.
    pub mode: Mode,
    /// The host device or parent.
    pub host_device: String,
    /// MAC address as the kernel reports it after the attach.
    pub mac: Option<MacAddr>,
    /// MTU as the kernel reports it.
    pub mtu: u32,
    /// Interface addresses in canonical CIDR form (`10.10.1.5/24`, host bits kept).
    pub addresses: Vec<IpNetwork>,
    /// Routes added through it.
    pub routes: Vec<Route>,
    /// Its table, rules, VRF and sysctls (`podnet::plan::routing`; absent in records written
    /// before they existed).
    #[serde(default, skip_serializing_if = "super::plan::AppliedRouting::is_empty")]
    pub routing: super::plan::AppliedRouting,
    /// The RDMA device the pod got with it (`rdma`; absent in records written before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
}

/// Why one attach step failed, with the kernel's errno kept in the source.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// `EEXIST` on a route: the pod already has this destination with this metric (typically
    /// a second default route without a distinct metric next to the primary network's).
    #[error("the pod already has a route to {destination}{} (a second default route needs a distinct metric)", metric.map(|m| format!(" with metric {m}")).unwrap_or_default())]
    DuplicateRoute {
        /// The destination.
        destination: IpNetwork,
        /// The metric asked for.
        metric: Option<u32>,
        /// The kernel's answer.
        #[source]
        source: LinkOpError,
    },
    /// `ENETUNREACH` on a route: its gateway is not on a connected subnet of the interface.
    #[error("gateway of route {route} is not reachable through the interface")]
    GatewayUnreachable {
        /// The route.
        route: String,
        /// The kernel's answer.
        #[source]
        source: LinkOpError,
    },
    /// `EEXIST` on create or move: the pod already has an interface with this name.
    #[error("the pod already has an interface named {name}")]
    NameTaken {
        /// The name.
        name: String,
        /// The kernel's answer.
        #[source]
        source: LinkOpError,
    },
    /// `EEXIST` on an address: the pod already has it.
    #[error("address {address} is already configured in the pod")]
    DuplicateAddress {
        /// The address.
        address: IpNetwork,
        /// The kernel's answer.
        #[source]
        source: LinkOpError,
    },
    /// A host link has the VLAN sub-interface's name and our alias for another parent or id
    /// (two long parents whose names hash alike, or a renamed link): a child on it would
    /// land on the wrong network, so the attach stops.
    #[error(
        "host link {name} is this driver's VLAN sub-interface of another parent or id ({alias:?}), not {parent} VLAN {id}"
    )]
    VlanOfAnother {
        /// The sub-interface's name.
        name: String,
        /// The parent the plan wants.
        parent: String,
        /// The VLAN id the plan wants.
        id: u16,
        /// The alias found on the link.
        alias: String,
    },
    /// A pod link has the VRF's name but is not that VRF (another table, or not a VRF): the
    /// interface would route through the wrong table, so the attach stops.
    #[error("pod link {name} is not a VRF with table {table} (found table {found:?})")]
    VrfOfAnother {
        /// The VRF's name.
        name: String,
        /// The table the plan wants.
        table: u32,
        /// The table found (`None`: not a VRF).
        found: Option<u32>,
    },
    /// Any other failure.
    #[error(transparent)]
    Op(#[from] LinkOpError),
}

impl StepError {
    /// The kernel's errno, when the kernel refused.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            StepError::DuplicateRoute { source, .. }
            | StepError::GatewayUnreachable { source, .. }
            | StepError::NameTaken { source, .. }
            | StepError::DuplicateAddress { source, .. }
            | StepError::Op(source) => source.errno(),
            StepError::VlanOfAnother { .. } | StepError::VrfOfAnother { .. } => None,
        }
    }
}

/// An undo step that failed during rollback (the rollback goes on with the others).
#[derive(Debug)]
pub struct UndoFailure {
    /// The undo step.
    pub step: UndoStep,
    /// Why it failed.
    pub error: LinkOpError,
}

/// A failed attach: which step failed, why, and which undo steps of the rollback failed.
#[derive(Debug, thiserror::Error)]
#[error("attach of {interface} failed at step {index} ({step}): {cause}{}", undo_summary(.undo_failures))]
pub struct AttachError {
    /// Pod-side interface name.
    pub interface: String,
    /// Index of the failed step in the plan.
    pub index: usize,
    /// The failed step.
    pub step: Step,
    /// The cause.
    #[source]
    pub cause: StepError,
    /// Undo steps that failed (empty when the rollback left nothing behind).
    pub undo_failures: Vec<UndoFailure>,
}

fn undo_summary(failures: &[UndoFailure]) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let list: Vec<String> = failures.iter().map(|f| format!("{}: {}", f.step, f.error)).collect();
    format!("; rollback incomplete: {}", list.join("; "))
}

/// What one detach step did.
#[derive(Debug)]
pub enum UndoOutcome {
    /// The kernel did it.
    Done,
    /// Nothing to do: the link is already gone or back (for example with the pod netns).
    AlreadyGone,
    /// The VLAN sub-interface still has users, or is not ours: kept.
    Kept,
    /// It failed; detach goes on with the other steps.
    Failed(LinkOpError),
}

/// The result of a detach, per teardown step. Detach never fails the runtime: the caller
/// logs the failed steps and reconcile retries them.
#[derive(Debug, Default)]
pub struct DetachReport {
    /// Each teardown step with its outcome, in execution order.
    pub steps: Vec<(UndoStep, UndoOutcome)>,
}

impl DetachReport {
    /// Whether every step succeeded or had nothing to do.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        !self.steps.iter().any(|(_, outcome)| matches!(outcome, UndoOutcome::Failed(_)))
    }
}

/// Users of the VLAN sub-interfaces on shared parents, shared by every attach of the node.
/// A sub-interface is created on first use (with [`vlan_alias`]) and deleted after its last
/// user, and only when this driver created it. One that exists without our alias (an
/// administrator's `<parent>.<id>`) is used as it is and never deleted. After a restart,
/// reconcile re-adds the users of running pods from their stored plans with
/// [`VlanUsers::adopt`].
#[derive(Debug, Default)]
pub struct VlanUsers {
    entries: tokio::sync::Mutex<BTreeMap<String, VlanEntry>>,
}

#[derive(Debug)]
struct VlanEntry {
    /// Created by this driver (alias mark), so deleted after the last user.
    owned: bool,
    /// Claim UIDs using it.
    users: BTreeSet<String>,
}

impl VlanUsers {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `claim_uid` as a user of `vlan` without touching the kernel (reconcile after
    /// a restart); `owned` is whether the link carries our alias for it ([`vlan_owner`]).
    pub async fn adopt(&self, vlan: &VlanLink, claim_uid: &str, owned: bool) {
        let mut entries = self.entries.lock().await;
        entries
            .entry(vlan.name.clone())
            .or_insert_with(|| VlanEntry { owned, users: BTreeSet::new() })
            .users
            .insert(claim_uid.to_owned());
    }

    /// The claims using `name`.
    pub async fn users(&self, name: &str) -> Vec<String> {
        let entries = self.entries.lock().await;
        entries.get(name).map(|e| e.users.iter().cloned().collect()).unwrap_or_default()
    }

    /// Deletes every sub-interface of ours in `links` (host links, listed once) that has no
    /// user here: at start, after reconcile adopted the users of every stored pod, these are
    /// left over by a crash between a pod's last detach and the deletion. Links without our
    /// alias are never touched. Returns each deleted name with its outcome.
    pub async fn remove_unused<O: LinkPort>(
        &self,
        ops: &O,
        links: &[LinkState],
    ) -> Vec<(String, Result<UndoOutcome, LinkOpError>)> {
        let entries = self.entries.lock().await;
        let mut removed = Vec::new();
        for link in links {
            let Some(vlan) = link.alias.as_deref().and_then(|a| parse_vlan_alias(&link.name, a))
            else {
                continue;
            };
            if entries.contains_key(&vlan.name) {
                continue;
            }
            removed.push((vlan.name, delete_tolerant(ops, Side::Host, link.index).await));
        }
        removed
    }

    async fn ensure<O: LinkPort>(
        &self,
        ops: &O,
        vlan: &VlanLink,
        claim_uid: &str,
    ) -> Result<(), StepError> {
        // Held across the kernel calls: two first users racing would both try to create it.
        let mut entries = self.entries.lock().await;
        // The kernel is asked even when the sub-interface has users here: an administrator
        // may have deleted it, or it was missing when reconcile adopted its users after a
        // restart; it is then created again (and ours).
        let owned = if let Some(existing) = ops.link(Side::Host, &vlan.name).await? {
            match vlan_owner(vlan, existing.alias.as_deref()) {
                VlanOwner::Us => true,
                VlanOwner::Foreign => {
                    tracing::info!(vlan = %vlan.name,
                        "using a VLAN sub-interface this driver did not create; it is never deleted");
                    false
                }
                VlanOwner::UsForAnother { alias } => {
                    return Err(StepError::VlanOfAnother {
                        name: vlan.name.clone(),
                        parent: vlan.parent.clone(),
                        id: vlan.id,
                        alias,
                    });
                }
            }
        } else {
            let parent = require_link(ops, Side::Host, &vlan.parent).await?;
            ops.create_vlan(parent.index, &vlan.name, vlan.id, &vlan_alias(vlan)).await?;
            true
        };
        let entry = entries
            .entry(vlan.name.clone())
            .or_insert_with(|| VlanEntry { owned, users: BTreeSet::new() });
        entry.owned = owned;
        entry.users.insert(claim_uid.to_owned());
        Ok(())
    }

    async fn release<O: LinkPort>(
        &self,
        ops: &O,
        vlan: &VlanLink,
        claim_uid: &str,
    ) -> Result<UndoOutcome, LinkOpError> {
        let mut entries = self.entries.lock().await;
        let Some(entry) = entries.get_mut(&vlan.name) else {
            // Unknown here (e.g. not yet adopted after a restart): other pods may still use
            // it, so keeping it is the safe choice; reconcile collects it.
            return Ok(UndoOutcome::Kept);
        };
        entry.users.remove(claim_uid);
        if !entry.users.is_empty() {
            return Ok(UndoOutcome::Kept);
        }
        let owned = entry.owned;
        entries.remove(&vlan.name);
        if !owned {
            return Ok(UndoOutcome::Kept);
        }
        match ops.link(Side::Host, &vlan.name).await? {
            Some(link) if vlan_owner(vlan, link.alias.as_deref()) == VlanOwner::Us => {
                delete_tolerant(ops, Side::Host, link.index).await
            }
            Some(_) => Ok(UndoOutcome::Kept),
            None => Ok(UndoOutcome::AlreadyGone),
        }
    }
}

async fn require_link<O: LinkPort>(
    ops: &O,
    side: Side,
    name: &str,
) -> Result<LinkState, LinkOpError> {
    ops.link(side, name)
        .await?
        .ok_or_else(|| LinkOpError::NoSuchLink { side, name: name.to_owned() })
}

async fn delete_tolerant<O: LinkPort>(
    ops: &O,
    side: Side,
    index: u32,
) -> Result<UndoOutcome, LinkOpError> {
    match ops.delete_link(side, index).await {
        Ok(()) => Ok(UndoOutcome::Done),
        Err(err) if err.errno() == Some(ENODEV) => Ok(UndoOutcome::AlreadyGone),
        Err(err) => Err(err),
    }
}

/// Attaches one pod interface: executes `plan`'s steps in order, those after the interface's
/// arrival that need no answer from each other as one pipelined batch
/// (`LinkPort::apply_batch`); on a failure, undoes every step that succeeded (in a batch,
/// those after the failed one too) in reverse order and returns the first failure in plan
/// order (with any undo that failed too).
pub async fn attach<O: LinkPort>(
    ops: &O,
    vlans: &VlanUsers,
    plan: &AttachPlan,
) -> Result<AttachedInterface, AttachError> {
    let mut pod_link: Option<LinkState> = None;
    // The undo log: plan indices of the steps that succeeded, in plan order.
    let mut done: Vec<usize> = Vec::with_capacity(plan.steps.len());
    let mut index = 0;
    while index < plan.steps.len() {
        let mut undo_failures = Vec::new();
        let run = pod_link.as_ref().map(|link| (link.index, batch::run_end(&plan.steps, index)));
        let (failure, next) = match run {
            Some((link, end)) if end > index => {
                (batch::attach_run(ops, plan, index..end, link, &mut done).await, end)
            }
            _ => {
                let step = &plan.steps[index];
                match run_step(ops, vlans, plan, step, &mut pod_link, &mut undo_failures).await {
                    Ok(()) => {
                        done.push(index);
                        crate::failpoint!("podnet.attach.after_step");
                        (None, index + 1)
                    }
                    Err(cause) => (Some((index, cause)), index + 1),
                }
            }
        };
        if let Some((failed, cause)) = failure {
            let succeeded: Vec<&Step> = done.iter().map(|at| &plan.steps[*at]).collect();
            undo_failures.extend(rollback(ops, vlans, plan, &succeeded, pod_link.as_ref()).await);
            return Err(AttachError {
                interface: plan.interface_name.clone(),
                index: failed,
                step: plan.steps[failed].clone(),
                cause,
                undo_failures,
            });
        }
        index = next;
    }
    let Some(link) = pod_link else {
        // A plan always creates or moves the interface; one that does not is a bug upstream,
        // reported as a missing link rather than a panic in the sandbox path.
        return Err(AttachError {
            interface: plan.interface_name.clone(),
            index: plan.steps.len(),
            step: Step::SetUp,
            cause: StepError::Op(LinkOpError::NoSuchLink {
                side: Side::Pod,
                name: plan.interface_name.clone(),
            }),
            undo_failures: Vec::new(),
        });
    };
    Ok(AttachedInterface {
        name: link.name,
        mode: plan.mode,
        host_device: plan.host_device.clone(),
        mac: link.mac,
        mtu: link.mtu,
        addresses: plan.addresses(),
        routes: plan.routes(),
        routing: plan.applied_routing(),
        rdma_device: plan.rdma_device.clone(),
    })
}

async fn run_step<O: LinkPort>(
    ops: &O,
    vlans: &VlanUsers,
    plan: &AttachPlan,
    step: &Step,
    pod_link: &mut Option<LinkState>,
    undo_failures: &mut Vec<UndoFailure>,
) -> Result<(), StepError> {
    let pod_index = || {
        pod_link.as_ref().map(|l| l.index).ok_or_else(|| {
            StepError::Op(LinkOpError::NoSuchLink {
                side: Side::Pod,
                name: plan.interface_name.clone(),
            })
        })
    };
    match step {
        Step::EnsureVlan { vlan } => vlans.ensure(ops, vlan, &plan.claim_uid).await,
        Step::CreateChild { kind, parent, name, mtu, hardware_address } => {
            let parent = require_link(ops, Side::Host, parent).await?;
            ops.create_child(*kind, parent.index, name, *mtu, *hardware_address)
                .await
                .map_err(|source| name_taken(name, source))?;
            *pod_link = Some(require_link(ops, Side::Pod, name).await?);
            Ok(())
        }
        Step::MoveIntoPod { host_name, pod_name, mtu, hardware_address, alias } => {
            let device = require_link(ops, Side::Host, host_name).await?;
            if let Err(source) =
                ops.move_to_pod(device.index, pod_name, *mtu, *hardware_address, alias).await
            {
                recover_partial_move(ops, &device, *hardware_address, undo_failures).await;
                return Err(name_taken(pod_name, source));
            }
            // The index may change on the move (it is per netns), so look it up again.
            *pod_link = Some(require_link(ops, Side::Pod, pod_name).await?);
            Ok(())
        }
        Step::AddAddress { address, nodad } => ops
            .add_address(pod_index()?, *address, *nodad)
            .await
            .map_err(|source| address_error(*address, source)),
        Step::EnsureVrf { vrf } => routing::ensure_vrf(ops, vrf).await,
        Step::JoinVrf { vrf } => routing::join_vrf(ops, pod_index()?, vrf).await,
        Step::SetSysctls { sysctls } => {
            Ok(ops.set_sysctls(pod_index()?, &plan.interface_name, sysctls).await?)
        }
        Step::AddTableRoute { route } => routing::add_table_route(ops, pod_index()?, route).await,
        Step::AddRule { rule } => Ok(ops.add_rule(rule).await?),
        Step::SetUp => Ok(ops.set_up(pod_index()?, true).await?),
        Step::AddRoute { route } => {
            ops.add_route(pod_index()?, route).await.map_err(|source| route_error(route, source))
        }
        Step::MoveRdmaIntoPod { device } => {
            let index = ops.rdma_device(Side::Host, device).await?.ok_or_else(|| {
                LinkOpError::NoSuchRdmaDevice { side: Side::Host, name: device.clone() }
            })?;
            Ok(ops.move_rdma(Side::Host, index).await?)
        }
    }
}

/// A move with a rename is not atomic in the kernel: `do_setlink` moves the device under its
/// current name (the new name is only a fallback pattern when the current one is taken in the
/// target), applies the MTU, and renames last; a taken pod-side name fails that rename after
/// the move. Find the device in the pod under its host name (same MAC) and send it back.
async fn recover_partial_move<O: LinkPort>(
    ops: &O,
    device: &LinkState,
    requested_mac: Option<MacAddr>,
    undo_failures: &mut Vec<UndoFailure>,
) {
    let Ok(Some(moved)) = ops.link(Side::Pod, &device.name).await else {
        return;
    };
    if moved.mac != device.mac {
        return;
    }
    let restore_mac = requested_mac.and(device.mac);
    if let Err(error) = ops.move_to_host(moved.index, &device.name, device.mtu, restore_mac).await {
        undo_failures.push(UndoFailure {
            step: UndoStep::MoveToHost {
                pod_name: device.name.clone(),
                host_name: device.name.clone(),
                mtu: device.mtu,
                hardware_address: restore_mac,
            },
            error,
        });
    }
}

/// An address's error: `EEXIST` is a duplicate.
fn address_error(address: IpNetwork, source: LinkOpError) -> StepError {
    if source.errno() == Some(EEXIST) {
        StepError::DuplicateAddress { address, source }
    } else {
        StepError::Op(source)
    }
}

/// A route's error, named as the kernel's errno says.
fn route_error(route: &Route, source: LinkOpError) -> StepError {
    match source.errno() {
        Some(EEXIST) => StepError::DuplicateRoute {
            destination: route.destination,
            metric: route.metric,
            source,
        },
        Some(ENETUNREACH) => {
            StepError::GatewayUnreachable { route: RouteDisplay(route).to_string(), source }
        }
        _ => StepError::Op(source),
    }
}

fn name_taken(name: &str, source: LinkOpError) -> StepError {
    if source.errno() == Some(EEXIST) {
        StepError::NameTaken { name: name.to_owned(), source }
    } else {
        StepError::Op(source)
    }
}

/// Undoes `done` (the steps that succeeded, in plan order) in reverse order, the runs on the
/// pod link as one batch each ([`batch::undo_run`]); returns the undo steps that failed.
async fn rollback<O: LinkPort>(
    ops: &O,
    vlans: &VlanUsers,
    plan: &AttachPlan,
    done: &[&Step],
    pod_link: Option<&LinkState>,
) -> Vec<UndoFailure> {
    let undos: Vec<UndoStep> = done.iter().rev().map(|step| step.undo(plan)).collect();
    let mut failures = Vec::new();
    let mut at = 0;
    while at < undos.len() {
        if let Some(link) = pod_link {
            let end = batch::undo_run_end(&undos, at);
            if end > at {
                let failed = batch::undo_run(ops, &undos[at..end], link.index).await;
                failures
                    .extend(failed.into_iter().map(|(step, error)| UndoFailure { step, error }));
                at = end;
                continue;
            }
        }
        let undo = &undos[at];
        if let Err(error) = run_undo(ops, vlans, plan, undo).await {
            failures.push(UndoFailure { step: undo.clone(), error });
        }
        at += 1;
    }
    failures
}

fn ignore_missing(result: Result<(), LinkOpError>) -> Result<(), LinkOpError> {
    match result {
        Err(err) if matches!(err.errno(), Some(EADDRNOTAVAIL | ESRCH | ENODEV)) => Ok(()),
        other => other,
    }
}

/// Takes a child interface's addresses away, so it stops answering for them at once: one
/// `RTM_DELADDR` each (one pipelined batch), no RCU grace period. Deleting the link itself waits for one
/// (`synchronize_net` in `unregister_netdevice`, ~20 ms), so it can follow off the sandbox's
/// response path. A plan that moves a device is left alone (it goes back to the host whole,
/// before its netns is destroyed); so is an interface that is already gone.
///
/// # Errors
/// The first failed lookup or address removal (an address already gone is fine).
pub async fn quiesce<O: LinkPort>(ops: &O, plan: &AttachPlan) -> Result<(), LinkOpError> {
    if !plan.creates_child() {
        return Ok(());
    }
    let Some(link) = ops.link(Side::Pod, &plan.interface_name).await? else {
        return Ok(());
    };
    let addresses = plan.addresses();
    let requests: Vec<PodRequest<'_>> = addresses
        .iter()
        .map(|address| PodRequest::DeleteAddress { index: link.index, address: *address })
        .collect();
    ops.apply_batch(&requests).await.into_iter().try_for_each(ignore_missing)
}

/// Executes one link-level undo step, looking links up by name.
async fn run_undo<O: LinkPort>(
    ops: &O,
    vlans: &VlanUsers,
    plan: &AttachPlan,
    undo: &UndoStep,
) -> Result<UndoOutcome, LinkOpError> {
    match undo {
        UndoStep::ReleaseVlan { vlan } => vlans.release(ops, vlan, &plan.claim_uid).await,
        UndoStep::DeleteChild { name } => match ops.link(Side::Pod, name).await {
            Ok(Some(link)) => delete_tolerant(ops, Side::Pod, link.index).await,
            // The kernel deletes virtual links together with their netns.
            Ok(None) | Err(LinkOpError::NetnsGone { .. }) => Ok(UndoOutcome::AlreadyGone),
            Err(err) => Err(err),
        },
        UndoStep::MoveToHost { pod_name, host_name, mtu, hardware_address } => {
            match ops.link(Side::Pod, pod_name).await {
                Ok(Some(link)) => {
                    ops.move_to_host(link.index, host_name, *mtu, *hardware_address).await?;
                    Ok(UndoOutcome::Done)
                }
                Ok(None) | Err(LinkOpError::NetnsGone { .. }) => {
                    restore_returned(ops, plan, pod_name, host_name, *mtu, *hardware_address).await
                }
                Err(err) => Err(err),
            }
        }
        UndoStep::MoveRdmaToHost { device } => match ops.rdma_device(Side::Pod, device).await {
            Ok(Some(index)) => {
                ops.move_rdma(Side::Pod, index).await?;
                Ok(UndoOutcome::Done)
            }
            // Not in the pod: not moved yet, or its netns was destroyed and the kernel moved
            // it back to the initial netns (`rdma_dev_exit_net`), as it does the netdev.
            Ok(None) | Err(LinkOpError::NetnsGone { .. }) => Ok(UndoOutcome::AlreadyGone),
            Err(err) => Err(err),
        },
        UndoStep::ReleaseVrf { vrf } => routing::release_vrf(ops, vrf).await,
        UndoStep::DeleteRule { rule } => routing::delete_rule(ops, rule).await,
        // Address, up flag and routes go with the link; on their own they only appear in a
        // rollback, which handles them with the known index. So do table routes, the VRF
        // membership and the sysctls.
        UndoStep::DeleteAddress { .. }
        | UndoStep::SetDown
        | UndoStep::DeleteRoute { .. }
        | UndoStep::DeleteTableRoute { .. }
        | UndoStep::LeaveVrf { .. }
        | UndoStep::KeepSysctls => Ok(UndoOutcome::AlreadyGone),
    }
}

/// The device is not in the pod (any more): when its netns was destroyed, the kernel gave a
/// physical NIC back to the host under its pod-side name (a veth is destroyed instead). Our
/// alias identifies it; restore name, MTU and MAC.
async fn restore_returned<O: LinkPort>(
    ops: &O,
    plan: &AttachPlan,
    pod_name: &str,
    host_name: &str,
    mtu: u32,
    mac: Option<MacAddr>,
) -> Result<UndoOutcome, LinkOpError> {
    let Some(link) = ops.link(Side::Host, pod_name).await? else {
        return Ok(UndoOutcome::AlreadyGone);
    };
    let ours = link
        .alias
        .as_deref()
        .and_then(parse_device_alias)
        .is_some_and(|(host, claim)| host == host_name && claim == plan.claim_uid);
    if !ours {
        return Ok(UndoOutcome::AlreadyGone);
    }
    ops.restore_in_host(link.index, host_name, mtu, mac).await?;
    Ok(UndoOutcome::Done)
}

/// The result of an attach that finished before a crash lost its record: `Some` when pod
/// link `link` carries everything `plan` configures (MTU, up, every address, every route;
/// a route planned without a metric matches any, as the kernel fills one in), else `None`
/// (a half-done attach, to be undone and done again).
#[must_use]
pub fn completed_attach(
    plan: &AttachPlan,
    link: &LinkState,
    config: &PodLinkConfig,
) -> Option<AttachedInterface> {
    let mtu = plan.steps.iter().find_map(|step| match step {
        Step::CreateChild { mtu, .. } | Step::MoveIntoPod { mtu, .. } => Some(*mtu),
        _ => None,
    })?;
    let addresses = plan.addresses();
    let routes = plan.routes();
    let complete = link.mtu == mtu
        && config.up
        && addresses.iter().all(|a| config.addresses.contains(a))
        && routes.iter().all(|r| {
            config.routes.iter().any(|k| {
                k.destination == r.destination
                    && k.gateway == r.gateway
                    && r.metric.is_none_or(|m| k.metric == Some(m))
            })
        });
    complete.then(|| AttachedInterface {
        name: link.name.clone(),
        mode: plan.mode,
        host_device: plan.host_device.clone(),
        mac: link.mac,
        mtu: link.mtu,
        addresses,
        routes,
        routing: plan.applied_routing(),
        rdma_device: plan.rdma_device.clone(),
    })
}

/// Detaches one pod interface (StopPodSandbox): runs [`AttachPlan::teardown`] and never fails;
/// every step is attempted and reported. The rules' removal and the child's deletion after
/// them go as one pipelined batch (`LinkPort::apply_batch`). Works when the pod netns is
/// already gone.
pub async fn detach<O: LinkPort>(ops: &O, vlans: &VlanUsers, plan: &AttachPlan) -> DetachReport {
    let teardown = plan.teardown();
    let mut report = DetachReport::default();
    let mut at = 0;
    while at < teardown.len() {
        let end = batch::detach_run_end(&teardown, at);
        let outcomes = if end > at {
            batch::detach_run(ops, &teardown[at..end]).await
        } else {
            let outcome = match run_undo(ops, vlans, plan, &teardown[at]).await {
                Ok(outcome) => outcome,
                Err(err) => UndoOutcome::Failed(err),
            };
            vec![outcome]
        };
        let next = at + outcomes.len();
        for (undo, outcome) in teardown[at..next].iter().zip(outcomes) {
            report.steps.push((undo.clone(), outcome));
            crate::failpoint!("podnet.detach.after_step");
        }
        at = next;
    }
    report
}
