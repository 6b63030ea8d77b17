//! The publisher's loop: publish once the node's PodNetworks are known, then after each
//! trigger (a netlink change on the host, a NIC moved into or out of a pod, a slice changed
//! or deleted behind our back, a PodNetwork or the Node's labels changed), debounced so a
//! burst settles into one publication, retried with backoff when the API fails. It reaches
//! the world through ports only: [`SliceApi`], [`InterfaceSource`] (the node's interfaces),
//! [`WarningSink`] (Events on the Node), [`PublishSink`] (what the metrics count) and
//! [`ReadinessSink`] (the daemon's `/readyz`).
//!
//! While a sharing change is held ([`super::SharingHold`]: claims prepared on a shared
//! device) the loop publishes again every [`HOLD_RECHECK`], which publishes the change once
//! the claims are unprepared (the claim service has no change feed; the check is a lookup in
//! memory and a discovery, and writes nothing while the hold lasts).
//!
//! The first publication waits (at most [`NETWORKS_PATIENCE`]) until the PodNetworks have
//! been listed and the Node read: a restarted daemon then publishes the network devices it
//! published before in its first generation instead of dropping them and adding them back
//! a moment later (a claim allocated in between would meet a missing device). Past the
//! patience (API server unreachable or a watch refused) it publishes what it knows, with a
//! warning, and adds the network devices when the inputs arrive.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{
    InterfaceSource, PublishSink, Publisher, ReadinessSink, SliceApi, SliceApiError, WarningSink,
};
use crate::inventory::SharingMode;
use crate::inventory::networks::NetworkInputs;
use crate::model::cause::{Cause, Chain};

/// Quiet time after the last trigger before rediscovering: a burst of link changes (a bond
/// coming up, SR-IOV VFs being created) settles into one publication.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Longest a continuous burst can postpone a publication.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Retry bounds after a failed publication (API server down, conflict).
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// Longest the first publication waits for the PodNetworks and the Node's labels. Both are
/// one list each on a reachable API server; kubelet registration waits 10 s for the first
/// publication, so this stays well below.
pub const NETWORKS_PATIENCE: Duration = Duration::from_secs(5);
/// How often a held sharing change is looked at again.
pub const HOLD_RECHECK: Duration = Duration::from_secs(5);

/// What the watch of our slices reports.
#[derive(Debug)]
pub enum SliceEvent {
    /// A slice exists with this content (added, modified, or listed at a restart).
    Present(Box<ResourceSlice>),
    /// A slice was deleted.
    Deleted(String),
    /// The watch restarted; `Present` events of every slice follow, then `Relisted`.
    Relisting,
    /// The relist is complete.
    Relisted,
    /// The watch failed (it retries by itself).
    Error(Cause),
}

/// What makes the loop publish again, and when it stops.
pub struct Triggers<E> {
    /// A netlink change on the host (coalesced: one message stands for many).
    pub link_changes: mpsc::Receiver<()>,
    /// Host interfaces currently moved into pods (kept published while there).
    pub moved: watch::Receiver<BTreeSet<String>>,
    /// Watch events of our own slices.
    pub slice_events: E,
    /// The PodNetworks and this node's labels.
    pub networks: watch::Receiver<NetworkInputs>,
    /// Becomes `true` when the daemon stops.
    pub stop: watch::Receiver<bool>,
}

/// A failed publication round.
#[derive(Debug, thiserror::Error)]
enum RoundError<D: std::error::Error + 'static> {
    #[error(transparent)]
    Discovery(D),
    #[error(transparent)]
    Api(#[from] SliceApiError),
}

/// Runs `publisher` until `triggers.stop`; reports each round to `events` and marks
/// `readiness` after each successful one.
pub async fn run<A, I, W, E, P, R>(
    mut publisher: Publisher<A>,
    interfaces: &I,
    warnings: &W,
    mut triggers: Triggers<E>,
    events: &P,
    readiness: &R,
) where
    A: SliceApi,
    I: InterfaceSource,
    W: WarningSink,
    E: Stream<Item = SliceEvent> + Unpin,
    P: PublishSink,
    R: ReadinessSink,
{
    if !wait_for_networks(&mut triggers.networks, &mut triggers.stop).await {
        return;
    }
    publisher.set_networks(&triggers.networks.borrow_and_update());
    // Publish at once, then on triggers.
    let mut due: Option<Instant> = Some(Instant::now());
    let mut first_trigger: Option<Instant> = None;
    let mut force = false;
    let mut retry_delay = RETRY_MIN;
    let mut relisted: Option<Vec<String>> = None;
    loop {
        let sleep_until = due.unwrap_or_else(|| Instant::now() + Duration::from_hours(1));
        tokio::select! {
            _ = triggers.stop.wait_for(|stopped| *stopped) => break,
            Some(()) = triggers.link_changes.recv() => {
                schedule(&mut due, &mut first_trigger);
            }
            Ok(()) = triggers.moved.changed() => {
                schedule(&mut due, &mut first_trigger);
            }
            Ok(()) = triggers.networks.changed() => {
                if publisher.set_networks(&triggers.networks.borrow_and_update()) {
                    schedule(&mut due, &mut first_trigger);
                }
            }
            Some(event) = triggers.slice_events.next() => {
                if handle_slice_event(&publisher, event, &mut relisted) {
                    force = true;
                    schedule(&mut due, &mut first_trigger);
                }
            }
            () = tokio::time::sleep_until(sleep_until), if due.is_some() => {
                due = None;
                first_trigger = None;
                triggers.moved.mark_unchanged();
                let round = publish_round(
                    &mut publisher, interfaces, force, events, warnings, &triggers.moved,
                );
                match round.await {
                    Ok(()) => {
                        force = false;
                        retry_delay = RETRY_MIN;
                        readiness.mark_ready();
                        if publisher.is_holding() && due.is_none() {
                            due = Some(Instant::now() + HOLD_RECHECK);
                        }
                    }
                    Err(err) => {
                        tracing::warn!(%err, retry_in = ?retry_delay, "publishing ResourceSlices failed");
                        events.round_failed();
                        due = Some(Instant::now() + retry_delay);
                        retry_delay = (retry_delay * 2).min(RETRY_MAX);
                    }
                }
            }
        }
    }
}

