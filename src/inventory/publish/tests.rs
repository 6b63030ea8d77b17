//! Publisher behaviour against an in-memory API: generations, splitting, stale slices,
//! repairs and the capacity read-back.

use std::sync::Mutex;

use super::*;
use crate::model::device::{HardwareFacts, LinkKind, PciFacts, SriovRole};

/// An in-memory ResourceSlice store with call counters; can behave like an API server whose
/// DRAConsumableCapacity feature is off.
#[derive(Default)]
struct FakeApi {
    slices: Mutex<BTreeMap<String, ResourceSlice>>,
    applies: Mutex<usize>,
    deletes: Mutex<usize>,
    drop_capacity: bool,
}

impl SliceApi for &FakeApi {
    async fn list(&self) -> Result<Vec<ResourceSlice>, SliceApiError> {
        Ok(self.slices.lock().unwrap().values().cloned().collect())
    }

    async fn apply(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceApiError> {
        let mut stored = slice.clone();
        if self.drop_capacity {
            for device in stored.spec.devices.iter_mut().flatten() {
                device.allow_multiple_allocations = None;
                device.capacity = None;
            }
        }
        *self.applies.lock().unwrap() += 1;
        let name = slice.metadata.name.clone().unwrap();
        self.slices.lock().unwrap().insert(name, stored.clone());
        Ok(stored)
    }

    async fn delete(&self, name: &str) -> Result<(), SliceApiError> {
        *self.deletes.lock().unwrap() += 1;
        self.slices.lock().unwrap().remove(name);
        Ok(())
    }
}

impl FakeApi {
    fn generations(&self) -> BTreeSet<i64> {
        self.slices.lock().unwrap().values().map(|s| s.spec.pool.generation).collect()
    }

    fn device_count(&self) -> usize {
        self.slices.lock().unwrap().values().map(|s| s.spec.devices.as_ref().unwrap().len()).sum()
    }

    fn applies(&self) -> usize {
        *self.applies.lock().unwrap()
    }
}

fn pool() -> PoolIdentity {
    PoolIdentity { driver: "netclaim.dev".to_owned(), node: "node-a".to_owned(), generation: 0 }
}

fn nics(count: u32) -> Vec<HostInterface> {
    (0..count)
        .map(|i| {
            let mut interface = HostInterface::new(i + 10, &format!("ens{i}"), 1500);
            interface.hardware = HardwareFacts {
                has_device: true,
                pci: Some(PciFacts {
                    address: format!("0000:{:02x}:{:02x}.{}", i / 256, (i / 8) % 32, i % 8)
                        .parse()
                        .unwrap(),
                    vendor: None,
                    device: None,
                    numa_node: None,
                    pcie_root: None,
                    sriov: SriovRole::None,
                }),
                driver: Some("ixgbe".to_owned()),
                speed_mbps: None,
            };
            interface
        })
        .collect()
}

fn veth(name: &str) -> HostInterface {
    let mut interface = HostInterface::new(99, name, 1500);
    interface.kind = Some(LinkKind::Veth);
    interface
}

fn publisher<'a>(
    api: &'a FakeApi,
    shared: &[&str],
    requested: RequestedSharing,
) -> Publisher<&'a FakeApi> {
    let shared: Vec<String> = shared.iter().map(|s| (*s).to_owned()).collect();
    let selection = Selection::new(&[], &[], &shared, SharingMode::Capacity).unwrap();
    Publisher::new(api, pool(), selection, requested, None)
}

#[tokio::test]
async fn first_publication_continues_after_the_existing_generation() {
    let api = FakeApi::default();
    let mut old = build_slices(&PoolIdentity { generation: 41, ..pool() }, &[]);
    old[0].metadata.name = Some("node-a-netclaim-dev-7".to_owned());
    api.slices.lock().unwrap().insert("node-a-netclaim-dev-7".to_owned(), old.remove(0));

    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let report = publisher.sync(&nics(3), false).await.unwrap();
    assert_eq!(report.generation, 42);
    assert_eq!(report.applied, 1);
    assert_eq!(report.deleted, 1, "the leftover slice of the old generation is removed");
    assert_eq!(api.generations(), BTreeSet::from([42]));
    assert_eq!(api.device_count(), 3);
}

