//! The claim service: the per-claim locks, prepare (read, resolve, stage, commit as one
//! call) and unprepare. See [`crate::claims`] for the durability order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use ipnetwork::IpNetwork;

use super::allocation::{self, ClaimAllocation};
use super::commit::{
    Attempt, ReadyClaim, Reserved, SharedCause, commit_prepares, commit_unprepare, reserve_claim,
};
use super::error::{ClaimError, LoadError};
use super::metadata::DeviceMetadata;
use super::networks::{self, NetworkPorts};
use super::ports::{ClaimSource, ClaimStore, DeviceSource, ReadError, ResolvedDevice};
use super::preparer::{
    ClaimFailure, ClaimPreparer, PrepareResults, PreparedDevice, UnprepareResults,
};
use super::record::PreparedClaim;
use super::staged::StagedClaim;
use super::state::{State, lock};
use super::tenancy;
use super::vf::VfPort;
use crate::ipam::{Clock, Ipam, IpamError, LeaseOwner, LeaseStore, SystemClock};
use crate::model::ClaimRef;
use crate::model::device::AttributeValue;
use crate::model::network_config::{self, Addressing, DeviceFacts, NetworkConfig, NodeSupport};
use crate::model::pod_network::PodNetwork;
use crate::model::support::KernelSupport;
use crate::podnet::plan::node_support;

/// Claims of one request prepared at the same time; kubelet sends one pod's claims, and a
/// bound keeps a pathological request from opening unbounded API calls.
pub const MAX_CONCURRENT_CLAIMS: usize = 16;

/// Identity of this node's pool.
#[derive(Debug, Clone)]
pub struct ServiceIdentity {
    /// Our driver name.
    pub driver: String,
    /// The node name (our pool name).
    pub node: String,
}

/// The claim preparer of the node daemon.
pub struct ClaimService<R, D, S: LeaseStore> {
    pub(super) identity: ServiceIdentity,
    pub(super) reader: R,
    pub(super) devices: D,
    pub(super) state: Arc<Mutex<State<S>>>,
    /// Device metadata files (KEP-5304); `None` when turned off.
    pub(super) metadata: Option<Arc<DeviceMetadata>>,
    /// The modes and features this node can attach; prepare refuses the others (DESIGN §2).
    pub(super) support: Arc<NodeSupport>,
    /// One async lock per claim UID in flight, so the same claim is never worked on twice
    /// at once (kubelet may repeat a call that timed out while the first still runs).
    pub(super) in_flight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `PodNetwork`s and their `IPBlock`s; `None`: claims naming a network are refused.
    pub(super) networks: Option<NetworkPorts>,
    /// One async lock per (network, IPv4?) serialising this node's block claims, so
    /// concurrent prepares that find the blocks full claim one block, not one each.
    pub(super) block_gates: networks::BlockGates,
    /// The start-up reconcile and the watch of this node's blocks (decision 0017).
    pub(super) supervision: networks::Supervision,
    /// VF settings on the PF (mode `sriov-vf`); `None`: such claims fail at prepare.
    pub(super) vf_port: Option<Arc<dyn VfPort>>,
    /// Functions bound to vfio-pci (mode `vfio`); `None`: such claims fail at prepare.
    pub(super) vfio: Option<Arc<super::vfio::VfioBindings>>,
    /// `ethtool` settings of exclusive devices; `None`: claims with `ethtool` fail at prepare.
    pub(super) ethtool_port: Option<Arc<dyn super::ethtool::EthtoolPort>>,
    /// The namespaces' labels for `namespaceSelector` ([`super::tenancy`]); `None`: a network
    /// with a selector refuses every claim.
    pub(super) namespaces: Option<Arc<dyn super::ports::NamespaceSource>>,
    /// The durable store: claim records, VF snapshots and (through the IPAM) leases.
    pub(super) store: S,
}

