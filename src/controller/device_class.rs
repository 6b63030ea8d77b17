//! The DeviceClass of a `PodNetwork` (pure): claims name only the class; its selector picks
//! the devices nodes tag with the network, and its config carries `podNetwork: <name>` so
//! the node resolves the network's settings at prepare (DESIGN §4).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassConfiguration, DeviceClassSpec, DeviceSelector,
    OpaqueDeviceConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;

use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::network_config;
use crate::model::pod_network::{API_VERSION, LABEL_MANAGED_FOR, PodNetwork, device_class_name};

/// The CEL selector of the network's devices. The attribute test is guarded with `has()`:
/// a selector that fails on a device (an untagged NIC of ours has no `podNetwork`) aborts
/// the claim's allocation instead of skipping the device. The names are DNS subdomains
/// (API-validated), so quoting them needs no escapes.
#[must_use]
pub fn selector_expression(driver: &str, pod_network: &str) -> String {
    let attribute = format!("device.attributes[\"{ATTRIBUTE_DOMAIN}\"].{}", attr::POD_NETWORK);
    format!("device.driver == \"{driver}\" && has({attribute}) && {attribute} == \"{pod_network}\"")
}

/// The DeviceClass the controller keeps for `network`, as it applies it (server-side apply
/// with the driver name as field manager): labelled with the network, owned by it.
#[must_use]
pub fn device_class(network: &PodNetwork, driver: &str) -> DeviceClass {
    let name = network.metadata.name.clone().unwrap_or_default();
    let owner = network.metadata.uid.clone().map(|uid| OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "PodNetwork".to_owned(),
        name: name.clone(),
        uid,
        controller: Some(true),
        block_owner_deletion: None,
    });
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(device_class_name(&name)),
            labels: Some(BTreeMap::from([(LABEL_MANAGED_FOR.to_owned(), name.clone())])),
            owner_references: owner.map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression: selector_expression(driver, &name) }),
            }]),
            config: Some(vec![DeviceClassConfiguration {
                opaque: Some(OpaqueDeviceConfiguration {
                    driver: driver.to_owned(),
                    parameters: RawExtension(json!({
                        "apiVersion": network_config::API_VERSION,
                        "kind": network_config::KIND,
                        "podNetwork": name,
                    })),
                }),
            }]),
            extended_resource_name: None,
        }),
    }
}

/// Whether `existing` already says what `desired` says (labels and owner we set, selectors,
/// config): then no write is needed.
#[must_use]
pub fn is_current(existing: &DeviceClass, desired: &DeviceClass) -> bool {
    let labels_match = desired.metadata.labels.iter().flatten().all(|(key, value)| {
        existing.metadata.labels.as_ref().and_then(|labels| labels.get(key)) == Some(value)
    });
    let owner_matches = desired.metadata.owner_references.iter().flatten().all(|owner| {
        existing.metadata.owner_references.iter().flatten().any(|o| o.uid == owner.uid)
    });
    labels_match
        && owner_matches
        && spec_of(existing).selectors == spec_of(desired).selectors
        && spec_of(existing).config == spec_of(desired).config
}

/// A class's spec; `spec` is optional in the 1.37 API types (a class without one selects
/// every device), so a missing one reads as the empty spec.
fn spec_of(class: &DeviceClass) -> std::borrow::Cow<'_, DeviceClassSpec> {
    class.spec.as_ref().map_or_else(
        || std::borrow::Cow::Owned(DeviceClassSpec::default()),
        std::borrow::Cow::Borrowed,
    )
}

