//! Pure placement of pods on nodes (no I/O): the scheduler's filter and score for a
//! development cluster of several nodes, and which node a claim is allocated for.
//!
//! - [`place`]: a pod without `spec.nodeName` → the node it should run on. A node fits when
//!   every claim of the pod can be had there: claims already allocated must carry a
//!   `nodeSelector` the node satisfies (or none), the others are allocated tentatively on the
//!   node's devices (claims from templates that do not exist yet are allocated as the
//!   template's spec). Among the nodes that fit, the least loaded one (pods bound to it that
//!   have not finished) wins, ties in the order the nodes were given, so pods created one
//!   after another alternate between equal nodes. The tentative allocations are returned so
//!   later pods of the same pass see those devices as taken.
//! - [`assumed_claims`]: the claims bound pods are about to create from templates (the
//!   kubelet creates them after binding), allocated tentatively on their node, so a pass does
//!   not hand the same exclusive device to the next pod before the first pod's claim exists
//!   (the scheduler's "assume" cache).
//! - [`consumer_node`]: the node a pending claim is to be allocated for: that of a bound pod
//!   using it (named in `spec.resourceClaims`, recorded in the Pod's status, or owning the
//!   claim as its controller).
//!
//! Not modelled: pod affinity, taints and tolerations, resources other than claims (CPU,
//! memory, extended resources served by device plugins), preemption.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, Pod};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, ResourceClaim, ResourceClaimStatus, ResourceClaimTemplate,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::allocate::{AllocationInput, Usage, allocate_with_usage};

/// Annotation on a claim generated from a template naming the Pod's `spec.resourceClaims`
/// entry (set by the resourceclaim controller, or by whoever stands in for it).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// A node pods can be placed on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCandidate {
    /// `metadata.name`.
    pub name: String,
    /// Its labels (for `nodeSelector` terms with `matchExpressions`); empty when the Node
    /// object does not exist.
    pub labels: BTreeMap<String, String>,
}

impl NodeCandidate {
    /// A node with no labels.
    #[must_use]
    pub fn named(name: &str) -> Self {
        Self { name: name.to_owned(), labels: BTreeMap::new() }
    }
}

/// Everything placement looks at.
#[derive(Debug, Clone, Copy)]
pub struct SchedulingInput<'a> {
    /// The nodes to choose from, in tie-break order.
    pub nodes: &'a [NodeCandidate],
    /// All ResourceSlices.
    pub slices: &'a [ResourceSlice],
    /// All DeviceClasses.
    pub classes: &'a [DeviceClass],
    /// All claims (allocated ones hold their devices).
    pub claims: &'a [ResourceClaim],
    /// All ResourceClaimTemplates.
    pub templates: &'a [ResourceClaimTemplate],
    /// All pods (the bound ones are each node's load).
    pub pods: &'a [Pod],
}

/// kube-scheduler's DynamicResources Filter reason for a node on which the pod's claims
/// cannot all be allocated.
pub const CANNOT_ALLOCATE: &str = "cannot allocate all claims";
/// kube-scheduler's DynamicResources Filter reason for a node outside an allocated claim's
/// `nodeSelector`.
pub const NOT_AVAILABLE_ON_NODE: &str = "resourceclaim not available on the node";

/// Why one node does not fit a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRejection {
    /// The node.
    pub node: String,
    /// The scheduler's short reason ([`CANNOT_ALLOCATE`] or [`NOT_AVAILABLE_ON_NODE`]),
    /// counted per reason in the message as kube-scheduler does.
    pub reason: &'static str,
    /// Which claim and why (the allocator's error), which kube-scheduler only logs.
    pub detail: String,
}

