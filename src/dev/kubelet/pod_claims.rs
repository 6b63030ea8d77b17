//! Which ResourceClaims a Pod uses, and the claim the resourceclaim controller makes from a
//! `ResourceClaimTemplate` for one `spec.resourceClaims` entry (pure, no I/O).
//!
//! Follows `kube-controller-manager`'s resourceclaim controller: `generateName`
//! `<pod>-<entry>-` (each part cut to 28 characters when the whole would be too long), the
//! template's labels and annotations, annotation `resource.kubernetes.io/pod-claim-name` =
//! the entry name, and an owner reference to the Pod with `controller: true` (so garbage
//! collection deletes the claim with its Pod and nothing else claims it).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerExtendedResourceRequest, Pod, PodExtendedResourceClaimStatus,
    PodResourceClaimStatus,
};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimTemplate,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Annotation on a generated claim naming the Pod's `spec.resourceClaims` entry.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// Label on a claim generated here: the Pod's UID (a dev-only addition to upstream's
/// metadata). Upstream's controller finds the claims it made in an informer cache; the dev
/// kubelet has none and asks the API, by this label: listing every claim of the namespace
/// for each new pod made a burst of N pods cost N² claims decoded.
pub const GENERATED_FOR_POD_LABEL: &str = "netclaim.dev/generated-for-pod";
/// Annotation (`"true"`) on the implicit claim of a pod's extended resources (KEP-5004).
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";
/// Every DeviceClass can be asked for as `deviceclass.resource.kubernetes.io/<class>`.
pub const IMPLICIT_EXTENDED_RESOURCE_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Longest `generateName` before the API server appends 5 random characters (a DNS subdomain
/// label stays within 63).
const MAX_GENERATE_NAME: usize = 57;
/// Each part of a too-long `generateName` is cut to this length, as upstream does.
const GENERATE_PART: usize = 28;

/// How a Pod names the claim of one `spec.resourceClaims` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimSource {
    /// `resourceClaimName`: an existing claim.
    Existing(String),
    /// `resourceClaimTemplateName`: a claim generated from this template.
    Template(String),
}

/// One `spec.resourceClaims` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaimEntry {
    /// The entry name (what containers refer to).
    pub name: String,
    /// Where its claim comes from.
    pub source: ClaimSource,
}

/// A Pod entry that names neither or both sources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pod {pod}: spec.resourceClaims[{entry}] must set exactly one of resourceClaimName and resourceClaimTemplateName"
)]
pub struct EntryError {
    /// `namespace/name` of the Pod.
    pub pod: String,
    /// The entry name.
    pub entry: String,
}

/// `namespace/name` of an object.
pub(crate) fn object_key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The Pod's `spec.resourceClaims` entries, in order.
pub fn claim_entries(pod: &Pod) -> Result<Vec<PodClaimEntry>, EntryError> {
    let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    entries
        .into_iter()
        .flatten()
        .map(|entry| {
            let source = match (&entry.resource_claim_name, &entry.resource_claim_template_name) {
                (Some(name), None) => ClaimSource::Existing(name.clone()),
                (None, Some(template)) => ClaimSource::Template(template.clone()),
                _ => {
                    return Err(EntryError {
                        pod: object_key(&pod.metadata),
                        entry: entry.name.clone(),
                    });
                }
            };
            Ok(PodClaimEntry { name: entry.name.clone(), source })
        })
        .collect()
}

/// The claim name already recorded in the Pod's `status.resourceClaimStatuses` for `entry`.
#[must_use]
pub fn recorded_claim_name(pod: &Pod, entry: &str) -> Option<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .find(|s| s.name == entry)
        .and_then(|s| s.resource_claim_name.clone())
}

/// `generateName` of the claim for `entry` of Pod `pod_name`.
#[must_use]
pub fn generate_name(pod_name: &str, entry: &str) -> String {
    let whole = format!("{pod_name}-{entry}-");
    if whole.len() <= MAX_GENERATE_NAME {
        return whole;
    }
    let cut = |s: &str| s.chars().take(GENERATE_PART).collect::<String>();
    format!("{}-{}-", cut(pod_name), cut(entry))
}

/// The owner reference a generated claim carries: the Pod, as its controller.
#[must_use]
pub fn pod_owner_reference(pod: &Pod) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `claim` was generated for `entry` of `pod` (controller owner reference to the Pod's
/// UID and the entry annotation), so a retry after a lost response finds it instead of
/// creating a second claim.
#[must_use]
pub fn is_generated_for(claim: &ResourceClaim, pod: &Pod, entry: &str) -> bool {
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let owned = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "Pod" && r.uid == pod_uid);
    let annotated = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
        .is_some_and(|v| v == entry);
    owned && annotated
}

