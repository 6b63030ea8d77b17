//! The pipelined parts of attach, rollback and detach (issue 36): once the pod interface exists
//! (its index known), the consecutive steps that need nothing from each other's answers go to
//! the kernel as one batch ([`LinkPort::apply_batch`]), in plan order; the kernel handles them
//! in that order, so addresses still precede up and up precedes the routes. Every request of a
//! batch runs even after one fails, so the caller gets each step's outcome and undoes exactly
//! the successes.

use std::ops::Range;

use super::{StepError, UndoOutcome, address_error, ignore_missing, route_error, routing};
use crate::podnet::plan::{AttachPlan, Step, UndoStep};
use crate::podnet::ports::{ENODEV, ENOENT, LinkOpError, LinkPort, PodRequest, Side};

/// Whether `step` can go in a batch once the pod link's index is known: one pod-side request
/// each, answered by an ack only.
fn batchable(step: &Step) -> bool {
    matches!(
        step,
        Step::AddAddress { .. }
            | Step::JoinVrf { .. }
            | Step::SetSysctls { .. }
            | Step::AddTableRoute { .. }
            | Step::AddRule { .. }
            | Step::SetUp
            | Step::AddRoute { .. }
    )
}

/// The end (exclusive) of the run of batchable steps from `start` (`start` when there is none).
pub(super) fn run_end(steps: &[Step], start: usize) -> usize {
    start + steps[start..].iter().take_while(|step| batchable(step)).count()
}

/// The request of batchable `step` on pod link `index`; `JoinVrf` looks its VRF up first.
async fn request_of<'a, O: LinkPort>(
    ops: &O,
    plan: &'a AttachPlan,
    step: &'a Step,
    index: u32,
) -> Result<PodRequest<'a>, StepError> {
    Ok(match step {
        Step::AddAddress { address, nodad } => {
            PodRequest::AddAddress { index, address: *address, nodad: *nodad }
        }
        Step::JoinVrf { vrf } => {
            PodRequest::SetMaster { index, master: routing::vrf_index(ops, vrf).await? }
        }
        Step::SetSysctls { sysctls } => {
            PodRequest::SetSysctls { index, if_name: &plan.interface_name, sysctls }
        }
        Step::AddTableRoute { route } => PodRequest::AddTableRoute { index, route },
        Step::AddRule { rule } => PodRequest::AddRule { rule },
        Step::SetUp => PodRequest::SetUp { index, up: true },
        Step::AddRoute { route } => PodRequest::AddRoute { index, route },
        // Never in a batch (see `batchable`): named as the error a plan bug would be.
        Step::EnsureVlan { .. }
        | Step::CreateChild { .. }
        | Step::MoveIntoPod { .. }
        | Step::EnsureVrf { .. }
        | Step::MoveRdmaIntoPod { .. } => {
            return Err(StepError::Op(LinkOpError::Protocol {
                op: step.to_string(),
                side: Side::Pod,
                message: "not a step of a batch".to_owned(),
            }));
        }
    })
}

/// The step's error for the kernel's answer `source`, as its single call names it.
fn step_error(step: &Step, source: LinkOpError) -> StepError {
    match step {
        Step::AddAddress { address, .. } => address_error(*address, source),
        Step::AddRoute { route } => route_error(route, source),
        Step::AddTableRoute { route } => routing::table_route_error(route, source),
        _ => StepError::Op(source),
    }
}

/// Runs `steps[range]` (batchable, see [`run_end`]) on pod link `index` as one batch. Each
/// success is appended to `done` (plan indices, in order); returns the first failure in plan
/// order, if any.
pub(super) async fn attach_run<O: LinkPort>(
    ops: &O,
    plan: &AttachPlan,
    range: Range<usize>,
    index: u32,
    done: &mut Vec<usize>,
) -> Option<(usize, StepError)> {
    let mut failures: Vec<(usize, StepError)> = Vec::new();
    let mut requests = Vec::with_capacity(range.len());
    let mut sent = Vec::with_capacity(range.len());
    for at in range.clone() {
        match request_of(ops, plan, &plan.steps[at], index).await {
            Ok(request) => {
                requests.push(request);
                sent.push(at);
            }
            Err(cause) => failures.push((at, cause)),
        }
    }
    let results = ops.apply_batch(&requests).await;
    for (at, result) in sent.into_iter().zip(results) {
        match result {
            Ok(()) => done.push(at),
            Err(source) => failures.push((at, step_error(&plan.steps[at], source))),
        }
    }
    done.sort_unstable();
    if failures.is_empty() {
        for _ in range {
            crate::failpoint!("podnet.attach.after_step");
        }
        return None;
    }
    failures.sort_by_key(|(at, _)| *at);
    failures.into_iter().next()
}