/// Why a pod is not placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Something the pod names does not exist yet (a claim, a template): it is waited for,
    /// as the scheduler does, not reported as a failure.
    #[error("{0}")]
    Waiting(String),
    /// The pod's spec is malformed.
    #[error("pod field {field}: {message}")]
    InvalidPod {
        /// The field path.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A request of a claim to be allocated names a DeviceClass that does not exist: no
    /// node is tried (kube-scheduler's PreFilter rejects the pod until a DeviceClass is
    /// created or changed). The first sentence is kube-scheduler's wording.
    #[error(
        "0/{nodes} nodes are available: request {request}: device class {class} does not \
         exist. The request is in {origin}."
    )]
    MissingClass {
        /// How many nodes there are.
        nodes: usize,
        /// Where the request is: `ResourceClaim x in namespace y` or `ResourceClaimTemplate
        /// x in namespace y` (a template's claim is made only once the pod is bound).
        origin: String,
        /// The request (`<main>/<sub>` for a subrequest).
        request: String,
        /// The class it names.
        class: String,
    },
    /// No node fits; why not, per node, in the order the nodes were given.
    #[error("{}", describe_rejections(reasons))]
    Unschedulable {
        /// Every node's rejection.
        reasons: Vec<NodeRejection>,
    },
}

/// kube-scheduler's message for a pod no node fits ("0/2 nodes are available: 1 cannot
/// allocate all claims, 1 resourceclaim not available on the node.": a count per reason,
/// reasons sorted), followed by each node's detail, which kube-scheduler only logs. Without
/// the scheduler's "preemption: ..." sentence: nothing here preempts.
fn describe_rejections(reasons: &[NodeRejection]) -> String {
    if reasons.is_empty() {
        return "no nodes available to schedule pods".to_owned();
    }
    let mut histogram: BTreeMap<&str, usize> = BTreeMap::new();
    for rejection in reasons {
        *histogram.entry(rejection.reason).or_default() += 1;
    }
    let mut counts: Vec<String> =
        histogram.iter().map(|(reason, count)| format!("{count} {reason}")).collect();
    // kube-scheduler sorts the "<count> <reason>" strings.
    counts.sort();
    let details: Vec<String> =
        reasons.iter().map(|r| format!("{}: {}", r.node, r.detail)).collect();
    format!(
        "0/{} nodes are available: {}. Per node: {}.",
        reasons.len(),
        counts.join(", "),
        details.join("; ")
    )
}

/// Where a pod goes.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The chosen node.
    pub node: String,
    /// The pod's claims as allocated tentatively on that node (unallocated claims and
    /// template claims that do not exist yet): account them for later pods of the same pass.
    pub assumed: Vec<ResourceClaim>,
}

/// One claim a pod uses.
enum PodClaim<'a> {
    /// An existing claim.
    Existing(&'a ResourceClaim),
    /// One to be made from a template (not yet there), and the template's name.
    FromTemplate(Box<ResourceClaim>, String),
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether `pod` still needs a node: no `spec.nodeName`, not being deleted, not finished.
#[must_use]
pub fn is_unbound(pod: &Pod) -> bool {
    node_of(pod).is_none() && pod.metadata.deletion_timestamp.is_none() && !is_terminal(pod)
}

/// Pods bound to each node that have not finished.
fn loads<'a>(nodes: &'a [NodeCandidate], pods: &[Pod]) -> BTreeMap<&'a str, usize> {
    let mut loads: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.name.as_str(), 0)).collect();
    for pod in pods.iter().filter(|p| !is_terminal(p)) {
        if let Some(load) = node_of(pod).and_then(|node| loads.get_mut(node)) {
            *load += 1;
        }
    }
    loads
}

/// The claim generated for `entry` of `pod`, if it exists: the one its status names, else
/// one the pod owns as controller with the entry annotation.
fn generated_claim<'a>(
    pod: &Pod,
    entry: &str,
    claims: &'a [ResourceClaim],
) -> Option<&'a ResourceClaim> {
    let namespace = pod.metadata.namespace.as_deref();
    let in_namespace = |c: &&ResourceClaim| c.metadata.namespace.as_deref() == namespace;
    let recorded = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .find(|s| s.name == entry)
        .and_then(|s| s.resource_claim_name.as_deref());
    if let Some(name) = recorded
        && let Some(claim) =
            claims.iter().filter(in_namespace).find(|c| c.metadata.name.as_deref() == Some(name))
    {
        return Some(claim);
    }
    let uid = pod.metadata.uid.as_deref()?;
    claims.iter().filter(in_namespace).find(|c| {
        let owned = c
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.kind == "Pod" && o.uid == uid);
        let annotated = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
            .is_some_and(|e| e == entry);
        owned && annotated
    })
}

