//! Which CDI devices the dev kubelet passes with each container it creates (pure, no I/O),
//! by kubelet's rule: the CDI ids `NodePrepareResources` returned for the devices of every
//! claim the container lists in `resources.claims` (only the named request's devices when it
//! names one), and for the implicit extended-resource claim the devices of the requests
//! mapped to the container (`status.extendedResourceClaimStatus.requestMappings`). The
//! runtime resolves the ids at `CreateContainer` (e.g. the device metadata file, KEP-5304).

use k8s_openapi::api::core::v1::{Container, ContainerExtendedResourceRequest};

use super::dra_client::PreparedDevice;

/// How a pod's containers refer to one of its claims.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimUse {
    /// Through its `spec.resourceClaims` entry name.
    Entry(String),
    /// The implicit extended-resource claim (KEP-5004): through these request mappings.
    Extended(Vec<ContainerExtendedResourceRequest>),
}

/// One prepared claim of a pod: how containers name it and what the driver prepared.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedClaim {
    /// How containers refer to it.
    pub usage: ClaimUse,
    /// The devices `NodePrepareResources` answered for it.
    pub devices: Vec<PreparedDevice>,
}

/// The CDI ids of `request`'s devices (of every device when `None`), in answer order.
fn ids_of<'a>(
    devices: &'a [PreparedDevice],
    request: Option<&'a str>,
) -> impl Iterator<Item = &'a String> + 'a {
    devices
        .iter()
        .filter(move |d| request.is_none_or(|r| d.requests.iter().any(|name| name == r)))
        .flat_map(|d| d.cdi_device_ids.iter())
}

/// The CDI device ids to pass with `container`, each once, in the order kubelet collects
/// them (the container's claim references, then its extended resources).
#[must_use]
pub fn container_cdi_devices(container: &Container, claims: &[PreparedClaim]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut add = |id: &String| {
        if !ids.contains(id) {
            ids.push(id.clone());
        }
    };
    let references = container.resources.as_ref().and_then(|r| r.claims.as_ref());
    for reference in references.into_iter().flatten() {
        let request = reference.request.as_deref().filter(|r| !r.is_empty());
        for claim in claims {
            if claim.usage == ClaimUse::Entry(reference.name.clone()) {
                ids_of(&claim.devices, request).for_each(&mut add);
            }
        }
    }
    for claim in claims {
        let ClaimUse::Extended(mappings) = &claim.usage else { continue };
        for mapping in mappings.iter().filter(|m| m.container_name == container.name) {
            ids_of(&claim.devices, Some(&mapping.request_name)).for_each(&mut add);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use k8s_openapi::api::core::v1::{ResourceClaim as ClaimReference, ResourceRequirements};

    use super::*;

    fn device(request: &str, ids: &[&str]) -> PreparedDevice {
        PreparedDevice {
            requests: vec![request.to_owned()],
            pool: "node-a".into(),
            device: format!("dev-{request}"),
            share_id: None,
            cdi_device_ids: ids.iter().map(|&id| id.to_owned()).collect(),
        }
    }

    fn container(name: &str, claims: &[(&str, Option<&str>)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                claims: Some(
                    claims
                        .iter()
                        .map(|(claim, request)| ClaimReference {
                            name: (*claim).to_owned(),
                            request: request.map(str::to_owned),
                        })
                        .collect(),
                ),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn claims() -> Vec<PreparedClaim> {
        vec![
            PreparedClaim {
                usage: ClaimUse::Entry("net".into()),
                devices: vec![
                    device("fast", &["netclaim.dev/metadata=u1_fast"]),
                    device("slow", &["netclaim.dev/metadata=u1_slow"]),
                ],
            },
            PreparedClaim {
                usage: ClaimUse::Entry("other".into()),
                devices: vec![device("x", &[])],
            },
            PreparedClaim {
                usage: ClaimUse::Extended(vec![ContainerExtendedResourceRequest {
                    container_name: "app".into(),
                    request_name: "container-0-request-0".into(),
                    resource_name: "netclaim.dev/macvlan".into(),
                }]),
                devices: vec![device(
                    "container-0-request-0",
                    &["netclaim.dev/metadata=u2_container-0-request-0"],
                )],
            },
        ]
    }

    #[test]
    fn a_container_gets_the_ids_of_the_claims_it_lists() {
        let whole = container("app", &[("net", None)]);
        assert_eq!(
            container_cdi_devices(&whole, &claims()),
            [
                "netclaim.dev/metadata=u1_fast",
                "netclaim.dev/metadata=u1_slow",
                "netclaim.dev/metadata=u2_container-0-request-0"
            ]
        );
        let one_request = container("sidecar", &[("net", Some("slow")), ("net", Some("slow"))]);
        assert_eq!(
            container_cdi_devices(&one_request, &claims()),
            ["netclaim.dev/metadata=u1_slow"]
        );
    }

    #[test]
    fn a_container_listing_no_claim_gets_none() {
        let bare = Container { name: "sidecar".into(), ..Container::default() };
        assert!(container_cdi_devices(&bare, &claims()).is_empty());
        let other = container("sidecar", &[("other", None)]);
        assert!(container_cdi_devices(&other, &claims()).is_empty());
    }
}