/// Whether the Pod owns `claim` as its controller (a generated claim, deleted with the Pod).
#[must_use]
pub fn is_owned_by(claim: &ResourceClaim, pod_uid: &str) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "Pod" && r.uid == pod_uid)
}

/// The claim the resourceclaim controller creates for `entry` of `pod` from `template`.
#[must_use]
pub fn claim_from_template(
    pod: &Pod,
    entry: &str,
    template: &ResourceClaimTemplate,
) -> ResourceClaim {
    let template_meta =
        template.spec.as_ref().and_then(|spec| spec.metadata.clone()).unwrap_or_default();
    let mut annotations: BTreeMap<String, String> = template_meta.annotations.unwrap_or_default();
    annotations.insert(POD_CLAIM_NAME_ANNOTATION.to_owned(), entry.to_owned());
    let mut labels: BTreeMap<String, String> = template_meta.labels.unwrap_or_default();
    labels.insert(GENERATED_FOR_POD_LABEL.to_owned(), pod.metadata.uid.clone().unwrap_or_default());
    ResourceClaim {
        metadata: ObjectMeta {
            generate_name: Some(generate_name(
                pod.metadata.name.as_deref().unwrap_or_default(),
                entry,
            )),
            namespace: pod.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![pod_owner_reference(pod)]),
            ..ObjectMeta::default()
        },
        spec: template.spec.as_ref().and_then(|spec| spec.spec.clone()),
        status: None,
    }
}

/// `status.resourceClaimStatuses` with `entry` → `claim_name` set (others kept, order kept).
#[must_use]
pub fn with_claim_status(
    current: Option<&[PodResourceClaimStatus]>,
    entry: &str,
    claim_name: &str,
) -> Vec<PodResourceClaimStatus> {
    let mut statuses: Vec<PodResourceClaimStatus> = current.unwrap_or_default().to_vec();
    match statuses.iter_mut().find(|s| s.name == entry) {
        Some(found) => found.resource_claim_name = Some(claim_name.to_owned()),
        None => statuses.push(PodResourceClaimStatus {
            name: entry.to_owned(),
            resource_claim_name: Some(claim_name.to_owned()),
        }),
    }
    statuses
}

/// The DeviceClass that backs extended resource `resource`: the one naming it in
/// `spec.extendedResourceName`, or `<class>` of `deviceclass.resource.kubernetes.io/<class>`.
#[must_use]
pub fn class_for_resource(resource: &str, classes: &[DeviceClass]) -> Option<String> {
    let named = classes.iter().find(|class| {
        class.spec.as_ref().and_then(|spec| spec.extended_resource_name.as_deref())
            == Some(resource)
    });
    named.and_then(|class| class.metadata.name.clone()).or_else(|| {
        let class = resource.strip_prefix(IMPLICIT_EXTENDED_RESOURCE_PREFIX)?;
        classes.iter().any(|c| c.metadata.name.as_deref() == Some(class)).then(|| class.to_owned())
    })
}

/// The requests of a pod's implicit extended-resource claim and which container each serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtendedResourceRequests {
    /// One request per (container, extended resource backed by a DeviceClass).
    pub requests: Vec<DeviceRequest>,
    /// `status.extendedResourceClaimStatus.requestMappings`.
    pub mappings: Vec<ContainerExtendedResourceRequest>,
}

/// A container's extended resource whose quantity is not a whole number of devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pod {pod}: container {container}: resources {resource}: {quantity:?} is not a whole number of devices"
)]
pub struct QuantityError {
    /// `namespace/name` of the Pod.
    pub pod: String,
    /// The container.
    pub container: String,
    /// The resource name.
    pub resource: String,
    /// The quantity given.
    pub quantity: String,
}