#[tokio::test]
async fn unchanged_inventory_writes_nothing_and_changes_bump_the_generation() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    publisher.sync(&nics(2), false).await.unwrap();
    let writes = api.applies();
    let report = publisher.sync(&nics(2), false).await.unwrap();
    assert_eq!((report.applied, report.generation), (0, 1));
    assert_eq!(api.applies(), writes);

    let mut changed = nics(2);
    changed[1].mtu = 9000;
    let report = publisher.sync(&changed, false).await.unwrap();
    assert_eq!((report.applied, report.generation), (1, 2));
    assert_eq!(api.generations(), BTreeSet::from([2]));
}

#[tokio::test]
async fn a_large_pool_is_split_and_shrinks_cleanly() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let report = publisher.sync(&nics(300), false).await.unwrap();
    assert_eq!(report.applied, 3);
    assert_eq!(api.device_count(), 300);
    for slice in api.slices.lock().unwrap().values() {
        assert_eq!(slice.spec.pool.resource_slice_count, 3);
    }
    let report = publisher.sync(&nics(100), false).await.unwrap();
    assert_eq!((report.applied, report.deleted), (1, 2));
    assert_eq!(api.device_count(), 100);
    assert_eq!(api.slices.lock().unwrap().len(), 1);
    assert_eq!(api.generations(), BTreeSet::from([2]));
}

#[tokio::test]
async fn a_deleted_or_edited_slice_is_repaired() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    publisher.sync(&nics(2), false).await.unwrap();
    let name = publisher.slice_names().into_iter().next().unwrap();
    let stored = api.slices.lock().unwrap().get(&name).unwrap().spec.clone();
    assert!(!publisher.needs_repair(&name, Some(&stored)), "our own write is not a change");

    let mut edited = stored.clone();
    edited.devices.as_mut().unwrap().pop();
    assert!(publisher.needs_repair(&name, Some(&edited)));
    api.slices.lock().unwrap().remove(&name);
    assert!(publisher.needs_repair(&name, None));

    let report = publisher.sync(&nics(2), true).await.unwrap();
    assert_eq!(report.applied, 1);
    assert_eq!(report.generation, 1, "a repair republishes the same generation");
    assert_eq!(api.device_count(), 2);
}

#[tokio::test]
async fn dropped_capacity_is_reported_once_and_auto_falls_back_to_slots() {
    let api = FakeApi { drop_capacity: true, ..FakeApi::default() };
    let mut publisher = publisher(&api, &["veth0"], RequestedSharing::Auto);
    let report = publisher.sync(&[veth("veth0")], false).await.unwrap();
    let message = report.capacity_dropped.expect("the drop is reported");
    assert!(message.contains("veth0") && message.contains("slot"), "{message}");
    assert_eq!(publisher.sharing_mode(), SharingMode::Slots);
    assert_eq!(api.device_count(), 32, "32 slot devices replace the shared one");
    assert_eq!(api.generations(), BTreeSet::from([2]));

    let mut changed = veth("veth0");
    changed.mtu = 1400;
    let report = publisher.sync(&[changed], false).await.unwrap();
    assert_eq!(report.capacity_dropped, None, "said once");
}

#[tokio::test]
async fn capacity_mode_reports_but_does_not_fall_back() {
    let api = FakeApi { drop_capacity: true, ..FakeApi::default() };
    let mut publisher = publisher(&api, &["veth0"], RequestedSharing::Capacity);
    let report = publisher.sync(&[veth("veth0")], false).await.unwrap();
    assert!(report.capacity_dropped.is_some());
    assert_eq!(publisher.sharing_mode(), SharingMode::Capacity);
    assert_eq!(api.device_count(), 1);
}

