//! Who may use a `PodNetwork` (DESIGN §4, decision 0017), checked at prepare: a network's
//! devices serve only claims whose config names that network, and a claim naming a network
//! with a `spec.namespaceSelector` must come from a namespace it selects.
//!
//! DeviceClasses are cluster-wide and a device selector sees neither the claim's config nor
//! its namespace, so the scheduler can hand a network's device (`medianet-eth1`, published
//! with the `podNetwork` attribute) to a plain claim of a generic class, or a claim of any
//! namespace to the network's class. The node is the authority: it refuses both here, before
//! any address is held. The namespace check fails closed: a namespace the node's watch does
//! not know (not synced yet, or not there) is refused, and kubelet retries the prepare.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ClaimService;
use super::allocation::ClaimAllocation;
use super::ports::{LookupError, NamespaceReadError, NamespaceSource, ResolvedDevice};
use crate::inventory::networks::selector_matches;
use crate::ipam::LeaseStore;
use crate::model::ClaimRef;
use crate::model::device::AttributeValue;
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::network_config::NetworkConfig;
use crate::model::pod_network::PodNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Why a claim may not use a network's device or a network.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TenancyError {
    /// The device belongs to a `PodNetwork` the claim's config does not name.
    #[error(
        "request {request}: device {device} belongs to PodNetwork {device_network} and serves \
         only claims whose config names it (podNetwork: {device_network}, as its DeviceClass \
         {device_network}.podnetwork.netclaim.dev sets); this claim {}",
        claim_network.as_ref().map_or_else(
            || "names no PodNetwork".to_owned(),
            |name| format!("names PodNetwork {name}"),
        )
    )]
    ForeignDevice {
        /// Request of the device.
        request: String,
        /// The device.
        device: String,
        /// The network the device is published for.
        device_network: String,
        /// The network the claim's config names, if any.
        claim_network: Option<String>,
    },
    /// The network's `spec.namespaceSelector` does not select the claim's namespace.
    #[error(
        "podNetwork {pod_network}: namespace {namespace} is not selected by the PodNetwork's \
         spec.namespaceSelector"
    )]
    NamespaceNotSelected {
        /// The network.
        pod_network: String,
        /// The claim's namespace.
        namespace: String,
    },
    /// The claim's namespace could not be judged: refused (fails closed).
    #[error(
        "podNetwork {pod_network}: namespace {namespace}: {source} (refused until it is known)"
    )]
    NamespaceUnknown {
        /// The network.
        pod_network: String,
        /// The claim's namespace.
        namespace: String,
        /// Why its labels are unknown.
        #[source]
        source: NamespaceReadError,
    },
    /// The network's `spec.namespaceSelector` is invalid: it selects no namespace.
    #[error(
        "podNetwork {pod_network}: spec.namespaceSelector is invalid and selects no namespace \
         ({why}; the PodNetwork's Ready condition names the field)"
    )]
    InvalidSelector {
        /// The network.
        pod_network: String,
        /// What is wrong.
        why: String,
    },
}

/// The `podNetwork` attribute a device is published with (qualified or not), if any.
fn device_network(attributes: &BTreeMap<String, AttributeValue>) -> Option<&str> {
    let key = attr::POD_NETWORK;
    match attributes.get(&format!("{ATTRIBUTE_DOMAIN}/{key}")).or_else(|| attributes.get(key)) {
        Some(AttributeValue::String(name)) => Some(name),
        _ => None,
    }
}

/// Refuses a device published for a `PodNetwork` allocated to a claim whose merged config
/// (`merged`, one per result) names no network or another one. Devices that could not be
/// resolved are left to the caller, which reports them.
pub fn check_devices(
    allocation: &ClaimAllocation,
    merged: &[NetworkConfig],
    resolved: &[Result<ResolvedDevice, LookupError>],
) -> Result<(), TenancyError> {
    for ((result, config), device) in allocation.results.iter().zip(merged).zip(resolved) {
        let Ok(device) = device else { continue };
        let Some(network) = device_network(&device.attributes) else { continue };
        if config.pod_network.as_deref() != Some(network) {
            return Err(TenancyError::ForeignDevice {
                request: result.request.clone(),
                device: result.device.clone(),
                device_network: network.to_owned(),
                claim_network: config.pod_network.clone(),
            });
        }
    }
    Ok(())
}

/// Refuses `claim` unless every network in `networks` with a non-empty `namespaceSelector`
/// selects the claim's namespace, whose labels come from `namespaces` (the node's watch;
/// `None`: this node watches no namespaces, so a selector refuses everything).
pub async fn check_namespace(
    claim: &ClaimRef,
    networks: &BTreeMap<String, PodNetwork>,
    namespaces: Option<&dyn NamespaceSource>,
) -> Result<(), TenancyError> {
    let selecting: Vec<(&String, &LabelSelector)> = networks
        .iter()
        .filter_map(|(name, network)| Some((name, network.spec.namespace_selector.as_ref()?)))
        // Empty selects every namespace, as a Kubernetes LabelSelector does.
        .filter(|(_, selector)| {
            selector.match_labels.as_ref().is_some_and(|labels| !labels.is_empty())
                || selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
        })
        .collect();
    let Some((first, _)) = selecting.first() else { return Ok(()) };
    let read = match namespaces {
        Some(source) => source.labels(&claim.namespace).await,
        None => Err(NamespaceReadError::NotWatched),
    };
    let labels = read.map_err(|source| TenancyError::NamespaceUnknown {
        pod_network: (*first).clone(),
        namespace: claim.namespace.clone(),
        source,
    })?;
    for (name, selector) in selecting {
        // The matcher is the one of nodeSelector (same LabelSelector rules); its messages
        // name that field.
        let selected = selector_matches(Some(selector), &labels).map_err(|err| {
            TenancyError::InvalidSelector {
                pod_network: name.clone(),
                why: err.to_string().replacen("spec.nodeSelector", "spec.namespaceSelector", 1),
            }
        })?;
        if !selected {
            return Err(TenancyError::NamespaceNotSelected {
                pod_network: name.clone(),
                namespace: claim.namespace.clone(),
            });
        }
    }
    Ok(())
}

impl<R, D, S: LeaseStore> ClaimService<R, D, S> {
    /// Judges `spec.namespaceSelector` of networks on the namespaces' labels from `source`
    /// (`k8s::namespaces`); without it a network with a selector refuses every claim.
    #[must_use]
    pub fn with_namespaces(mut self, source: Arc<dyn NamespaceSource>) -> Self {
        self.namespaces = Some(source);
        self
    }
}
