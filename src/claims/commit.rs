//! Reserving and committing: a claim's devices validated and its addresses held in memory
//! under the state lock (it is then pending), the pending claims of a call committed to the
//! store in one batch, and a prepared claim released.
//!
//! Durability order: a prepared claim on disk always has its leases. Prepare writes the
//! leases (IPAM) with the claim; unprepare removes the claim with its leases and records their
//! release. Every store write runs without the state lock; the addresses stay held in memory
//! until it is done.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use ipnetwork::IpNetwork;

use super::allocation::AllocatedResult;
use super::error::ClaimError;
use super::metadata::{self, DeviceMetadata};
use super::networks::StaticReservation;
use super::parent_capacity;
use super::ports::ClaimStore;
use super::preparer::PreparedDevice;
use super::record::{PreparedClaim, PreparedClaimDevice};
use super::service::PrepareInputs;
use super::state::{State, lock};
use crate::ipam::{self, IpamCommit, Lease, LeaseOwner, LeaseStore};
use crate::model::ClaimRef;
use crate::model::network_config::{
    Addressing, DeviceFacts, MacvlanMode, NetworkAddressing, NodeSupport, PoolSpec, ResolvedMode,
    ResolvedNetworkConfig,
};

/// Child counts of the netdev a new child would sit on, from the children already planned:
/// the parent `facts.if_name` itself, or its VLAN sub-interface when `vlan` is set (each is
/// its own netdev with its own receive handler, so kinds and passthru count per netdev). A
/// macvlan parent takes one passthru child or any number of other children; a parent
/// carries macvlan or ipvlan children, not both.
pub(super) fn add_planned_children<'a>(
    facts: &mut DeviceFacts,
    vlan: Option<u16>,
    planned: impl Iterator<Item = (&'a str, &'a ResolvedNetworkConfig)>,
) {
    for (if_name, config) in planned {
        if if_name != facts.if_name || config.vlan != vlan {
            continue;
        }
        match config.mode {
            ResolvedMode::Macvlan { mode: MacvlanMode::Passthru } => facts.passthru_children += 1,
            ResolvedMode::Macvlan { .. } => facts.other_children += 1,
            ResolvedMode::Ipvlan { .. } => facts.ipvlan_children += 1,
            ResolvedMode::HostDevice | ResolvedMode::SriovVf | ResolvedMode::Vfio => {}
        }
    }
}

/// The lease owner of one allocated device of a claim.
pub(super) fn owner(claim: &ClaimRef, result: &AllocatedResult) -> LeaseOwner {
    LeaseOwner {
        claim_uid: claim.uid.clone(),
        request: result.request.clone(),
        device: result.device.clone(),
        share_id: result.share_id.clone(),
    }
}

/// Refuses a pool whose subnet another prepared claim uses with other settings (DESIGN §4:
/// a pool is identified by its subnet on a node), naming the first differing field; and a
/// pool overlapping another one where either could hand out the other's gateway (leases are
/// per address across pools, so no address goes out twice, but a pod given a gateway's
/// address breaks every pod routed through it).
pub(super) fn check_pool_settings<'a>(
    in_use: impl Iterator<Item = &'a PreparedClaim>,
    claim_uid: &str,
    request: &str,
    pool: &PoolSpec,
) -> Result<(), ClaimError> {
    for other in in_use.filter(|c| c.uid != claim_uid) {
        for device in &other.devices {
            let Addressing::Pool(theirs) = &device.config.addressing else { continue };
            if theirs.subnet != pool.subnet {
                let overlapping = theirs.subnet.contains(pool.subnet.network())
                    || pool.subnet.contains(theirs.subnet.network());
                let handed_out_gateway = [(pool, theirs), (theirs, pool)]
                    .into_iter()
                    .find_map(|(a, b)| a.gateway.filter(|g| ipam::pool::is_allocatable(b, *g)));
                if let (true, Some(gateway)) = (overlapping, handed_out_gateway) {
                    return Err(ClaimError::PoolOverlap {
                        request: request.to_owned(),
                        subnet: pool.subnet,
                        other_subnet: theirs.subnet,
                        gateway,
                        other: format!("{}/{}", other.namespace, other.name),
                    });
                }
                continue;
            }
            if let Some(field) = ipam::pool::differing_setting(pool, theirs) {
                return Err(ClaimError::PoolMismatch {
                    request: request.to_owned(),
                    field,
                    subnet: pool.subnet,
                    other: format!("{}/{}", other.namespace, other.name),
                });
            }
        }
    }
    Ok(())
}