impl<R, D, S: LeaseStore> std::fmt::Debug for ClaimService<R, D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimService").field("identity", &self.identity).finish_non_exhaustive()
    }
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Loads the leases and prepared claims from `store` (blocking) and releases leases no
    /// prepared claim holds (a crash between the lease write and the claim write).
    pub fn load(
        identity: ServiceIdentity,
        reader: R,
        devices: D,
        store: S,
    ) -> Result<Self, LoadError> {
        Self::load_with_clock(identity, reader, devices, store, Arc::new(SystemClock))
    }

    /// [`ClaimService::load`] with the IPAM on `clock` (tests move time by hand).
    pub fn load_with_clock(
        identity: ServiceIdentity,
        reader: R,
        devices: D,
        store: S,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LoadError> {
        let claims = store.load_claims().map_err(|e| LoadError::Claims(Box::new(e)))?;
        let mut ipam = Ipam::load_with_clock(store.clone(), clock)?;
        let prepared: HashMap<String, PreparedClaim> =
            claims.into_iter().map(|c| (c.uid.clone(), c)).collect();
        let orphans: BTreeSet<String> = ipam
            .leases()
            .map(|l| l.owner.claim_uid.clone())
            .filter(|uid| !prepared.contains_key(uid))
            .collect();
        for uid in orphans {
            let released = ipam.release_claim(&uid)?;
            tracing::info!(claim_uid = %uid, leases = released.len(),
                "released leases of a claim whose preparation did not complete");
        }
        // Static addresses are leases (DESIGN §4); claims prepared by a release that did not
        // lease them get their leases now, so no pool hands those addresses out.
        for claim in prepared.values() {
            for device in &claim.devices {
                let Addressing::Static(addresses) = &device.config.addressing else { continue };
                let owner = LeaseOwner {
                    claim_uid: claim.uid.clone(),
                    request: device.request.clone(),
                    device: device.device.clone(),
                    share_id: device.share_id.clone(),
                };
                for address in addresses {
                    match ipam.reserve_static(&owner, *address) {
                        Ok(_) => {}
                        Err(IpamError::AddressTaken { holder, .. }) => tracing::warn!(
                            claim = %claim.name, namespace = %claim.namespace, %address,
                            other_claim_uid = %holder.claim_uid,
                            "two prepared claims hold one static address (prepared before static addresses were leases)"
                        ),
                        Err(err) => return Err(LoadError::Ipam(err)),
                    }
                }
            }
        }
        Ok(Self {
            identity,
            reader,
            devices,
            state: Arc::new(Mutex::new(State::new(ipam, prepared))),
            metadata: None,
            // Until the daemon hands over its probe, only what this build cannot attach is
            // refused.
            support: Arc::new(node_support(&KernelSupport::unprobed())),
            in_flight: Mutex::new(HashMap::new()),
            networks: None,
            block_gates: Mutex::new(HashMap::new()),
            supervision: networks::Supervision::default(),
            vf_port: None,
            vfio: None,
            ethtool_port: None,
            namespaces: None,
            store,
        })
    }

    /// Turns device metadata on: claims prepared from now on get metadata files and CDI
    /// ids, and the files of the claims already prepared are put right (blocking I/O).
    pub fn with_metadata(mut self, metadata: Arc<DeviceMetadata>) -> Result<Self, LoadError> {
        let claims: Vec<PreparedClaim> = lock(&self.state).prepared.values().cloned().collect();
        metadata.restore(&claims).map_err(LoadError::Metadata)?;
        self.metadata = Some(metadata);
        Ok(self)
    }

    /// Refuses at prepare what this node cannot attach: `kernel` is what the start-up probe
    /// found (`host::kernel_probe`), combined with what this build implements.
    #[must_use]
    pub fn with_kernel_support(mut self, kernel: &KernelSupport) -> Self {
        self.support = Arc::new(node_support(kernel));
        self
    }

    /// Refuses `bandwidth.ingress: police` at prepare with `why` (the node's eBPF programs
    /// are not available; `host::qdisc_ceiling::node_ceilings`). After
    /// [`Self::with_kernel_support`], which starts the refusals afresh.
    #[must_use]
    pub fn with_police_refused(mut self, why: impl Into<String>) -> Self {
        self.support = Arc::new((*self.support).clone().refuse_police(why));
        self
    }

    /// Applies the `ethtool` settings of exclusive devices through `port` (`host::ethtool`).
    #[must_use]
    pub fn with_ethtool_port(mut self, port: Arc<dyn super::ethtool::EthtoolPort>) -> Self {
        self.ethtool_port = Some(port);
        self
    }

    /// Applies the VF settings of `sriov-vf` claims through `port` (`host::sriov`).
    #[must_use]
    pub fn with_vf_port(mut self, port: Arc<dyn VfPort>) -> Self {
        self.vf_port = Some(port);
        self
    }

    /// The prepared claim of `uid`, if any.
    #[must_use]
    pub fn prepared(&self, uid: &str) -> Option<PreparedClaim> {
        lock(&self.state).prepared.get(uid).cloned()
    }

    /// The prepared claims reserved for the pod with `pod_uid`, ordered by claim name (the
    /// attach order when the pod's `resourceClaims` order is unknown, DESIGN §3).
    #[must_use]
    pub fn prepared_for_pod(&self, pod_uid: &str) -> Vec<PreparedClaim> {
        let mut claims: Vec<PreparedClaim> =
            lock(&self.state).prepared_for_pod(pod_uid).cloned().collect();
        claims
            .sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
        claims
    }

    /// `(claim UID, request)` of every prepared device with `stats: false`, read under the
    /// state lock without copying the claims.
    #[must_use]
    pub fn stats_off_devices(&self) -> std::collections::BTreeSet<(String, String)> {
        lock(&self.state)
            .prepared
            .values()
            .flat_map(|claim| {
                claim
                    .devices
                    .iter()
                    .filter(|d| !d.config.stats)
                    .map(|d| (claim.uid.clone(), d.request.clone()))
            })
            .collect()
    }

    /// The names of the devices of `pool` that prepared claims use, read under the state lock
    /// without copying the claims (the slice publisher asks at each publication).
    #[must_use]
    pub fn prepared_devices_in_pool(&self, pool: &str) -> std::collections::BTreeSet<String> {
        lock(&self.state)
            .prepared
            .values()
            .flat_map(|claim| &claim.devices)
            .filter(|device| device.pool == pool)
            .map(|device| device.device.clone())
            .collect()
    }

    /// Every prepared claim.
    #[must_use]
    pub fn all_prepared(&self) -> Vec<PreparedClaim> {
        lock(&self.state).prepared.values().cloned().collect()
    }

    /// Addresses leased per pool subnet, for `netclaim_ipam_addresses`.
    #[must_use]
    pub fn leased_per_pool(&self) -> std::collections::BTreeMap<IpNetwork, usize> {
        lock(&self.state).ipam.leased_per_pool()
    }

    /// UIDs of every prepared claim.
    #[must_use]
    pub fn prepared_uids(&self) -> Vec<String> {
        let mut uids: Vec<String> = lock(&self.state).prepared.keys().cloned().collect();
        uids.sort_unstable();
        uids
    }

    /// Whether the claim `namespace/name` with `uid` still exists in the API (`false` when
    /// it was deleted or replaced by another claim of the same name).
    pub async fn exists_in_api(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, ReadError> {
        match self.reader.get(namespace, name).await {
            Ok(claim) => Ok(claim.metadata.uid.as_deref() == Some(uid)),
            Err(ReadError::NotFound) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Takes the per-UID lock of `uid` (give it back with [`Self::unlock_uid`]).
    pub(super) async fn lock_uid(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let gate = Arc::clone(lock(&self.in_flight).entry(uid.to_owned()).or_default());
        gate.lock_owned().await
    }

    /// Gives back a lock of [`Self::lock_uid`], forgetting the UID's gate when no one else
    /// holds or waits on it.
    pub(super) fn unlock_uid(&self, uid: &str, held: tokio::sync::OwnedMutexGuard<()>) {
        drop(held);
        let mut in_flight = lock(&self.in_flight);
        // Clones are only made under this mutex: one reference means only the map's.
        if in_flight.get(uid).is_some_and(|g| Arc::strong_count(g) == 1) {
            in_flight.remove(uid);
        }
    }

    /// Runs `work` holding the per-UID lock of `uid`.
    pub(super) async fn serialised<T>(&self, uid: &str, work: impl Future<Output = T>) -> T {
        let gate = Arc::clone(lock(&self.in_flight).entry(uid.to_owned()).or_default());
        let result = {
            let _held = gate.lock().await;
            work.await
        };
        let mut in_flight = lock(&self.in_flight);
        // Clones are only made under this mutex: two references means ours and the map's.
        if in_flight.get(uid).is_some_and(|g| Arc::strong_count(g) == 2) {
            in_flight.remove(uid);
        }
        result
    }

    /// Prepares one claim (holding its UID lock): a call of one claim.
    pub async fn prepare_claim(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, ClaimError> {
        let mut answers = self.prepare_claims(std::slice::from_ref(claim)).await;
        answers.pop().map_or_else(|| Err(ClaimError::Unanswered), |(_, answer)| answer)
    }

    /// Prepares the claims of one call: each claim is checked and its addresses held on its
    /// own (holding its UID lock), then the claims that passed are committed together, in
    /// one blocking task and one durable store commit. A claim that fails its checks fails
    /// alone and keeps nothing. A UID repeated in the call is answered once.
    pub async fn prepare_claims(
        &self,
        claims: &[ClaimRef],
    ) -> Vec<(ClaimRef, Result<Vec<PreparedDevice>, ClaimError>)> {
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<ClaimRef> =
            claims.iter().filter(|c| seen.insert(c.uid.as_str())).cloned().collect();
        // Every claim's UID lock stays held until its commit is done, so a concurrent call
        // for the same claim waits and then answers from memory. The locks are taken in UID
        // order before any claim is staged: two calls sharing claims cannot each hold one
        // the other waits for.
        let mut unique = unique;
        unique.sort_unstable_by(|a, b| a.uid.cmp(&b.uid));
        // This call commits once, after its reads: announced now, a commit of another call
        // ready earlier waits for it a moment and they share one fdatasync (a burst of
        // kubelet's one-pod calls); withdrawn once committed.
        let notice = self.store.announce_commit();
        let mut held = Vec::with_capacity(unique.len());
        for claim in &unique {
            held.push((claim.uid.clone(), self.lock_uid(&claim.uid).await));
        }
        let staged: Vec<(ClaimRef, StageOutcome<'_, R, D, S>)> = futures::stream::iter(unique)
            .map(|claim| async move {
                let staged = self.stage_claim(&claim).await;
                (claim, staged)
            })
            .buffer_unordered(MAX_CONCURRENT_CLAIMS)
            .collect()
            .await;
        let mut answers = Vec::with_capacity(staged.len());
        let mut ready = Vec::new();
        for (claim, outcome) in staged {
            match outcome {
                Ok(Staged::Done(answer)) => answers.push((claim, Ok(answer))),
                Err(err) => answers.push((claim, Err(err))),
                Ok(Staged::Ready(staged)) => ready.push(*staged),
            }
        }
        if ready.is_empty() {
            drop(notice);
        } else {
            let to_commit: Vec<ReadyClaim> = ready.iter_mut().map(StagedClaim::ready).collect();
            let state = Arc::clone(&self.state);
            let store = self.store.clone();
            let metadata = self.metadata.clone();
            let committed = tokio::task::spawn_blocking(move || {
                let outcomes = commit_prepares(&state, &store, metadata.as_deref(), to_commit);
                drop(notice);
                outcomes
            })
            .await;
            let outcomes: Vec<Result<Vec<PreparedDevice>, ClaimError>> = match committed {
                Ok(outcomes) => outcomes,
                Err(join) => {
                    let cause = SharedCause(Arc::new(join));
                    ready
                        .iter()
                        .map(|_| Err(ClaimError::Persist(Box::new(cause.clone()))))
                        .collect()
                }
            };
            for (staged, outcome) in ready.into_iter().zip(outcomes) {
                let claim = staged.claim().clone();
                match &outcome {
                    Ok(_) => staged.committed(),
                    Err(_) => staged.undo().await,
                }
                answers.push((claim, outcome));
            }
        }
        for (uid, guard) in held {
            self.unlock_uid(&uid, guard);
        }
        answers
    }

    /// Checks one claim and holds what it needs (addresses in memory, VF settings, static
    /// reservations in the API) in a [`StagedClaim`]; on an error nothing stays held.
    pub(super) async fn stage_claim(
        &self,
        claim: &ClaimRef,
    ) -> Result<Staged<'_, R, D, S>, ClaimError> {
        if let Some(done) = lock(&self.state).prepared.get(&claim.uid) {
            return Ok(Staged::Done(done.kubelet_devices()));
        }
        let object = self.reader.get(&claim.namespace, &claim.name).await?;
        let allocation =
            allocation::extract(claim, &object, &self.identity.driver, &self.identity.node)?;
        let pod_claim_index = match allocation.pods.first() {
            Some(pod) => self
                .reader
                .pod_claim_names(&claim.namespace, &pod.name)
                .await?
                .and_then(|names| names.iter().position(|n| *n == claim.name))
                .and_then(|i| u32::try_from(i).ok()),
            None => None,
        };
        let merged = merged_configs(&allocation)?;
        // One look at the node's inventory for every device of the claim; the attributes
        // always, since a network's device serves only that network's claims (tenancy).
        let names: Vec<String> = allocation.results.iter().map(|r| r.device.clone()).collect();
        let resolved = self.devices.resolve(&names, true).await;
        tenancy::check_devices(&allocation, &merged, &resolved)?;
        let mut facts = Vec::with_capacity(allocation.results.len());
        let mut vfs = Vec::with_capacity(allocation.results.len());
        let mut bandwidth = Vec::with_capacity(allocation.results.len());
        let mut pcis = Vec::with_capacity(allocation.results.len());
        for (result, device) in allocation.results.iter().zip(resolved) {
            let ResolvedDevice { facts: found, parent_limit, parent_bandwidth, mut attributes, vf } =
                device.map_err(|source| ClaimError::Device {
                    request: result.request.clone(),
                    source,
                })?;
            bandwidth.push(super::bandwidth::device_bandwidth(
                &found,
                parent_bandwidth,
                &attributes,
            ));
            pcis.push(super::vfio::pci_of(&attributes));
            if self.metadata.is_none() {
                // Kept in the record only for the device metadata file.
                attributes.clear();
            }
            vfs.push(vf);
            facts.push((found, attributes, parent_limit));
        }
        // The PodNetworks the configs name, from the node's watch (no API call).
        let networks = self.pod_networks(&network_names(&allocation, &merged)).await?;
        tenancy::check_namespace(claim, &networks, self.namespaces.as_deref()).await?;
        let inputs = PrepareInputs {
            claim,
            allocation: &allocation,
            facts,
            merged,
            networks,
            pod_claim_index,
            bandwidth,
        };
        let reserved = match self.reserve_claiming_blocks(&inputs).await? {
            Ok(reserved) => reserved,
            Err(answer) => return Ok(Staged::Done(answer)),
        };
        let statics = reserved.statics.clone();
        let mut staged = StagedClaim::new(self, claim, reserved);
        // VF settings on the PF, before the record that keeps what they replaced.
        if let Err(err) = self.apply_vf_settings(staged.prepared_mut(), &vfs).await {
            staged.undo().await;
            return Err(err);
        }
        // ethtool in the host netns, before the device moves (the values go with the netdev).
        if let Err(err) = self.apply_ethtool_settings(staged.prepared_mut()).await {
            staged.undo().await;
            return Err(err);
        }
        // vfio-pci after the VF settings (the VF's netdev takes its MAC before it goes).
        if let Err(err) = self.bind_vfio(staged.prepared_mut(), &pcis).await {
            staged.undo().await;
            return Err(err);
        }
        // Static PodNetwork addresses: reserved cluster-wide (API, without the lock).
        match self.reserve_statics(claim, &statics).await {
            Ok(reservations) => staged.hold_reservations(reservations),
            Err((err, created)) => {
                staged.hold_reservations(created);
                staged.undo().await;
                return Err(err);
            }
        }
        Ok(Staged::Ready(Box::new(staged)))
    }

    /// Validates the claim and holds its addresses in memory under the state lock; when the
    /// node's blocks of a network are full, claims a block (API, without the lock) and tries
    /// again. `Err(answer)`: the claim was prepared meanwhile.
    pub(super) async fn reserve_claiming_blocks(
        &self,
        inputs: &PrepareInputs<'_>,
    ) -> Result<Result<Reserved, Vec<PreparedDevice>>, ClaimError> {
        let mut block_claims = 0;
        loop {
            let attempt = {
                let mut state = lock(&self.state);
                reserve_claim(&mut state, self.metadata.as_deref(), &self.support, inputs)?
            };
            match attempt {
                Attempt::Done(answer) => return Ok(Err(answer)),
                Attempt::Reserved(reserved) => return Ok(Ok(reserved)),
                Attempt::NeedBlock { plan, ipv4, request } => {
                    block_claims += 1;
                    if block_claims > networks::MAX_BLOCK_CLAIMS {
                        return Err(ClaimError::Ipam {
                            request,
                            field: "podNetwork".to_owned(),
                            source: IpamError::NoFreeBlock {
                                family: if ipv4 { 4 } else { 6 },
                                block_prefix: plan.block_prefix(ipv4),
                                subnets: format!(
                                    "{} (filled by other prepares {} times in a row)",
                                    plan.pod_network,
                                    networks::MAX_BLOCK_CLAIMS
                                ),
                            },
                        });
                    }
                    self.claim_block(&plan, ipv4, &inputs.claim.uid, &request).await?;
                }
            }
        }
    }

    /// Unprepares one claim (holding its UID lock): sets its VFs back as they were found,
    /// releases its addresses and forgets it. A VF that cannot be set back fails the
    /// unprepare before anything is forgotten, so kubelet's retry tries again.
    pub async fn unprepare_claim(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        self.serialised(&claim.uid, async {
            let prepared = lock(&self.state).prepared.get(&claim.uid).cloned();
            if let Some(prepared) = prepared {
                self.restore_ethtool_settings(&prepared).await?;
                self.restore_vf_settings(&prepared).await?;
                // Back to its driver after the VF settings, which it starts from.
                self.release_vfio(&prepared.uid).await?;
            }
            let state = Arc::clone(&self.state);
            let store = self.store.clone();
            let metadata = self.metadata.clone();
            let owned_claim = claim.clone();
            tokio::task::spawn_blocking(move || {
                commit_unprepare(&state, &store, metadata.as_deref(), &owned_claim)
            })
            .await
            .map_err(ClaimError::Task)??;
            // Static PodNetwork reservations go once the claim is released.
            self.drop_orphan_reservations().await;
            Ok(())
        })
        .await
    }
}

/// What a prepare reads before it reserves: the claim, its allocation, the devices' facts
/// (with their published attributes and parent limits), the merged config of each result,
/// and the `PodNetwork`s they name.
pub(super) struct PrepareInputs<'a> {
    pub(super) claim: &'a ClaimRef,
    pub(super) allocation: &'a ClaimAllocation,
    pub(super) facts: Vec<(DeviceFacts, BTreeMap<String, AttributeValue>, Option<u32>)>,
    pub(super) merged: Vec<NetworkConfig>,
    pub(super) networks: BTreeMap<String, PodNetwork>,
    pub(super) pod_claim_index: Option<u32>,
    /// Per result, what the node knows of the device's bandwidth (`claims::bandwidth`).
    pub(super) bandwidth: Vec<super::bandwidth::DeviceBandwidth>,
}

/// The merged config of each allocation result (class entries, then claim entries).
pub(super) fn merged_configs(
    allocation: &ClaimAllocation,
) -> Result<Vec<NetworkConfig>, ClaimError> {
    allocation
        .results
        .iter()
        .map(|result| {
            network_config::merge_for_request(&allocation.config, &result.request).map_err(
                |source| ClaimError::Config {
                    request: result.request.clone(),
                    device: result.device.clone(),
                    source: Box::new(source),
                },
            )
        })
        .collect()
}

/// The `PodNetwork`s the merged configs name, each with the first request and device that
/// names it (for the error).
pub(super) fn network_names(
    allocation: &ClaimAllocation,
    merged: &[NetworkConfig],
) -> BTreeMap<String, (String, String)> {
    let mut names = BTreeMap::new();
    for (result, config) in allocation.results.iter().zip(merged) {
        if let Some(name) = &config.pod_network {
            names
                .entry(name.clone())
                .or_insert_with(|| (result.request.clone(), result.device.clone()));
        }
    }
    names
}

/// How staging one claim of a call ended.
type StageOutcome<'s, R, D, S> = Result<Staged<'s, R, D, S>, ClaimError>;

/// How staging one claim of a call ended without an error.
pub(super) enum Staged<'s, R, D, S: ClaimStore> {
    /// Prepared before (a repeated call): its answer.
    Done(Vec<PreparedDevice>),
    /// Checked, its addresses held in memory (pending): to be committed with the call.
    Ready(Box<StagedClaim<'s, R, D, S>>),
}

/// The message kubelet gets for a claim that failed: the error and each cause once, without
/// the claim's name, which kubelet puts in front ("NodePrepareResources failed for
/// ResourceClaim <name>: <message>", pkg/kubelet/cm/dra/manager.go).
pub(super) fn failure(err: &ClaimError) -> ClaimFailure {
    ClaimFailure::new(crate::model::cause::chain(err))
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimPreparer for ClaimService<R, D, S> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.prepare_claims(&claims)
            .await
            .into_iter()
            .map(|(claim, result)| {
                if let Err(err) = &result {
                    tracing::warn!(claim = %claim, error = %err, "prepare failed");
                }
                (claim.uid.clone(), result.map_err(|e| failure(&e)))
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        futures::stream::iter(claims)
            .map(|claim| async move {
                let result = self.unprepare_claim(&claim).await;
                (claim.uid.clone(), result.map_err(|e| failure(&e)))
            })
            .buffer_unordered(MAX_CONCURRENT_CLAIMS)
            .collect()
            .await
    }
}