#[tokio::test]
async fn a_working_server_keeps_capacity() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &["veth0"], RequestedSharing::Auto);
    let report = publisher.sync(&[veth("veth0")], false).await.unwrap();
    assert_eq!(report.capacity_dropped, None);
    assert_eq!(publisher.sharing_mode(), SharingMode::Capacity);
}

#[tokio::test]
async fn devices_moved_into_pods_stay_published() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let all = nics(3);
    publisher.sync(&all, false).await.unwrap();
    let moved =
        Inventory::build(&all[..1], &Selection::new(&[], &[], &[], SharingMode::Capacity).unwrap())
            .devices;
    publisher.set_retained(moved);
    let report = publisher.sync(&all[1..], false).await.unwrap();
    assert_eq!(report.applied, 0, "nothing changed from the pool's point of view");
    assert_eq!(api.device_count(), 3);
}

/// A NIC coming back from a pod while a round's discovery runs: the discovery did not see
/// it (it was still in the pod), and the moved set was cleared before the round read it
/// again. The set read before the discovery keeps it published.
#[tokio::test]
async fn a_nic_returning_during_a_discovery_stays_published() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let all = nics(3);
    let in_pod = BTreeSet::from([all[0].name.clone()]);
    publisher.sync(&all, false).await.unwrap();
    publisher.retain_moved(&in_pod);
    publisher.sync(&all[1..], false).await.unwrap();
    assert_eq!(api.device_count(), 3, "kept while in the pod");

    // This round's discovery ran before the NIC came back; the mark was cleared after.
    publisher.retain_moved(&run::moved_across(in_pod, &BTreeSet::new()));
    publisher.sync(&all[1..], false).await.unwrap();
    assert_eq!(api.device_count(), 3, "dropped for a round while returning");

    // The next round sees it on the host.
    publisher.retain_moved(&run::moved_across(BTreeSet::new(), &BTreeSet::new()));
    publisher.sync(&all, false).await.unwrap();
    assert_eq!(api.device_count(), 3);
}

#[tokio::test]
async fn a_nic_inside_a_pod_stays_published_across_a_daemon_restart() {
    let api = FakeApi::default();
    let all = nics(3);
    publisher(&api, &["veth0"], RequestedSharing::Auto)
        .sync(&[all.clone(), vec![veth("veth0")]].concat(), false)
        .await
        .unwrap();
    let before = api.slices.lock().unwrap().values().next().unwrap().spec.devices.clone();

    // The daemon restarts while ens0 is inside a pod: discovery no longer sees it and the new
    // publisher has published nothing yet; the API server still holds the device.
    let mut restarted = publisher(&api, &["veth0"], RequestedSharing::Auto);
    restarted.retain_moved(&BTreeSet::from(["ens0".to_owned()]));
    let report =
        restarted.sync(&[all[1..].to_vec(), vec![veth("veth0")]].concat(), false).await.unwrap();
    assert_eq!(report.devices, 4, "ens0 stays published while its pod runs");
    let after = api.slices.lock().unwrap().values().next().unwrap().spec.devices.clone();
    assert_eq!(after, before, "the device reads back exactly as it was published");

    // Back on the host and no longer moved: discovery sees it again.
    restarted.retain_moved(&BTreeSet::new());
    let report = restarted.sync(&all[1..], false).await.unwrap();
    assert_eq!(report.devices, 2, "neither a gone shared parent nor a gone NIC is kept");
}