/// The addresses of one claim held in memory, and the claim they make.
pub(super) struct Reserved {
    pub(super) prepared: PreparedClaim,
    /// Every lease of the claim.
    pub(super) leases: Vec<Lease>,
    /// The leases new in this attempt (given back if it fails).
    pub(super) new_leases: Vec<Lease>,
    /// Static addresses to reserve cluster-wide.
    pub(super) statics: Vec<StaticReservation>,
}

/// How one in-memory reservation attempt ended.
pub(super) enum Attempt {
    /// Prepared meanwhile (a repeated call): its answer.
    Done(Vec<PreparedDevice>),
    /// Held, and the claim is pending.
    Reserved(Reserved),
    /// The node's blocks of a network's family are full: nothing is held.
    NeedBlock { plan: NetworkAddressing, ipv4: bool, request: String },
}

/// One failure shared by every claim of a commit (a store error, a panicked task).
#[derive(Debug)]
pub(super) struct SharedCause<E>(pub(super) Arc<E>);

impl<E> Clone for SharedCause<E> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<E: std::fmt::Display> std::fmt::Display for SharedCause<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for SharedCause<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A pending claim handed to its call's commit: what the store records and what it answers.
pub(super) struct ReadyClaim {
    pub(super) claim: ClaimRef,
    /// The claim's record (VF settings applied).
    pub(super) prepared: PreparedClaim,
    /// Every lease of the claim.
    pub(super) leases: Vec<Lease>,
    /// Its new static `PodNetwork` reservations in the API.
    pub(super) reservations: Vec<ipam::OwnedBlock>,
}

/// Commits the pending claims of one call, without the state lock: writes each claim's
/// metadata files (a claim whose files fail fails alone), then commits every other claim with
/// its leases, the blocks they come from that are not recorded yet, its new static
/// reservations and the pruned release records in one durable batch (concurrent calls share
/// `fdatasync`s: group commit); then, under the lock again, the committed claims become
/// prepared. A claim that fails stays pending, with its metadata files removed, for its
/// [`super::staged::StagedClaim`] to undo. Answers in the order of `ready`.
pub(super) fn commit_prepares<S: ClaimStore>(
    state: &Mutex<State<S>>,
    store: &S,
    metadata: Option<&DeviceMetadata>,
    ready: Vec<ReadyClaim>,
) -> Vec<Result<Vec<PreparedDevice>, ClaimError>> {
    // Files before the record: a crash in between leaves files of a claim that is not
    // prepared, which the next start removes.
    let published: Vec<(ReadyClaim, Result<(), ClaimError>)> = ready
        .into_iter()
        .map(|r| {
            let files = metadata.map_or(Ok(()), |m| m.publish(&r.prepared));
            (r, files.map_err(ClaimError::from))
        })
        .collect();
    let commit = {
        let state = lock(state);
        let passed = published.iter().filter(|(_, files)| files.is_ok()).map(|(r, _)| r);
        let leases: Vec<Lease> = passed.clone().flat_map(|r| r.leases.iter().cloned()).collect();
        let mut put_blocks = state.ipam.blocks_to_record(&leases);
        put_blocks.extend(passed.flat_map(|r| r.reservations.iter().cloned()));
        IpamCommit {
            put_leases: leases,
            put_blocks,
            remove_released: state.ipam.expired_releases(),
            ..IpamCommit::default()
        }
    };
    let records: Vec<&PreparedClaim> =
        published.iter().filter(|(_, files)| files.is_ok()).map(|(r, _)| &r.prepared).collect();
    let stored = if records.is_empty() {
        Ok(())
    } else {
        crate::failpoint!("claims.prepare.before_commit");
        store.save_prepared(&records, &commit).map_err(|e| SharedCause(Arc::new(e)))
    };
    let mut state = lock(state);
    if stored.is_ok() {
        state.ipam.mark_recorded(&commit.put_blocks);
        state.ipam.forget_released(&commit.remove_released);
    }
    published
        .into_iter()
        .map(|(ready, files)| {
            let outcome = files.and_then(|()| {
                stored.clone().map_err(|cause| ClaimError::Persist(Box::new(cause)))
            });
            if let Err(err) = outcome {
                if let Some(metadata) = metadata
                    && let Err(cleanup) = metadata.remove(&ready.claim)
                {
                    tracing::warn!(claim = %ready.claim, error = %cleanup, "removing device metadata after a failed prepare");
                }
                return Err(err);
            }
            let answer = ready.prepared.kubelet_devices();
            state.remove_pending(&ready.claim.uid);
            state.add_prepared(ready.prepared);
            Ok(answer)
        })
        .collect()
}