/// Waits until `networks` is known, at most [`NETWORKS_PATIENCE`]; `false` when the daemon
/// stopped meanwhile.
async fn wait_for_networks(
    networks: &mut watch::Receiver<NetworkInputs>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let in_time = {
        let known =
            tokio::time::timeout(NETWORKS_PATIENCE, networks.wait_for(NetworkInputs::is_known));
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return false,
            // A closed channel (`Ok(Err)`) means no PodNetworks on this node: nothing to wait for.
            waited = known => waited.is_ok(),
        }
    };
    if !in_time {
        tracing::warn!(
            waited = ?NETWORKS_PATIENCE,
            unknown = networks.borrow().unknown().join(" and "),
            "publishing before the node's PodNetworks are known; their devices follow when they are"
        );
    }
    true
}

/// Debounces: due [`DEBOUNCE`] after the last trigger, at most [`MAX_DELAY`] after the first.
fn schedule(due: &mut Option<Instant>, first_trigger: &mut Option<Instant>) {
    let now = Instant::now();
    let first = *first_trigger.get_or_insert(now);
    *due = Some((now + DEBOUNCE).min(first + MAX_DELAY));
}

/// Whether `event` means our slices must be written again.
fn handle_slice_event<A: SliceApi>(
    publisher: &Publisher<A>,
    event: SliceEvent,
    relisted: &mut Option<Vec<String>>,
) -> bool {
    match event {
        SliceEvent::Present(slice) => {
            let name = slice_name(&slice);
            if let Some(seen) = relisted.as_mut() {
                seen.push(name.clone());
            }
            let repair = publisher.needs_repair(&name, Some(&slice.spec));
            if repair {
                tracing::info!(slice = %name, "slice changed behind our back; republishing");
            }
            repair
        }
        SliceEvent::Deleted(name) => {
            let repair = publisher.needs_repair(&name, None);
            if repair {
                tracing::info!(slice = %name, "slice deleted; republishing");
            }
            repair
        }
        SliceEvent::Relisting => {
            *relisted = Some(Vec::new());
            false
        }
        SliceEvent::Relisted => {
            let seen = relisted.take().unwrap_or_default();
            publisher.slice_names().iter().any(|name| !seen.contains(name))
        }
        SliceEvent::Error(cause) => {
            tracing::debug!(error = %Chain(&*cause), "slice watch error (retrying)");
            false
        }
    }
}

fn slice_name(slice: &ResourceSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

/// The NICs to keep published for a discovery that ran while the moved set went from
/// `before` to `after`: both. The attach service marks a NIC as moved before the kernel moves
/// it, so a discovery that missed it finds it in `after`; it clears the mark only once the NIC
/// is back on the host, so a discovery that ran while the NIC was still in the pod finds it in
/// `before` (reading only `after` dropped a returning NIC from the slices for one round).
pub(super) fn moved_across(
    mut before: BTreeSet<String>,
    after: &BTreeSet<String>,
) -> BTreeSet<String> {
    before.extend(after.iter().cloned());
    before
}

/// One publication: discover, keep moved NICs, write, report.
async fn publish_round<A: SliceApi, I: InterfaceSource, W: WarningSink, P: PublishSink>(
    publisher: &mut Publisher<A>,
    interfaces: &I,
    force: bool,
    events: &P,
    warnings: &W,
    moved: &watch::Receiver<BTreeSet<String>>,
) -> Result<(), RoundError<I::Error>> {
    let moved_before = moved.borrow().clone();
    let found = interfaces.discover().await.map_err(RoundError::Discovery)?;
    publisher.retain_moved(&moved_across(moved_before, &moved.borrow()));
    let report = publisher.sync(&found, force).await?;
    events.round_published(&report);
    if report.applied > 0 || report.deleted > 0 {
        tracing::info!(
            generation = report.generation,
            devices = report.devices,
            written = report.applied,
            deleted = report.deleted,
            "published ResourceSlices"
        );
    }
    for conflict in &report.new_conflicts {
        tracing::warn!(
            interface = %conflict.if_name, kept = %conflict.kept, dropped = %conflict.dropped,
            "{conflict}"
        );
        warnings.warn("PodNetworkConflict", "PublishResourceSlices", conflict.to_string()).await;
    }
    if let Some(message) = report.capacity_dropped {
        tracing::warn!("{message}");
        warnings.warn("ConsumableCapacityUnsupported", "PublishResourceSlices", message).await;
    }
    for hold in &report.new_holds {
        tracing::warn!(device = %hold.device, interface = %hold.if_name, "{hold}");
        warnings.warn("SharingChangeWaiting", "PublishResourceSlices", hold.to_string()).await;
    }
    for hold in &report.released_holds {
        tracing::info!(device = %hold.device, interface = %hold.if_name,
            "no claim is prepared on shared device {} any more; {} is published as the \
             inventory says now", hold.device, hold.if_name);
    }
    if publisher.sharing_mode() == SharingMode::Slots {
        tracing::debug!("shared parents published as slots");
    }
    Ok(())
}