#[tokio::test]
async fn the_owner_reference_is_set_on_every_slice() {
    let api = FakeApi::default();
    let owner = OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: "node-a".to_owned(),
        uid: "uid-1".to_owned(),
        controller: Some(true),
        ..OwnerReference::default()
    };
    let selection = Selection::new(&[], &[], &[], SharingMode::Capacity).unwrap();
    let mut publisher =
        Publisher::new(&api, pool(), selection, RequestedSharing::Auto, Some(owner));
    publisher.sync(&nics(200), false).await.unwrap();
    for slice in api.slices.lock().unwrap().values() {
        assert_eq!(slice.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
    }
}

#[tokio::test]
async fn a_late_watch_event_of_an_older_generation_is_not_a_change() {
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    publisher.sync(&nics(2), false).await.unwrap();
    let name = publisher.slice_names().into_iter().next().unwrap();
    let first = api.slices.lock().unwrap().get(&name).unwrap().spec.clone();
    let mut changed = nics(2);
    changed[0].mtu = 9000;
    publisher.sync(&changed, false).await.unwrap();
    assert_eq!(publisher.generation(), 2);
    assert!(!publisher.needs_repair(&name, Some(&first)), "generation 1 is our own old write");
}

/// Inputs with Ready networks `(name, spec)`, created in list order.
fn network_inputs(specs: &[(&str, serde_json::Value)]) -> NetworkInputs {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    let networks = specs
        .iter()
        .enumerate()
        .map(|(age, (name, spec))| {
            let mut network: crate::model::pod_network::PodNetwork =
                serde_json::from_value(serde_json::json!({"spec": spec})).unwrap();
            network.metadata.name = Some((*name).to_owned());
            network.metadata.generation = Some(1);
            network.metadata.creation_timestamp =
                Some(Time(Timestamp::from_second(i64::try_from(age).unwrap()).unwrap()));
            let ready = if network.spec.enabled { "True" } else { "False" };
            network.status = Some(crate::model::pod_network::PodNetworkStatus {
                observed_generation: Some(1),
                conditions: vec![Condition {
                    type_: "Ready".to_owned(),
                    status: ready.to_owned(),
                    reason: "Ready".to_owned(),
                    message: String::new(),
                    observed_generation: Some(1),
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                }],
                device_class_name: None,
                nodes: Vec::new(),
            });
            ((*name).to_owned(), network)
        })
        .collect();
    NetworkInputs {
        pod_networks: Some(std::sync::Arc::new(networks)),
        node_labels: Some(std::sync::Arc::default()),
    }
}

fn published_names(api: &FakeApi) -> Vec<String> {
    api.slices
        .lock()
        .unwrap()
        .values()
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
        .collect()
}

#[tokio::test]
async fn network_changes_republish_and_unrelated_ones_write_nothing() {
    use serde_json::json;
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &["veth0"], RequestedSharing::Auto);
    let interfaces = [veth("veth0")];
    let inputs = network_inputs(&[("medianet", json!({"parents": ["veth0"], "vlan": 7}))]);
    assert!(publisher.set_networks(&inputs));
    publisher.sync(&interfaces, false).await.unwrap();
    assert_eq!(published_names(&api), ["medianet-veth0"], "only as the network's device");

    // Another status write that serves the same network on the same terms: no change.
    let mut same = inputs.clone();
    let mut networks = (*same.pod_networks.take().unwrap()).clone();
    networks.get_mut("medianet").unwrap().metadata.resource_version = Some("99".to_owned());
    same.pod_networks = Some(std::sync::Arc::new(networks));
    assert!(!publisher.set_networks(&same));
    let writes = api.applies();
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert_eq!((report.applied, api.applies()), (0, writes), "no API write when nothing changed");

    // Disabled: the network's device goes, the plain shared parent comes back.
    let disabled =
        network_inputs(&[("medianet", json!({"parents": ["veth0"], "vlan": 7, "enabled": false}))]);
    assert!(publisher.set_networks(&disabled));
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert_eq!(report.applied, 1);
    assert_eq!(published_names(&api), ["veth0"]);
}