/// Validates a claim's devices and holds its addresses in memory (under the state lock);
/// the claim is then pending. On an error, or when a block must be claimed first, nothing
/// stays held.
pub(super) fn reserve_claim<S: ClaimStore>(
    state: &mut State<S>,
    metadata: Option<&DeviceMetadata>,
    support: &NodeSupport,
    inputs: &PrepareInputs<'_>,
) -> Result<Attempt, ClaimError> {
    let PrepareInputs { claim, allocation, pod_claim_index, .. } = *inputs;
    if let Some(done) = state.prepared.get(&claim.uid) {
        return Ok(Attempt::Done(done.kubelet_devices()));
    }
    let mut devices: Vec<(_, DeviceFacts, _, ResolvedNetworkConfig)> =
        Vec::with_capacity(allocation.results.len());
    // Each device's `ethtool` settings (checked against the device itself at staging).
    let mut ethtools = Vec::with_capacity(allocation.results.len());
    let per_result =
        allocation.results.iter().zip(inputs.facts.iter().cloned()).zip(&inputs.merged);
    for ((result, (mut facts, attributes, parent_limit)), merged) in per_result {
        let config_error = |source| ClaimError::Config {
            request: result.request.clone(),
            device: result.device.clone(),
            source: Box::new(source),
        };
        let network = merged.pod_network.as_ref().and_then(|name| inputs.networks.get(name));
        // Children of other claims and of this claim's earlier results.
        let parent = facts.if_name.clone();
        let in_use = state.devices_on(&parent).map(|d| (&*d.if_name, &d.config));
        let this_claim = devices.iter().map(|(_, f, _, c)| (&*f.if_name, c));
        add_planned_children(&mut facts, merged.vlan, in_use.chain(this_claim));
        let mut config = merged.validate_in(network, &facts, support).map_err(config_error)?;
        parent_capacity::check_device(state, &devices, result, &facts, parent_limit, config.mode)?;
        let device_bandwidth = inputs.bandwidth.get(devices.len()).copied().unwrap_or_default();
        let on_parent =
            state.devices_on(&parent).map(|d| super::bandwidth::consumed(&d.config)).chain(
                devices
                    .iter()
                    .filter(|(_, f, _, _)| f.if_name == parent)
                    .map(|(_, _, _, c)| super::bandwidth::consumed(c)),
            );
        super::bandwidth::complete(&mut config, result, &facts, device_bandwidth, on_parent)?;
        let ethtool = crate::model::network_config::resolve_ethtool(merged, config.mode.mode())
            .map_err(config_error)?
            .map(|settings| super::ethtool::PreparedEthtool {
                if_name: facts.if_name.clone(),
                settings,
                boot_id: None,
                before: None,
            });
        ethtools.push(ethtool);
        devices.push((result, facts, attributes, config));
    }
    let mut prepared = PreparedClaim {
        uid: claim.uid.clone(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        devices: Vec::with_capacity(devices.len()),
        reserved_for: allocation.pods.clone(),
        generation: allocation.generation,
        pod_claim_index,
        pod_claim_name: allocation.pod_claim_name.clone(),
    };
    let mut held = Held::default();
    let mut need_block = None;
    let outcome: Result<(), ClaimError> = (|| {
        for ((result, facts, attributes, config), ethtool) in devices.into_iter().zip(ethtools) {
            let addresses = match hold_addresses(state, claim, result, &config, &mut held)? {
                Ok(addresses) => addresses,
                Err((plan, ipv4)) => {
                    need_block = Some((plan, ipv4, result.request.clone()));
                    return Ok(());
                }
            };
            prepared.devices.push(PreparedClaimDevice {
                request: result.request.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
                sharing: Some(facts.sharing),
                kind: Some(facts.kind),
                host_mtu: Some(facts.mtu),
                if_name: facts.if_name,
                config,
                addresses,
                attributes,
                cdi_device_ids: Vec::new(),
                vf: None,
                vfio: None,
                ethtool,
            });
        }
        Ok(())
    })();
    // Not pending yet: what this attempt held is given back here, not by a staged guard.
    if outcome.is_err() || need_block.is_some() {
        state.ipam.forget_in_memory(&held.new_leases);
    }
    outcome?;
    if let Some((plan, ipv4, request)) = need_block {
        return Ok(Attempt::NeedBlock { plan, ipv4, request });
    }
    if let Some(metadata) = metadata {
        add_cdi_ids(metadata, &mut prepared);
    }
    state.add_pending(prepared.clone());
    let Held { leases, new_leases, statics } = held;
    Ok(Attempt::Reserved(Reserved { prepared, leases, new_leases, statics }))
}

/// The CDI ids kubelet gets with a claim's devices: the metadata of each top-level request on
/// its first device (kubelet injects every id of every device of the request, and one mount
/// per request is enough), and each device's RDMA character devices (`super::rdma_cdi`).
fn add_cdi_ids(metadata: &DeviceMetadata, prepared: &mut PreparedClaim) {
    let mut seen = BTreeSet::new();
    for device in &mut prepared.devices {
        let request = metadata::top_level(&device.request).to_owned();
        if seen.insert(request.clone()) {
            device.cdi_device_ids = vec![metadata.cdi_device_id(&prepared.uid, &request)];
        }
    }
    super::rdma_cdi::add_ids(metadata.layout().driver(), prepared);
}

/// The leases one reservation attempt holds.
#[derive(Default)]
pub(super) struct Held {
    pub(super) leases: Vec<Lease>,
    pub(super) new_leases: Vec<Lease>,
    pub(super) statics: Vec<StaticReservation>,
}

impl Held {
    pub(super) fn take(&mut self, lease: Lease, new: bool) {
        if new {
            self.new_leases.push(lease.clone());
        }
        self.leases.push(lease);
    }
}

/// Holds the addresses of one allocated device in memory (under the state lock): the
/// interface addresses, or `Err((plan, ipv4))` when the node's blocks of that family of a
/// network are full (what this call held stays in `held`, for the caller to give back).
pub(super) fn hold_addresses<S: LeaseStore>(
    state: &mut State<S>,
    claim: &ClaimRef,
    result: &AllocatedResult,
    config: &ResolvedNetworkConfig,
    held: &mut Held,
) -> Result<Result<Vec<IpNetwork>, (NetworkAddressing, bool)>, ClaimError> {
    let ipam_error = |field: String| {
        move |source| ClaimError::Ipam { request: result.request.clone(), field, source }
    };
    let owner = owner(claim, result);
    let addresses = match &config.addressing {
        Addressing::None => Vec::new(),
        Addressing::Static(addresses) => {
            for (i, address) in addresses.iter().enumerate() {
                let (lease, new) = state
                    .ipam
                    .reserve_static_in_memory(&owner, *address, None)
                    .map_err(ipam_error(format!("ipam.addresses[{i}]")))?;
                held.take(lease, new);
            }
            addresses.clone()
        }
        Addressing::Pool(pool) => {
            check_pool_settings(state.pool_users(), &claim.uid, &result.request, pool)?;
            let (lease, new) = state
                .ipam
                .reserve_in_memory(&owner, pool)
                .map_err(ipam_error("ipam.pool".to_owned()))?;
            let address = lease.interface_address();
            held.take(lease, new);
            vec![address]
        }
        Addressing::Network(plan) if !plan.addresses.is_empty() => {
            for (i, address) in plan.addresses.iter().enumerate() {
                let field = format!("ipam.addresses[{i}]");
                let (lease, new) = state
                    .ipam
                    .reserve_static_in_memory(&owner, *address, Some(&plan.pod_network))
                    .map_err(ipam_error(field.clone()))?;
                held.statics.push(StaticReservation {
                    request: result.request.clone(),
                    field,
                    lease: lease.clone(),
                });
                held.take(lease, new);
            }
            plan.addresses.clone()
        }
        Addressing::Network(plan) => {
            let mut addresses = Vec::with_capacity(2);
            for ipv4 in plan.families() {
                let Some((lease, new)) = state.ipam.reserve_in_blocks(&owner, plan, ipv4) else {
                    return Ok(Err((plan.clone(), ipv4)));
                };
                addresses.push(lease.interface_address());
                held.take(lease, new);
            }
            addresses
        }
    };
    Ok(Ok(addresses))
}

/// Releases a prepared claim durably ([`release_claim`]), then removes its metadata files.
pub(super) fn commit_unprepare<S: ClaimStore>(
    state: &Mutex<State<S>>,
    store: &S,
    metadata: Option<&DeviceMetadata>,
    claim: &ClaimRef,
) -> Result<(), ClaimError> {
    release_claim(state, store, &claim.uid)?;
    // After the record: a crash in between leaves files of a claim that is not prepared,
    // which the next start removes; a failure here fails the unprepare, and kubelet's retry
    // (for a claim no longer prepared) removes them.
    if let Some(metadata) = metadata {
        metadata.remove(claim)?;
    }
    Ok(())
}

/// Forgets a claim and releases its leases in one durable commit, made without the state
/// lock; the addresses stay held in memory until it is done, so none is handed out while
/// the claim could still come back after a crash.
///
/// The batch also records each address's release (quarantine, DESIGN §4). The claim's
/// static `PodNetwork` reservations stay recorded: the caller deletes them in the API next
/// (and the block upkeep does when that fails), so none is ever forgotten while it exists.
pub(super) fn release_claim<S: ClaimStore>(
    state: &Mutex<State<S>>,
    store: &S,
    uid: &str,
) -> Result<(), ClaimError> {
    let commit = {
        let state = lock(state);
        let leases = state.ipam.leases_of_claim(uid);
        let released = state.ipam.release_records(&leases);
        IpamCommit {
            remove_leases: leases,
            put_released: released,
            remove_released: state.ipam.expired_releases(),
            ..IpamCommit::default()
        }
    };
    store.remove_prepared(uid, &commit).map_err(|e| ClaimError::Persist(Box::new(e)))?;
    crate::failpoint!("claims.unprepare.after_commit");
    let mut state = lock(state);
    state.remove_prepared(uid);
    state.ipam.apply_release(&commit.remove_leases, &commit.put_released);
    state.ipam.forget_released(&commit.remove_released);
    Ok(())
}