/// The scheduler's requests for the pod's extended resources that a DeviceClass backs
/// (KEP-5004): init containers then containers, indexed together; per container its resource
/// names sorted; request `container-<container index>-request-<resource index>`, exactly
/// `count` devices of the class. A resource only in `limits` counts (the API server copies
/// extended-resource limits into requests).
pub fn extended_resource_requests(
    pod: &Pod,
    classes: &[DeviceClass],
) -> Result<ExtendedResourceRequests, QuantityError> {
    let mut out = ExtendedResourceRequests::default();
    let spec = pod.spec.as_ref();
    let containers: Vec<&Container> = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .chain(spec.map(|s| s.containers.iter()).into_iter().flatten())
        .collect();
    for (container_index, container) in containers.iter().enumerate() {
        let resources = container.resources.as_ref();
        let mut quantities: BTreeMap<&str, &str> = BTreeMap::new();
        for list in
            [resources.and_then(|r| r.limits.as_ref()), resources.and_then(|r| r.requests.as_ref())]
        {
            for (name, quantity) in list.into_iter().flatten() {
                quantities.insert(name.as_str(), quantity.0.as_str());
            }
        }
        for (resource_index, (resource, quantity)) in quantities.iter().enumerate() {
            let Some(class) = class_for_resource(resource, classes) else { continue };
            let count: i64 = quantity.parse().map_err(|_| QuantityError {
                pod: object_key(&pod.metadata),
                container: container.name.clone(),
                resource: (*resource).to_owned(),
                quantity: (*quantity).to_owned(),
            })?;
            if count <= 0 {
                continue;
            }
            let name = format!("container-{container_index}-request-{resource_index}");
            out.requests.push(DeviceRequest {
                name: name.clone(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: class,
                    allocation_mode: Some("ExactCount".to_owned()),
                    count: Some(count),
                    ..ExactDeviceRequest::default()
                }),
                ..DeviceRequest::default()
            });
            out.mappings.push(ContainerExtendedResourceRequest {
                container_name: container.name.clone(),
                resource_name: (*resource).to_owned(),
                request_name: name,
            });
        }
    }
    Ok(out)
}

/// The implicit claim the scheduler creates for a pod's extended resources: `generateName`
/// `<pod>-extended-resources-`, owned by the Pod as its controller, annotated, with the
/// requests and no config of its own (the DeviceClass's config applies).
#[must_use]
pub fn implicit_extended_resource_claim(
    pod: &Pod,
    requests: &ExtendedResourceRequests,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-extended-resources-",
                pod.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: pod.metadata.namespace.clone(),
            annotations: Some(
                [(EXTENDED_RESOURCE_CLAIM_ANNOTATION.to_owned(), "true".to_owned())].into(),
            ),
            owner_references: Some(vec![pod_owner_reference(pod)]),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests.requests.clone()),
                ..DeviceClaim::default()
            }),
        }),
        status: None,
    }
}

/// Whether `claim` is the implicit extended-resource claim of `pod`.
#[must_use]
pub fn is_extended_resource_claim_of(claim: &ResourceClaim, pod: &Pod) -> bool {
    let annotated = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION))
        .is_some_and(|v| v == "true");
    annotated && is_owned_by(claim, pod.metadata.uid.as_deref().unwrap_or_default())
}