#[tokio::test]
async fn a_conflict_is_reported_once_until_it_is_resolved() {
    use serde_json::json;
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let interfaces = [veth("veth0")];
    let both = network_inputs(&[
        ("older", json!({"parents": ["veth0"], "vlan": 5})),
        ("newer", json!({"parents": ["veth0"], "vlan": 5})),
    ]);
    publisher.set_networks(&both);
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert_eq!(report.new_conflicts.len(), 1);
    assert_eq!(report.new_conflicts[0].kept, "older");
    assert_eq!(published_names(&api), ["older-veth0"]);
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert!(report.new_conflicts.is_empty(), "reported once");

    publisher.set_networks(&network_inputs(&[("older", json!({"parents": ["veth0"], "vlan": 5}))]));
    publisher.sync(&interfaces, false).await.unwrap();
    publisher.set_networks(&both);
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert_eq!(report.new_conflicts.len(), 1, "a conflict that came back is reported again");
}

#[tokio::test]
async fn a_nic_in_a_pod_loses_its_tag_when_its_network_is_disabled() {
    use serde_json::json;
    let api = FakeApi::default();
    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let all = nics(2);
    let on = network_inputs(&[("dev", json!({"parents": ["ens0"], "mode": "host-device"}))]);
    publisher.set_networks(&on);
    publisher.sync(&all, false).await.unwrap();
    let tag = |api: &FakeApi| {
        api.slices
            .lock()
            .unwrap()
            .values()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .find(|d| d.name == "pci-0000-00-00-0")
            .and_then(|d| d.attributes.unwrap().get("podNetwork").cloned())
            .and_then(|a| a.string)
    };
    assert_eq!(tag(&api).as_deref(), Some("dev"));

    // ens0 moves into a pod: kept published, still tagged.
    publisher.retain_moved(&BTreeSet::from(["ens0".to_owned()]));
    publisher.sync(&all[1..], false).await.unwrap();
    assert_eq!(tag(&api).as_deref(), Some("dev"));
    // Disabled while it is there: still published (its pod runs), without the tag.
    publisher.set_networks(&network_inputs(&[(
        "dev",
        json!({"parents": ["ens0"], "mode": "host-device", "enabled": false}),
    )]));
    publisher.sync(&all[1..], false).await.unwrap();
    assert_eq!(api.device_count(), 2);
    assert_eq!(tag(&api), None);
}

/// Devices with prepared claims, as the claim service would report them.
#[derive(Debug, Default)]
struct Prepared(Mutex<BTreeSet<String>>);

impl Prepared {
    fn set(&self, names: &[&str]) {
        *self.0.lock().unwrap() = names.iter().map(|n| (*n).to_owned()).collect();
    }
}

impl PreparedDeviceSource for Prepared {
    fn prepared_devices(&self) -> BTreeSet<String> {
        self.0.lock().unwrap().clone()
    }
}

/// `(allowMultipleAllocations, has capacity)` of device `name` as the API stores it.
fn stored_sharing(api: &FakeApi, name: &str) -> Option<(Option<bool>, bool)> {
    api.slices
        .lock()
        .unwrap()
        .values()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .find(|d| d.name == name)
        .map(|d| (d.allow_multiple_allocations, d.capacity.is_some()))
}