/// The claim a template would give `entry` of `pod` (not stored anywhere: a stand-in for
/// tentative allocation, with a UID no stored claim has).
fn claim_from_template(pod: &Pod, entry: &str, template: &ResourceClaimTemplate) -> ResourceClaim {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{pod_name}-{entry}")),
            namespace: pod.metadata.namespace.clone(),
            uid: Some(format!("assumed:{pod_uid}:{entry}")),
            ..ObjectMeta::default()
        },
        spec: template.spec.as_ref().and_then(|spec| spec.spec.clone()),
        status: None,
    }
}

/// The pod's claims: existing ones, and template claims not made yet as their template's
/// spec. A claim or template that does not exist is waited for.
fn pod_claims<'a>(
    pod: &Pod,
    claims: &'a [ResourceClaim],
    templates: &[ResourceClaimTemplate],
) -> Result<Vec<PodClaim<'a>>, PlacementError> {
    let namespace = pod.metadata.namespace.as_deref();
    let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let mut out = Vec::new();
    for (index, entry) in entries.into_iter().flatten().enumerate() {
        match (&entry.resource_claim_name, &entry.resource_claim_template_name) {
            (Some(name), None) => {
                let claim = claims
                    .iter()
                    .find(|c| {
                        c.metadata.namespace.as_deref() == namespace
                            && c.metadata.name.as_deref() == Some(name.as_str())
                    })
                    .ok_or_else(|| {
                        PlacementError::Waiting(format!(
                            "ResourceClaim {}/{name} does not exist",
                            namespace.unwrap_or_default()
                        ))
                    })?;
                out.push(PodClaim::Existing(claim));
            }
            (None, Some(template_name)) => {
                if let Some(claim) = generated_claim(pod, &entry.name, claims) {
                    out.push(PodClaim::Existing(claim));
                    continue;
                }
                let template = templates
                    .iter()
                    .find(|t| {
                        t.metadata.namespace.as_deref() == namespace
                            && t.metadata.name.as_deref() == Some(template_name.as_str())
                    })
                    .ok_or_else(|| {
                        PlacementError::Waiting(format!(
                            "ResourceClaimTemplate {}/{template_name} does not exist",
                            namespace.unwrap_or_default()
                        ))
                    })?;
                out.push(PodClaim::FromTemplate(
                    Box::new(claim_from_template(pod, &entry.name, template)),
                    template_name.clone(),
                ));
            }
            _ => {
                return Err(PlacementError::InvalidPod {
                    field: format!("spec.resourceClaims[{index}]"),
                    message:
                        "exactly one of resourceClaimName and resourceClaimTemplateName must be set"
                            .to_owned(),
                });
            }
        }
    }
    Ok(out)
}

fn allocation_of(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref().and_then(|s| s.allocation.as_ref())
}

fn with_allocation(mut claim: ResourceClaim, allocation: AllocationResult) -> ResourceClaim {
    claim.status.get_or_insert_with(ResourceClaimStatus::default).allocation = Some(allocation);
    claim
}

/// Whether `node` satisfies `selector`: terms are ORed, the requirements of a term ANDed;
/// `matchFields` knows `metadata.name` (the only field Kubernetes allows there), an empty term
/// matches nothing.
#[must_use]
pub fn node_selector_matches(selector: &NodeSelector, node: &NodeCandidate) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.iter().flatten();
        let fields = term.match_fields.iter().flatten();
        let mut any = false;
        let labels_ok = expressions.into_iter().all(|r| {
            any = true;
            requirement_matches(r, node.labels.get(&r.key).map(String::as_str))
        });
        let fields_ok = fields.into_iter().all(|r| {
            any = true;
            r.key == "metadata.name" && requirement_matches(r, Some(&node.name))
        });
        any && labels_ok && fields_ok
    })
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) =
                (value.and_then(number), values.first().and_then(|b| number(b)))
            else {
                return false;
            };
            if requirement.operator == "Gt" { have > bound } else { have < bound }
        }
        _ => false,
    }
}