/// `status.extendedResourceClaimStatus` for the implicit claim `claim_name`.
#[must_use]
pub fn extended_resource_claim_status(
    claim_name: &str,
    requests: &ExtendedResourceRequests,
) -> PodExtendedResourceClaimStatus {
    PodExtendedResourceClaimStatus {
        resource_claim_name: claim_name.to_owned(),
        request_mappings: requests.mappings.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "team", "uid": "pod-uid-1"},
            "spec": {
                "containers": [{"name": "app", "image": "pause"}],
                "resourceClaims": [
                    {"name": "net", "resourceClaimTemplateName": "macvlan"},
                    {"name": "shared", "resourceClaimName": "fixed-claim"},
                ],
            },
        }))
        .expect("a valid Pod")
    }

    fn template() -> ResourceClaimTemplate {
        serde_json::from_value(json!({
            "metadata": {"name": "macvlan", "namespace": "team"},
            "spec": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"note": "x"}},
                "spec": {"devices": {"requests": [
                    {"name": "nic", "exactly": {"deviceClassName": "netclaim"}}
                ]}},
            },
        }))
        .expect("a valid template")
    }

    #[test]
    fn entries_name_their_source_in_order() {
        let entries = claim_entries(&pod()).unwrap();
        assert_eq!(
            entries,
            vec![
                PodClaimEntry {
                    name: "net".into(),
                    source: ClaimSource::Template("macvlan".into())
                },
                PodClaimEntry {
                    name: "shared".into(),
                    source: ClaimSource::Existing("fixed-claim".into())
                },
            ]
        );
    }

    #[test]
    fn an_entry_with_both_sources_is_an_error_naming_it() {
        let mut pod = pod();
        let claims = pod.spec.as_mut().unwrap().resource_claims.as_mut().unwrap();
        claims[1].resource_claim_template_name = Some("t".into());
        let err = claim_entries(&pod).unwrap_err();
        assert_eq!(err.entry, "shared");
        assert!(err.to_string().contains("team/web-1"), "{err}");
    }

    #[test]
    fn generated_claim_is_named_owned_and_annotated_like_upstream() {
        let pod = pod();
        let claim = claim_from_template(&pod, "net", &template());
        assert_eq!(claim.metadata.generate_name.as_deref(), Some("web-1-net-"));
        assert_eq!(claim.metadata.name, None);
        assert_eq!(claim.metadata.namespace.as_deref(), Some("team"));
        let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "web-1", "pod-uid-1")
        );
        assert_eq!(owner.controller, Some(true));
        let annotations = claim.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[POD_CLAIM_NAME_ANNOTATION], "net");
        assert_eq!(annotations["note"], "x");
        assert_eq!(claim.metadata.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(claim.metadata.labels.as_ref().unwrap()[GENERATED_FOR_POD_LABEL], "pod-uid-1");
        assert_eq!(claim.spec, template().spec.unwrap().spec);
        assert!(is_generated_for(&claim, &pod, "net"));
        assert!(!is_generated_for(&claim, &pod, "shared"));
        assert!(is_owned_by(&claim, "pod-uid-1"));
        assert!(!is_owned_by(&claim, "other"));
    }

    #[test]
    fn long_names_are_cut_so_the_generated_name_fits_a_label() {
        let pod_name = "p".repeat(60);
        let name = generate_name(&pod_name, &"e".repeat(40));
        assert_eq!(name, format!("{}-{}-", "p".repeat(28), "e".repeat(28)));
        assert!(name.len() + 5 <= 63);
    }

    fn class(name: &str, extended: Option<&str>) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"extendedResourceName": extended},
        }))
        .expect("a valid DeviceClass")
    }

    #[test]
    fn extended_resources_become_requests_named_by_container_and_sorted_resource_index() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "team", "uid": "pod-uid-1"},
            "spec": {
                "initContainers": [{"name": "init", "image": "pause"}],
                "containers": [
                    {"name": "app", "image": "pause", "resources": {"limits": {
                        "netclaim.dev/macvlan": "2", "cpu": "1",
                        "deviceclass.resource.kubernetes.io/vf": "1",
                        "example.com/dongle": "1",
                    }}},
                ],
            },
        }))
        .unwrap();
        let classes = [class("mv", Some("netclaim.dev/macvlan")), class("vf", None)];
        let found = extended_resource_requests(&pod, &classes).unwrap();
        // Sorted: cpu, deviceclass.../vf, example.com/dongle, netclaim.dev/macvlan.
        let names: Vec<(&str, &str, Option<i64>)> = found
            .requests
            .iter()
            .map(|r| {
                let exactly = r.exactly.as_ref().unwrap();
                (r.name.as_str(), exactly.device_class_name.as_str(), exactly.count)
            })
            .collect();
        assert_eq!(
            names,
            [("container-1-request-1", "vf", Some(1)), ("container-1-request-3", "mv", Some(2))]
        );
        assert_eq!(found.mappings[1].resource_name, "netclaim.dev/macvlan");
        assert_eq!(found.mappings[1].container_name, "app");
        let claim = implicit_extended_resource_claim(&pod, &found);
        assert_eq!(claim.metadata.generate_name.as_deref(), Some("web-1-extended-resources-"));
        assert!(is_extended_resource_claim_of(&claim, &pod));
        let devices = claim.spec.as_ref().unwrap().devices.as_ref().unwrap();
        assert!(devices.config.is_none(), "class config only");
        let status = extended_resource_claim_status("web-1-extended-resources-abcde", &found);
        assert_eq!(status.request_mappings.len(), 2);
    }

    #[test]
    fn a_fractional_device_count_is_an_error_naming_the_container() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {"containers": [{"name": "app", "image": "pause",
                "resources": {"limits": {"netclaim.dev/macvlan": "500m"}}}]},
        }))
        .unwrap();
        let err = extended_resource_requests(&pod, &[class("mv", Some("netclaim.dev/macvlan"))])
            .unwrap_err();
        assert!(
            err.to_string().contains("container app") && err.to_string().contains("500m"),
            "{err}"
        );
    }

    #[test]
    fn claim_statuses_are_recorded_once_per_entry() {
        let first = with_claim_status(None, "net", "web-1-net-abcde");
        let again = with_claim_status(Some(&first), "net", "web-1-net-abcde");
        assert_eq!(first, again);
        let both = with_claim_status(Some(&again), "shared", "fixed-claim");
        assert_eq!(both.len(), 2);
        let mut pod = pod();
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            resource_claim_statuses: Some(both),
            ..Default::default()
        });
        assert_eq!(recorded_claim_name(&pod, "net").as_deref(), Some("web-1-net-abcde"));
        assert_eq!(recorded_claim_name(&pod, "other"), None);
    }
}