#[tokio::test]
async fn a_network_turning_exclusive_waits_while_claims_are_prepared_on_its_shared_device() {
    use serde_json::json;
    let api = FakeApi::default();
    let prepared = std::sync::Arc::new(Prepared::default());
    let mut publisher =
        publisher(&api, &[], RequestedSharing::Auto).with_prepared(prepared.clone());
    let all = nics(2);
    publisher.set_networks(&network_inputs(&[("medianet", json!({"parents": ["ens0"]}))]));
    publisher.sync(&all, false).await.unwrap();
    let shared = "medianet-pci-0000-00-00-0";
    assert_eq!(stored_sharing(&api, shared), Some((Some(true), true)));
    // A claim on another device holds nothing.
    prepared.set(&[shared, "pci-0000-00-00-1"]);

    // The network turns the NIC exclusive while a claim is prepared on its shared device.
    let exclusive =
        network_inputs(&[("medianet", json!({"parents": ["ens0"], "mode": "host-device"}))]);
    assert!(publisher.set_networks(&exclusive));
    let report = publisher.sync(&all, false).await.unwrap();
    let hold = SharingHold { device: shared.to_owned(), if_name: "ens0".to_owned() };
    assert_eq!(report.new_holds, std::slice::from_ref(&hold));
    assert!(hold.to_string().contains("waits until they are unprepared"), "{hold}");
    assert_eq!(report.applied, 0, "nothing to write: the pool stays as it was");
    assert_eq!(published_names(&api), [shared, "pci-0000-00-00-1"]);
    assert_eq!(stored_sharing(&api, shared), Some((Some(true), true)));
    assert!(publisher.is_holding());
    assert_eq!(*publisher.holds().borrow(), BTreeSet::from([hold.clone()]));
    // Said once.
    let report = publisher.sync(&all, false).await.unwrap();
    assert!(report.new_holds.is_empty() && report.released_holds.is_empty());

    // Unprepared: the change goes out, in one generation.
    let generation = publisher.generation();
    prepared.set(&[]);
    let report = publisher.sync(&all, false).await.unwrap();
    assert_eq!(report.released_holds, [hold]);
    assert!(!publisher.is_holding());
    assert_eq!(report.generation, generation + 1);
    assert_eq!(published_names(&api), ["pci-0000-00-00-0", "pci-0000-00-00-1"]);
    assert_eq!(stored_sharing(&api, "pci-0000-00-00-0"), Some((None, false)));
}

#[tokio::test]
async fn a_network_disabled_or_a_nic_gone_is_no_sharing_change_and_holds_nothing() {
    use serde_json::json;
    let api = FakeApi::default();
    let prepared = std::sync::Arc::new(Prepared::default());
    let mut publisher =
        publisher(&api, &[], RequestedSharing::Auto).with_prepared(prepared.clone());
    let all = nics(1);
    publisher.set_networks(&network_inputs(&[("medianet", json!({"parents": ["ens0"]}))]));
    publisher.sync(&all, false).await.unwrap();
    prepared.set(&["medianet-pci-0000-00-00-0"]);
    publisher.set_networks(&network_inputs(&[(
        "medianet",
        json!({"parents": ["ens0"], "enabled": false}),
    )]));
    let report = publisher.sync(&all, false).await.unwrap();
    assert!(report.new_holds.is_empty());
    assert!(published_names(&api).is_empty(), "{:?}", published_names(&api));
}

#[tokio::test]
async fn the_auto_fallback_to_slots_waits_while_claims_are_prepared_on_a_shared_device() {
    // Published with consumable capacity; then the API server loses the feature (a
    // downgrade) and the daemon restarts while a claim is prepared on veth0.
    let before = FakeApi::default();
    publisher(&before, &["veth0", "veth1"], RequestedSharing::Auto)
        .sync(&[veth("veth0"), veth("veth1")], false)
        .await
        .unwrap();
    let api = FakeApi { drop_capacity: true, ..FakeApi::default() };
    api.slices.lock().unwrap().clone_from(&before.slices.lock().unwrap());
    let prepared = std::sync::Arc::new(Prepared::default());
    prepared.set(&["veth0"]);
    let mut publisher = publisher(&api, &["veth0", "veth1"], RequestedSharing::Auto)
        .with_prepared(prepared.clone());
    let devices = publisher.devices();
    let interfaces = [veth("veth0"), veth("veth1")];
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert!(report.capacity_dropped.is_some());
    assert_eq!(publisher.sharing_mode(), SharingMode::Slots);
    let hold = SharingHold { device: "veth0".to_owned(), if_name: "veth0".to_owned() };
    assert_eq!(report.new_holds, std::slice::from_ref(&hold));
    // veth0 is still sent as one shared device; veth1, with no claim, became slots.
    let sent = devices.borrow().clone();
    let veth0: Vec<&Device> = sent.iter().filter(|d| d.if_name == "veth0").collect();
    assert_eq!(veth0.len(), 1);
    assert_eq!((veth0[0].sharing, veth0[0].shared_capacity), (Sharing::Shared, Some(256)));
    assert_eq!(sent.iter().filter(|d| d.if_name == "veth1").count(), 32);

    prepared.set(&[]);
    let report = publisher.sync(&interfaces, false).await.unwrap();
    assert_eq!(report.released_holds, [hold]);
    assert_eq!(api.device_count(), 64, "both parents as slots now");
}