/// Whether `class` is the one the controller manages for `pod_network` (its label says so):
/// only such a class is deleted with the network.
#[must_use]
pub fn is_managed_for(class: &DeviceClass, pod_network: &str) -> bool {
    class
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_MANAGED_FOR))
        .map(String::as_str)
        == Some(pod_network)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> PodNetwork {
        let mut network: PodNetwork = serde_json::from_value(json!({
            "metadata": {"name": "medianet", "uid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
            "spec": {"parents": ["eth1"]}
        }))
        .expect("decodes");
        network.metadata.generation = Some(1);
        network
    }

    #[test]
    fn the_class_selects_tagged_devices_and_carries_the_network() {
        let class = device_class(&network(), "netclaim.dev");
        assert_eq!(class.metadata.name.as_deref(), Some("medianet.podnetwork.netclaim.dev"));
        let value = serde_json::to_value(&class).expect("serialises");
        assert_eq!(value["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(value["kind"], "DeviceClass");
        assert_eq!(
            value["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == \"netclaim.dev\" && has(device.attributes[\"netclaim.dev\"].podNetwork) \
             && device.attributes[\"netclaim.dev\"].podNetwork == \"medianet\""
        );
        assert_eq!(
            value["spec"]["config"],
            json!([{"opaque": {"driver": "netclaim.dev", "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "podNetwork": "medianet"
            }}}])
        );
        assert_eq!(value["metadata"]["labels"]["netclaim.dev/pod-network"], "medianet");
        let owner = &value["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["kind"].as_str(), owner["name"].as_str(), owner["controller"].as_bool()),
            (Some("PodNetwork"), Some("medianet"), Some(true))
        );
    }

    #[test]
    fn another_driver_name_changes_the_driver_not_the_attribute_domain() {
        let expr = selector_expression("net.example.com", "blue");
        assert!(expr.starts_with("device.driver == \"net.example.com\""), "{expr}");
        assert!(
            expr.contains("device.attributes[\"netclaim.dev\"].podNetwork == \"blue\""),
            "{expr}"
        );
    }

    /// The class's selector, evaluated by the dev allocator's CEL environment over the
    /// device as a slice of `driver` publishes it (unqualified attributes under the default
    /// driver name, qualified under another; decision 0023).
    fn selects(driver: &str, pod_network: Option<&str>) -> bool {
        use crate::model::device::{AttributeValue, Device, DeviceKind, Sharing};
        let mut attributes = std::collections::BTreeMap::from([(
            format!("{ATTRIBUTE_DOMAIN}/{}", attr::IF_NAME),
            AttributeValue::String("eth1".into()),
        )]);
        if let Some(network) = pod_network {
            attributes.insert(
                format!("{ATTRIBUTE_DOMAIN}/{}", attr::POD_NETWORK),
                AttributeValue::String(network.into()),
            );
        }
        let device = Device {
            name: "medianet-eth1".into(),
            if_name: "eth1".into(),
            kind: DeviceKind::Physical,
            sharing: Sharing::Shared,
            shared_capacity: Some(8),
            bandwidth: None,
            slot_index: None,
            attributes,
        };
        let published = crate::inventory::slices::api_device(&device, driver);
        let class = device_class(&network(), driver);
        let expression = &class.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression;
        kube_inmemory::allocator::selector::Selector::compile(expression)
            .unwrap()
            .matches(driver, &published)
            .unwrap()
    }

    #[test]
    fn the_class_selects_the_networks_devices_under_any_driver_name() {
        for driver in ["netclaim.dev", "net.example.com"] {
            assert!(selects(driver, Some("medianet")), "{driver}");
            assert!(!selects(driver, Some("other")), "{driver}");
            assert!(!selects(driver, None), "{driver}: untagged, skipped without an error");
        }
    }

    #[test]
    fn currency_and_ownership_follow_labels_selectors_and_config() {
        let desired = device_class(&network(), "netclaim.dev");
        let mut existing = desired.clone();
        existing.metadata.resource_version = Some("7".into());
        assert!(is_current(&existing, &desired));
        assert!(is_managed_for(&existing, "medianet") && !is_managed_for(&existing, "other"));
        existing.spec.as_mut().unwrap().selectors = None;
        assert!(!is_current(&existing, &desired));
        let mut unlabelled = desired.clone();
        unlabelled.metadata.labels = None;
        assert!(!is_current(&unlabelled, &desired) && !is_managed_for(&unlabelled, "medianet"));
    }
}