/// Allocates `pod`'s claims on `node` tentatively; `Err((reason, detail))` when one does not
/// fit.
fn fit(
    input: &SchedulingInput<'_>,
    usage_now: &Usage,
    pod_claims: &[PodClaim<'_>],
    node: &NodeCandidate,
    new_share_id: &mut dyn FnMut() -> String,
) -> Result<Vec<ResourceClaim>, (&'static str, String)> {
    // What the claims and earlier tentative allocations hold, plus this pod's own claims as
    // they are allocated here (a pod's two claims must not get the same exclusive device).
    let mut usage = usage_now.clone();
    let mut assumed = Vec::new();
    for claim in pod_claims {
        let claim = match claim {
            PodClaim::Existing(claim) => {
                if let Some(allocation) = allocation_of(claim) {
                    let usable = allocation
                        .node_selector
                        .as_ref()
                        .is_none_or(|selector| node_selector_matches(selector, node));
                    if !usable {
                        return Err((
                            NOT_AVAILABLE_ON_NODE,
                            format!(
                                "claim {} is allocated for another node",
                                claim.metadata.name.as_deref().unwrap_or_default()
                            ),
                        ));
                    }
                    continue;
                }
                (*claim).clone()
            }
            PodClaim::FromTemplate(claim, _) => (**claim).clone(),
        };
        let allocation_input = AllocationInput {
            node: &node.name,
            slices: input.slices,
            classes: input.classes,
            claims: input.claims,
        };
        let allocation = allocate_with_usage(
            &allocation_input,
            &claim,
            usage.clone(),
            new_share_id,
        )
        .map_err(|e| {
            (
                CANNOT_ALLOCATE,
                format!("claim {}: {e}", claim.metadata.name.as_deref().unwrap_or_default()),
            )
        })?;
        let allocated = with_allocation(claim, allocation);
        usage.add_claim(&allocated);
        assumed.push(allocated);
    }
    Ok(assumed)
}

/// The first request of a claim still to be allocated that names a DeviceClass which does
/// not exist (kube-scheduler's PreFilter check, made before any node is tried).
fn missing_class(
    input: &SchedulingInput<'_>,
    pod_claims: &[PodClaim<'_>],
) -> Option<PlacementError> {
    let exists =
        |class: &str| input.classes.iter().any(|c| c.metadata.name.as_deref() == Some(class));
    for pod_claim in pod_claims {
        let (claim, source) = match pod_claim {
            PodClaim::Existing(claim) if allocation_of(claim).is_none() => (
                *claim,
                format!("ResourceClaim {}", claim.metadata.name.as_deref().unwrap_or_default()),
            ),
            PodClaim::Existing(_) => continue,
            PodClaim::FromTemplate(claim, template) => {
                (&**claim, format!("ResourceClaimTemplate {template}"))
            }
        };
        let requests = claim.spec.as_ref().and_then(|s| s.devices.as_ref()?.requests.as_ref());
        for request in requests.into_iter().flatten() {
            let mut named: Vec<(String, &str)> = Vec::new();
            if let Some(exactly) = &request.exactly {
                named.push((request.name.clone(), &exactly.device_class_name));
            }
            for sub in request.first_available.iter().flatten() {
                named.push((format!("{}/{}", request.name, sub.name), &sub.device_class_name));
            }
            if let Some((request, class)) = named.into_iter().find(|(_, class)| !exists(class)) {
                return Some(PlacementError::MissingClass {
                    nodes: input.nodes.len(),
                    origin: format!(
                        "{} in namespace {}",
                        source,
                        claim.metadata.namespace.as_deref().unwrap_or_default()
                    ),
                    request,
                    class: class.to_owned(),
                });
            }
        }
    }
    None
}

/// Chooses the node for `pod`. `assumed` are tentative allocations made earlier in the same
/// pass (they hold their devices like allocated claims); `new_share_id` mints share IDs of
/// the tentative allocations (never written anywhere).
pub fn place(
    input: &SchedulingInput<'_>,
    pod: &Pod,
    assumed: &[ResourceClaim],
    new_share_id: &mut dyn FnMut() -> String,
) -> Result<Placement, PlacementError> {
    let mut usage = Usage::from_claims(input.claims, None);
    for claim in assumed {
        usage.add_claim(claim);
    }
    place_with_usage(input, pod, &usage, new_share_id)
}

/// [`place`] against `usage`: what the claims of `input` and the tentative allocations made
/// earlier in the pass hold. A pass placing many pods keeps one and adds each placement's
/// tentative allocations, instead of copying every claim for each pod and node (a pass over
/// N unbound pods copied N × (claims + assumed) claim objects).
pub fn place_with_usage(
    input: &SchedulingInput<'_>,
    pod: &Pod,
    usage: &Usage,
    new_share_id: &mut dyn FnMut() -> String,
) -> Result<Placement, PlacementError> {
    let pod_claims = pod_claims(pod, input.claims, input.templates)?;
    if let Some(error) = missing_class(input, &pod_claims) {
        return Err(error);
    }
    let loads = loads(input.nodes, input.pods);
    let mut order: Vec<(usize, usize, &NodeCandidate)> = input
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| (loads.get(node.name.as_str()).copied().unwrap_or(0), index, node))
        .collect();
    order.sort_by_key(|&(load, index, _)| (load, index));
    let mut reasons = Vec::new();
    for (_, _, node) in order {
        match fit(input, usage, &pod_claims, node, new_share_id) {
            Ok(assumed) => return Ok(Placement { node: node.name.clone(), assumed }),
            Err((reason, detail)) => {
                reasons.push(NodeRejection { node: node.name.clone(), reason, detail });
            }
        }
    }
    // Report in the order the nodes were given, not the load order.
    reasons.sort_by_key(|r| input.nodes.iter().position(|n| n.name == r.node));
    Err(PlacementError::Unschedulable { reasons })
}

/// Tentative allocations of the template claims that bound pods (on one of `input.nodes`,
/// not finished) have not created yet. A claim that fits nowhere any more is left out: the
/// pod will wait for it on its node.
pub fn assumed_claims(
    input: &SchedulingInput<'_>,
    new_share_id: &mut dyn FnMut() -> String,
) -> Vec<ResourceClaim> {
    let mut assumed: Vec<ResourceClaim> = Vec::new();
    let mut usage = Usage::from_claims(input.claims, None);
    for pod in
        input.pods.iter().filter(|p| !is_terminal(p) && p.metadata.deletion_timestamp.is_none())
    {
        let Some(node) = node_of(pod).and_then(|n| input.nodes.iter().find(|c| c.name == n)) else {
            continue;
        };
        let Ok(claims) = pod_claims(pod, input.claims, input.templates) else { continue };
        for claim in claims {
            let PodClaim::FromTemplate(claim, _) = claim else { continue };
            let allocation_input = AllocationInput {
                node: &node.name,
                slices: input.slices,
                classes: input.classes,
                claims: input.claims,
            };
            match allocate_with_usage(&allocation_input, &claim, usage.clone(), new_share_id) {
                Ok(allocation) => {
                    let allocated = with_allocation(*claim, allocation);
                    usage.add_claim(&allocated);
                    assumed.push(allocated);
                }
                Err(error) => tracing::debug!(
                    pod = %pod_key(pod),
                    %error,
                    "a bound pod's template claim no longer fits its node"
                ),
            }
        }
    }
    assumed
}

/// The node `claim` is to be allocated for: that of the first bound, unfinished pod in its
/// namespace using it (by `spec.resourceClaims[].resourceClaimName`, by
/// `status.resourceClaimStatuses` or `status.extendedResourceClaimStatus`, or as the claim's
/// controlling owner). `None` while no such pod is bound.
#[must_use]
pub fn consumer_node<'a>(claim: &ResourceClaim, pods: &'a [Pod]) -> Option<&'a str> {
    let name = claim.metadata.name.as_deref()?;
    let namespace = claim.metadata.namespace.as_deref();
    let owner = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Pod")
        .map(|o| o.uid.as_str());
    pods.iter()
        .filter(|p| p.metadata.namespace.as_deref() == namespace && !is_terminal(p))
        .filter(|pod| {
            let named = pod
                .spec
                .as_ref()
                .and_then(|s| s.resource_claims.as_ref())
                .into_iter()
                .flatten()
                .any(|e| e.resource_claim_name.as_deref() == Some(name));
            let status = pod.status.as_ref();
            let recorded = status
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .into_iter()
                .flatten()
                .any(|s| s.resource_claim_name.as_deref() == Some(name));
            let extended = status
                .and_then(|s| s.extended_resource_claim_status.as_ref())
                .is_some_and(|s| s.resource_claim_name == name);
            let owns = owner.is_some() && pod.metadata.uid.as_deref() == owner;
            named || recorded || extended || owns
        })
        .find_map(node_of)
}