#[tokio::test]
async fn a_parent_dropped_from_shared_parents_across_a_restart_waits_for_its_claims() {
    let before = FakeApi::default();
    publisher(&before, &["ens0"], RequestedSharing::Auto).sync(&nics(1), false).await.unwrap();
    assert_eq!(stored_sharing(&before, "pci-0000-00-00-0"), Some((Some(true), true)));
    // Restarted without --shared-parents: the NIC would become an exclusive device of the
    // same name, allocatable whole while macvlan children of its claims sit on it.
    let api = FakeApi::default();
    api.slices.lock().unwrap().clone_from(&before.slices.lock().unwrap());
    let prepared = std::sync::Arc::new(Prepared::default());
    prepared.set(&["pci-0000-00-00-0"]);
    let mut publisher =
        publisher(&api, &[], RequestedSharing::Auto).with_prepared(prepared.clone());
    let report = publisher.sync(&nics(1), false).await.unwrap();
    assert_eq!(report.new_holds.len(), 1, "{report:?}");
    assert_eq!(api.generations(), BTreeSet::from([2]));
    assert_eq!(stored_sharing(&api, "pci-0000-00-00-0"), Some((Some(true), true)));

    prepared.set(&[]);
    publisher.sync(&nics(1), false).await.unwrap();
    assert_eq!(stored_sharing(&api, "pci-0000-00-00-0"), Some((None, false)));
}

#[tokio::test]
async fn existing_slices_are_rewritten_with_unqualified_attributes_in_one_generation() {
    // A pool of an earlier release: attribute names qualified with our domain, two slices.
    let before = FakeApi::default();
    let all = nics(200);
    publisher(&before, &[], RequestedSharing::Auto).sync(&all, false).await.unwrap();
    let api = FakeApi::default();
    for (name, mut slice) in before.slices.lock().unwrap().clone() {
        for device in slice.spec.devices.iter_mut().flatten() {
            let attributes = device.attributes.take().unwrap_or_default();
            device.attributes = Some(
                attributes
                    .into_iter()
                    .map(|(key, value)| {
                        (crate::model::names::qualified_name(&key, "netclaim.dev"), value)
                    })
                    .collect(),
            );
        }
        api.slices.lock().unwrap().insert(name, slice);
    }
    let names_before = published_names(&api);
    assert!(names_before.len() == 200 && api.slices.lock().unwrap().len() == 2);
    let qualified = |api: &FakeApi| {
        api.slices
            .lock()
            .unwrap()
            .values()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .flat_map(|d| d.attributes.unwrap_or_default().into_keys())
            .filter(|key| key.starts_with("netclaim.dev/"))
            .count()
    };
    assert!(qualified(&api) > 0);

    let mut publisher = publisher(&api, &[], RequestedSharing::Auto);
    let report = publisher.sync(&all, false).await.unwrap();
    assert_eq!(report.applied, 2);
    assert_eq!(api.generations(), BTreeSet::from([2]), "every slice at the next generation");
    assert_eq!(published_names(&api), names_before, "same device names");
    assert_eq!(qualified(&api), 0);
}