/// The request undoing `undo` on pod link `index`, when it is one a batch can carry.
fn undo_request(undo: &UndoStep, index: u32) -> Option<PodRequest<'_>> {
    Some(match undo {
        UndoStep::DeleteAddress { address } => {
            PodRequest::DeleteAddress { index, address: *address }
        }
        UndoStep::DeleteTableRoute { route } => PodRequest::DeleteTableRoute { index, route },
        UndoStep::LeaveVrf { .. } => PodRequest::SetMaster { index, master: 0 },
        UndoStep::SetDown => PodRequest::SetUp { index, up: false },
        UndoStep::DeleteRoute { route } => PodRequest::DeleteRoute { index, route },
        UndoStep::DeleteRule { rule } => PodRequest::DeleteRule { rule },
        _ => return None,
    })
}

/// The end (exclusive) of the run of undo steps from `start` that a batch can carry.
pub(super) fn undo_run_end(undos: &[UndoStep], start: usize) -> usize {
    start + undos[start..].iter().take_while(|undo| undo_request(undo, 0).is_some()).count()
}

/// A rule already gone, or gone with its netns, is fine.
fn rule_outcome(result: Result<(), LinkOpError>) -> Result<UndoOutcome, LinkOpError> {
    match result {
        Ok(()) => Ok(UndoOutcome::Done),
        Err(LinkOpError::NetnsGone { .. }) => Ok(UndoOutcome::AlreadyGone),
        Err(err) if err.errno() == Some(ENOENT) => Ok(UndoOutcome::AlreadyGone),
        Err(err) => Err(err),
    }
}

/// Undoes `undos` (a run from [`undo_run_end`]) on pod link `index` as one batch; returns the
/// ones that failed with why (an address, route or rule already gone is no failure).
pub(super) async fn undo_run<O: LinkPort>(
    ops: &O,
    undos: &[UndoStep],
    index: u32,
) -> Vec<(UndoStep, LinkOpError)> {
    let requests: Vec<PodRequest<'_>> =
        undos.iter().filter_map(|undo| undo_request(undo, index)).collect();
    let results = ops.apply_batch(&requests).await;
    undos
        .iter()
        .zip(results)
        .filter_map(|(undo, result)| {
            let result = match undo {
                UndoStep::DeleteRule { .. } => rule_outcome(result).map(|_| ()),
                UndoStep::DeleteAddress { .. }
                | UndoStep::DeleteTableRoute { .. }
                | UndoStep::DeleteRoute { .. } => ignore_missing(result),
                _ => result,
            };
            result.err().map(|error| (undo.clone(), error))
        })
        .collect()
}

/// The end (exclusive) of a detach run from `start`: the rules to delete, then the child link
/// if it comes next (its lookup goes before the batch).
pub(super) fn detach_run_end(teardown: &[UndoStep], start: usize) -> usize {
    let rules = teardown[start..]
        .iter()
        .take_while(|undo| matches!(undo, UndoStep::DeleteRule { .. }))
        .count();
    let end = start + rules;
    match teardown.get(end) {
        Some(UndoStep::DeleteChild { .. }) => end + 1,
        _ => end,
    }
}

/// Detaches `run` (from [`detach_run_end`]) as one batch: the rules' deletions, then the
/// child's (looked up by name first); one outcome per step.
pub(super) async fn detach_run<O: LinkPort>(ops: &O, run: &[UndoStep]) -> Vec<UndoOutcome> {
    let mut outcomes: Vec<Option<UndoOutcome>> = Vec::with_capacity(run.len());
    let mut requests = Vec::with_capacity(run.len());
    for undo in run {
        match undo {
            UndoStep::DeleteRule { rule } => {
                requests.push(PodRequest::DeleteRule { rule });
                outcomes.push(None);
            }
            UndoStep::DeleteChild { name } => match ops.link(Side::Pod, name).await {
                Ok(Some(link)) => {
                    requests.push(PodRequest::DeleteLink { index: link.index });
                    outcomes.push(None);
                }
                // The kernel deletes virtual links together with their netns.
                Ok(None) | Err(LinkOpError::NetnsGone { .. }) => {
                    outcomes.push(Some(UndoOutcome::AlreadyGone));
                }
                Err(err) => outcomes.push(Some(UndoOutcome::Failed(err))),
            },
            // Not in a detach run (see `detach_run_end`).
            _ => outcomes.push(Some(UndoOutcome::Kept)),
        }
    }
    let mut results = ops.apply_batch(&requests).await.into_iter();
    run.iter()
        .zip(outcomes)
        .map(|(undo, outcome)| {
            if let Some(outcome) = outcome {
                return outcome;
            }
            let result = results.next().unwrap_or_else(|| {
                Err(LinkOpError::Protocol {
                    op: undo.to_string(),
                    side: Side::Pod,
                    message: "the batch answered fewer requests".to_owned(),
                })
            });
            let outcome = match undo {
                UndoStep::DeleteRule { .. } => rule_outcome(result),
                _ => match result {
                    Ok(()) => Ok(UndoOutcome::Done),
                    Err(LinkOpError::NetnsGone { .. }) => Ok(UndoOutcome::AlreadyGone),
                    Err(err) if err.errno() == Some(ENODEV) => Ok(UndoOutcome::AlreadyGone),
                    Err(err) => Err(err),
                },
            };
            outcome.unwrap_or_else(UndoOutcome::Failed)
        })
        .collect()
}
