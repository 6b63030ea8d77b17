//! What one `ResourceClaim` asks of this driver on this node: the checks kubelet leaves to
//! the driver (UID, single consumer), this driver's allocation results for this node's pool,
//! and this driver's config entries of the allocation snapshot. Pure.

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::{ClaimError, PodConsumer};
use crate::model::ClaimRef;
use crate::model::network_config::{ConfigEntry, ConfigSource};

/// One device allocated to the claim by this driver in this node's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedResult {
    /// Request name (`nic` or `nic/fast` for a `firstAvailable` sub-request).
    pub request: String,
    /// Pool (the node name).
    pub pool: String,
    /// Device name within the pool.
    pub device: String,
    /// `shareID` of a share of a device with `allowMultipleAllocations`.
    pub share_id: Option<String>,
    /// The `netclaim.dev/bandwidth` the request asked for and the allocation consumed.
    pub bandwidth: super::bandwidth::ResultBandwidth,
}

/// This driver's part of a claim's allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAllocation {
    /// Results for this driver and pool, in allocation order.
    pub results: Vec<AllocatedResult>,
    /// This driver's config entries (class and claim), in snapshot order.
    pub config: Vec<ConfigEntry>,
    /// The pods of `status.reservedFor` (at most one: more is refused).
    pub pods: Vec<PodConsumer>,
    /// `metadata.generation`, for the conditions' `observedGeneration`.
    pub generation: Option<i64>,
    /// The pod's entry name of a claim made from a template (its annotation).
    pub pod_claim_name: Option<String>,
}

/// Checks the claim read from the API against kubelet's reference and extracts what this
/// driver (`driver`) must prepare on this node (`pool`).
pub fn extract(
    requested: &ClaimRef,
    claim: &ResourceClaim,
    driver: &str,
    pool: &str,
) -> Result<ClaimAllocation, ClaimError> {
    let found_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if found_uid != requested.uid {
        // A claim deleted and re-created under the same name: kubelet's claim is gone.
        return Err(ClaimError::UidMismatch {
            requested: requested.uid.clone(),
            found: found_uid.to_owned(),
        });
    }
    let status = claim.status.as_ref();
    let consumers = status.and_then(|s| s.reserved_for.as_deref()).unwrap_or_default();
    // KEP-5729 (beta in 1.37, off by default): a claim reserved for a PodGroup is shared by
    // every pod of the group, which one interface cannot be.
    if let Some(group) = consumers.iter().find(|c| c.resource == "podgroups") {
        return Err(ClaimError::PodGroupUnsupported {
            group: group.name.clone(),
            uid: group.uid.clone(),
        });
    }
    if consumers.len() > 1 {
        // One network interface cannot sit in two pods' network namespaces.
        return Err(ClaimError::SharedByPods {
            consumers: consumers
                .iter()
                .map(|c| format!("{} {} (uid {})", c.resource, c.name, c.uid))
                .collect(),
        });
    }
    let pods = consumers
        .iter()
        .filter(|c| c.resource == "pods" && c.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|c| PodConsumer { name: c.name.clone(), uid: c.uid.clone() })
        .collect();
    let Some(devices) = status.and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref())
    else {
        return Err(ClaimError::NotAllocated);
    };
    let results: Vec<AllocatedResult> = devices
        .results
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|r| r.driver == driver && r.pool == pool)
        .map(|r| AllocatedResult {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            bandwidth: super::bandwidth::of_result(claim, r),
        })
        .collect();
    if results.is_empty() {
        return Err(ClaimError::NoResults { driver: driver.to_owned(), pool: pool.to_owned() });
    }
    let mut config = Vec::new();
    for (index, entry) in devices.config.as_deref().unwrap_or_default().iter().enumerate() {
        // The snapshot holds every driver's config; other drivers' entries are not ours to
        // judge (KEP-4381: a driver ignores opaque config it does not own).
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let source = ConfigSource::from_api(&entry.source)
            .ok_or_else(|| ClaimError::ConfigSource { index, value: entry.source.clone() })?;
        config.push(ConfigEntry {
            source,
            requests: entry.requests.clone().unwrap_or_default(),
            parameters: opaque.parameters.0.clone(),
        });
    }
    let pod_claim_name = trusted_pod_claim_name(claim);
    Ok(ClaimAllocation {
        results,
        config,
        pods,
        generation: claim.metadata.generation,
        pod_claim_name,
    })
}

/// The pod's entry name of a claim made from a template (`resource.kubernetes.io/pod-claim-name`),
/// which becomes a directory of the metadata's container path (DESIGN §7: a name from the
/// API goes into a path only once validated). Trusted only when it is a DNS label (what the
/// API server requires of `spec.resourceClaims[].name`; `../..` climbed out of the metadata
/// directory) on a claim a Pod controls (the resourceclaim controller sets that owner on the
/// claims it makes; anyone allowed to create claims can annotate one by hand). Otherwise
/// `None`: the claim is mounted under its own name, as one the pod names directly.
fn trusted_pod_claim_name(claim: &ResourceClaim) -> Option<String> {
    let entry =
        claim.metadata.annotations.as_ref()?.get(super::metadata::POD_CLAIM_NAME_ANNOTATION)?;
    let owned_by_pod = claim.metadata.owner_references.iter().flatten().any(|owner| {
        owner.api_version == "v1" && owner.kind == "Pod" && owner.controller == Some(true)
    });
    if owned_by_pod && crate::inventory::naming::is_dns_label(entry) {
        return Some(entry.clone());
    }
    tracing::warn!(claim = claim.metadata.name.as_deref().unwrap_or_default(),
        namespace = claim.metadata.namespace.as_deref().unwrap_or_default(),
        annotation = %entry, owned_by_pod,
        "ignoring resource.kubernetes.io/pod-claim-name: not a DNS label on a claim a Pod owns; \
         the device metadata is mounted under the claim's own name");
    None
}

/// The claim names of a pod in `spec.resourceClaims` order: a claim named directly, or the
/// claim generated from a template as `status.resourceClaimStatuses` reports it (an empty
/// name while it is not generated yet, so positions stay).
#[must_use]
pub fn pod_claim_names(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let generated = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    entries
        .into_iter()
        .flatten()
        .map(|entry| {
            entry.resource_claim_name.clone().unwrap_or_else(|| {
                generated
                    .into_iter()
                    .flatten()
                    .find(|s| s.name == entry.name)
                    .and_then(|s| s.resource_claim_name.clone())
                    .unwrap_or_default()
            })
        })
        .collect()
}
