//! PodNetwork claims: addresses from blocks, static reservations, quarantine, restarts and
//! block release, against an in-memory `IPBlock` API (the real API server's behaviour is
//! covered by `tests/api/podnetwork_ipam.rs`), and the state dir of the release before them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use super::*;
use crate::claims::networks::{
    BlockApiError, Created, Deleted, IpBlockApi, NetworkPorts, NetworkReadError, PodNetworkSource,
};
use crate::ipam::{Clock, ManualClock, OwnedBlock};
use crate::model::pod_network::{IpBlock, PodNetwork};

/// `IPBlock`s by name, as one API server would keep them for every node.
#[derive(Default)]
pub(super) struct FakeBlocks {
    objects: Mutex<BTreeMap<String, IpBlock>>,
    next_uid: AtomicUsize,
    pub(super) creates: AtomicUsize,
    pub(super) lists: AtomicUsize,
    pub(super) deletes: AtomicUsize,
    /// Lists fail (an API server out of reach).
    pub(super) failing_lists: AtomicBool,
    /// Deletes fail without deleting.
    pub(super) failing_deletes: AtomicBool,
    /// Deletes delete, but the answer is lost (a timeout after the server acted).
    pub(super) lost_delete_answers: AtomicBool,
    /// Creates create, but the answer is lost (a timeout or a 503 after the server acted).
    pub(super) lost_create_answers: AtomicBool,
    /// The next this many creates find their block just created by another node (`node-z`):
    /// races lost to nodes that claimed after this one listed.
    pub(super) raced_by_others: AtomicUsize,
}

fn api_failure(op: &'static str) -> BlockApiError {
    BlockApiError {
        op,
        name: "test".into(),
        source: crate::model::cause::cause(std::io::Error::other("the API server is unreachable")),
    }
}

impl FakeBlocks {
    fn all(&self) -> Vec<IpBlock> {
        self.objects.lock().unwrap().values().cloned().collect()
    }

    fn remove(&self, name: &str) {
        self.objects.lock().unwrap().remove(name);
    }

    /// The object named `name`.
    pub(super) fn get(&self, name: &str) -> Option<IpBlock> {
        self.objects.lock().unwrap().get(name).cloned()
    }

    pub(super) fn insert(&self, mut block: IpBlock) -> IpBlock {
        let uid = self.next_uid.fetch_add(1, Ordering::SeqCst);
        block.metadata.uid = Some(format!("block-uid-{uid}"));
        self.objects.lock().unwrap().insert(block.metadata.name.clone().unwrap(), block.clone());
        block
    }
}

impl IpBlockApi for FakeBlocks {
    fn list_node(&self, node: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        if self.failing_lists.load(Ordering::SeqCst) {
            return Box::pin(async { Err(api_failure("list")) });
        }
        let found = self.all().into_iter().filter(|b| b.spec.node_name == node).collect();
        Box::pin(async move { Ok(found) })
    }

    fn list_network(&self, network: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        if self.failing_lists.load(Ordering::SeqCst) {
            return Box::pin(async { Err(api_failure("list")) });
        }
        let found = self.all().into_iter().filter(|b| b.spec.pod_network == network).collect();
        Box::pin(async move { Ok(found) })
    }

    fn create(&self, block: IpBlock) -> BoxFuture<'_, Result<Created, BlockApiError>> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        let name = block.metadata.name.clone().unwrap();
        let mut existing = self.objects.lock().unwrap().get(&name).cloned();
        let raced = |n: usize| n.checked_sub(1);
        if existing.is_none()
            && self.raced_by_others.fetch_update(Ordering::SeqCst, Ordering::SeqCst, raced).is_ok()
        {
            let mut theirs = block.clone();
            theirs.spec.node_name = "node-z".into();
            existing = Some(self.insert(theirs));
        }
        let answer = match existing {
            Some(existing) => Created::Exists(existing),
            None => Created::Created(self.insert(block)),
        };
        if self.lost_create_answers.load(Ordering::SeqCst) {
            return Box::pin(async { Err(api_failure("create")) });
        }
        Box::pin(async move { Ok(answer) })
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Deleted, BlockApiError>> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        if self.failing_deletes.load(Ordering::SeqCst) {
            return Box::pin(async { Err(api_failure("delete")) });
        }
        let lost_answer = self.lost_delete_answers.load(Ordering::SeqCst);
        let mut objects = self.objects.lock().unwrap();
        let answer = match objects.get(name) {
            None => Deleted::Gone,
            Some(b) if b.metadata.uid.as_deref() == Some(uid) => {
                objects.remove(name);
                Deleted::Deleted
            }
            Some(_) => Deleted::NotOurs,
        };
        if lost_answer {
            return Box::pin(async { Err(api_failure("delete")) });
        }
        Box::pin(async move { Ok(answer) })
    }
}

/// The networks the node sees.
#[derive(Default)]
pub(super) struct FakeNetworks(Mutex<BTreeMap<String, PodNetwork>>);

impl FakeNetworks {
    pub(super) fn put(&self, network: PodNetwork) {
        self.0.lock().unwrap().insert(network.metadata.name.clone().unwrap(), network);
    }
}

impl PodNetworkSource for FakeNetworks {
    fn get(&self, name: &str) -> BoxFuture<'_, Result<Option<PodNetwork>, NetworkReadError>> {
        let found = self.0.lock().unwrap().get(name).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
}

pub(super) fn medianet(extra: Value) -> PodNetwork {
    let mut spec = json!({
        "parents": ["eth2"],
        "ipam": {
            "subnets": ["10.10.0.0/16", "fd00:10::/64"],
            "gateways": ["10.10.0.1"],
            "exclude": ["10.10.0.0/24"],
            "staticRanges": ["10.10.0.0/24"],
            "blockSize": {"ipv4": 26, "ipv6": 120}
        }
    });
    if let Value::Object(extra) = extra {
        spec.as_object_mut().unwrap().extend(extra);
    }
    let mut object = json!({"metadata": {"name": "medianet", "generation": 1}});
    object["spec"] = spec;
    serde_json::from_value(object).unwrap()
}

/// The claim service of `node` on `dir`, serving `networks` with `blocks`, on `clock`.
fn node_service(
    api: &Arc<MapClaims>,
    dir: &std::path::Path,
    node: &str,
    blocks: &Arc<FakeBlocks>,
    networks: &Arc<FakeNetworks>,
    clock: &Arc<ManualClock>,
) -> Service {
    let store = Arc::new(Store::open(dir).unwrap());
    ClaimService::load_with_clock(
        ServiceIdentity { driver: DRIVER.into(), node: node.into() },
        Arc::clone(api),
        fixed_devices(),
        store,
        Arc::clone(clock) as Arc<dyn Clock>,
    )
    .unwrap()
    .with_pod_networks(NetworkPorts {
        networks: Arc::clone(networks) as Arc<dyn PodNetworkSource>,
        blocks: Arc::clone(blocks) as Arc<dyn IpBlockApi>,
        release_grace: Duration::from_mins(10),
    })
}

/// A claim of `node` for `eth2` whose class names `medianet` and whose own config is `own`.
fn network_claim(name: &str, uid: &str, node: &str, own: Value) -> ResourceClaim {
    claim(
        name,
        uid,
        vec![result("net", DRIVER, node, "eth2")],
        vec![
            config("FromClass", DRIVER, &[], params(json!({"podNetwork": "medianet"}))),
            config("FromClaim", DRIVER, &[], params(own)),
        ],
    )
}

struct Node {
    service: Service,
    dir: tempfile::TempDir,
}

struct World {
    api: Arc<MapClaims>,
    blocks: Arc<FakeBlocks>,
    networks: Arc<FakeNetworks>,
    clock: Arc<ManualClock>,
}

impl World {
    fn new() -> World {
        let networks = Arc::new(FakeNetworks::default());
        networks.put(medianet(json!({})));
        World {
            api: Arc::new(MapClaims::default()),
            blocks: Arc::new(FakeBlocks::default()),
            networks,
            clock: Arc::new(ManualClock::at(1_700_000_000_000)),
        }
    }

    fn node(&self, name: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let service =
            node_service(&self.api, dir.path(), name, &self.blocks, &self.networks, &self.clock);
        Node { service, dir }
    }

    fn reopen(&self, node: Node, name: &str) -> Node {
        let Node { service, dir } = node;
        drop(service);
        let service =
            node_service(&self.api, dir.path(), name, &self.blocks, &self.networks, &self.clock);
        Node { service, dir }
    }

    /// Puts a claim of `node` and prepares it there.
    async fn prepare(
        &self,
        node: &Node,
        node_name: &str,
        name: &str,
        own: Value,
    ) -> Result<Vec<IpNetwork>, String> {
        let uid = format!("uid-{name}");
        self.api.put(network_claim(name, &uid, node_name, own));
        prepare_one(&node.service, &reference(name, &uid)).await?;
        Ok(node.service.prepared(&uid).unwrap().devices[0].addresses.clone())
    }
}

fn journal_kinds(dir: &std::path::Path) -> BTreeMap<String, usize> {
    let store = Store::open(dir);
    drop(store);
    let text = std::fs::read_to_string(dir.join("journal")).unwrap();
    let mut kinds = BTreeMap::new();
    for line in text.lines().skip(1) {
        let entry: Value = serde_json::from_str(line.split_once(' ').unwrap().1).unwrap();
        for op in entry["ops"].as_array().unwrap() {
            *kinds
                .entry(format!("{}:{}", op["op"].as_str().unwrap(), op["kind"].as_str().unwrap()))
                .or_default() += 1;
        }
    }
    kinds
}

#[tokio::test]
async fn a_network_claim_gets_one_address_per_family_from_its_nodes_blocks() {
    let world = World::new();
    let node = world.node("node-a");
    let first = world.prepare(&node, "node-a", "web-0", json!({})).await.unwrap();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first[0].is_ipv4() && first[0].prefix() == 16, "{first:?}");
    assert!(first[1].is_ipv6() && first[1].prefix() == 64, "{first:?}");
    let blocks = world.blocks.all();
    assert_eq!(blocks.len(), 2, "one block per family");
    assert!(
        blocks.iter().all(|b| b.spec.node_name == "node-a" && b.spec.pod_network == "medianet")
    );
    assert_eq!(world.blocks.creates.load(Ordering::SeqCst), 2);
    // 60 more pods: the v4 /26 (62 hosts, none excluded there unless the start block is the
    // gateway's) fills, then one more block; no API call per address.
    for i in 1..=61 {
        world.prepare(&node, "node-a", &format!("web-{i}"), json!({})).await.unwrap();
    }
    let creates = world.blocks.creates.load(Ordering::SeqCst);
    assert!(creates <= 4, "{creates} creates for 62 pods");
    let v4_blocks = world.blocks.all().iter().filter(|b| !b.spec.cidr.contains(':')).count();
    assert!(v4_blocks <= 2, "{v4_blocks}");
    // Blocks are recorded in the same commit as the first claim using them.
    let records = lock(&node.service.state).ipam.blocks().filter(|s| s.recorded).count();
    assert_eq!(records, world.blocks.all().len());
    let all: std::collections::HashSet<std::net::IpAddr> =
        lock(&node.service.state).ipam.leases().map(|l| l.address).collect();
    assert_eq!(all.len(), 62 * 2, "no address twice");
}

#[tokio::test]
async fn a_missing_network_or_a_pool_with_a_network_fails_naming_the_field() {
    let world = World::new();
    let node = world.node("node-a");
    world.api.put(claim(
        "lost",
        "uid-lost",
        vec![result("net", DRIVER, "node-a", "eth2")],
        vec![config("FromClaim", DRIVER, &[], params(json!({"podNetwork": "nosuchnet"})))],
    ));
    let err = prepare_one(&node.service, &reference("lost", "uid-lost")).await.unwrap_err();
    assert!(
        err.contains("podNetwork") && err.contains("nosuchnet") && err.contains("no PodNetwork"),
        "{err}"
    );
    let err = world
        .prepare(&node, "node-a", "pooled", json!({"ipam": {"pool": {"subnet": "10.10.9.0/24"}}}))
        .await
        .unwrap_err();
    assert!(
        err.contains("ipam.pool") && err.contains("not allowed with podNetwork medianet"),
        "{err}"
    );
    let mut deleting = medianet(json!({}));
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    world.networks.put(deleting);
    let err = world.prepare(&node, "node-a", "late", json!({})).await.unwrap_err();
    assert!(err.contains("podNetwork") && err.contains("being deleted"), "{err}");
    assert!(world.blocks.all().is_empty(), "refused claims claim no block");
}

#[tokio::test]
async fn a_static_address_is_reserved_cluster_wide_and_a_second_node_is_refused() {
    let world = World::new();
    let (a, b) = (world.node("node-a"), world.node("node-b"));
    let own = json!({"ipam": {"addresses": ["10.10.0.50/16"]}});
    assert_eq!(
        world.prepare(&a, "node-a", "db-a", own.clone()).await.unwrap(),
        ["10.10.0.50/16".parse::<IpNetwork>().unwrap()]
    );
    let reservation =
        world.blocks.all().into_iter().find(|b| b.spec.cidr == "10.10.0.50/32").unwrap();
    assert_eq!(reservation.metadata.name.as_deref(), Some("medianet.v4-10-10-0-50-32"));
    assert_eq!(reservation.spec.claim.as_ref().unwrap().uid, "uid-db-a");
    let err = world.prepare(&b, "node-b", "db-b", own.clone()).await.unwrap_err();
    assert!(
        err.contains("ipam.addresses[0]")
            && err.contains("10.10.0.50")
            && err.contains("default/db-a")
            && err.contains("node-a"),
        "{err}"
    );
    assert!(
        lock(&b.service.state).ipam.leases().next().is_none(),
        "the refused claim holds nothing"
    );
    // The same claim preparing again (kubelet's retry after a restart that lost the record)
    // gets its reservation back.
    let a = world.reopen(a, "node-a");
    assert_eq!(world.prepare(&a, "node-a", "db-a", own.clone()).await.unwrap().len(), 1);
    // Unprepare deletes the reservation; the other node gets the address then.
    a.service.unprepare(vec![reference("db-a", "uid-db-a")]).await["uid-db-a"].as_ref().unwrap();
    assert!(
        world.blocks.all().iter().all(|b| b.spec.cidr != "10.10.0.50/32"),
        "reservation deleted at unprepare"
    );
    world.prepare(&b, "node-b", "db-b", own).await.unwrap();
    // Outside the network's staticRanges: refused before any API call.
    let err = world
        .prepare(&b, "node-b", "db-c", json!({"ipam": {"addresses": ["10.10.5.5/16"]}}))
        .await
        .unwrap_err();
    assert!(err.contains("ipam.addresses[0]") && err.contains("ipam.staticRanges"), "{err}");
}

#[tokio::test]
async fn a_released_address_is_quarantined_for_30_seconds_across_a_restart() {
    let world = World::new();
    let node = world.node("node-a");
    let own = json!({});
    let first = world.prepare(&node, "node-a", "a", own.clone()).await.unwrap();
    node.service.unprepare(vec![reference("a", "uid-a")]).await["uid-a"].as_ref().unwrap();
    let node = world.reopen(node, "node-a");
    world.clock.advance(Duration::from_secs(29));
    let second = world.prepare(&node, "node-a", "b", own.clone()).await.unwrap();
    assert_ne!(first[0], second[0], "inside the quarantine, after a restart");
    assert_ne!(first[1], second[1]);
    world.clock.advance(Duration::from_secs(1));
    let third = world.prepare(&node, "node-a", "c", own.clone()).await.unwrap();
    assert_eq!(first, third, "the lowest free address again once 30 s passed");
    // Static addresses too: a node-local static address released by one claim is refused to
    // another for 30 s (the releasing claim itself may take it back).
    let local = claim(
        "s1",
        "uid-s1",
        vec![result("nic", DRIVER, "node-a", "eth1")],
        vec![config(
            "FromClaim",
            DRIVER,
            &[],
            params(json!({"ipam": {"addresses": ["192.168.7.7/24"]}})),
        )],
    );
    world.api.put(local.clone());
    prepare_one(&node.service, &reference("s1", "uid-s1")).await.unwrap();
    node.service.unprepare(vec![reference("s1", "uid-s1")]).await["uid-s1"].as_ref().unwrap();
    let mut other = local;
    other.metadata.name = Some("s2".into());
    other.metadata.uid = Some("uid-s2".into());
    world.api.put(other);
    let err = prepare_one(&node.service, &reference("s2", "uid-s2")).await.unwrap_err();
    assert!(
        err.contains("ipam.addresses[0]") && err.contains("not handed out again for 30 s"),
        "{err}"
    );
    prepare_one(&node.service, &reference("s1", "uid-s1")).await.unwrap();
}

#[tokio::test]
async fn a_restart_adopts_a_block_created_before_the_crash_and_keeps_a_lost_blocks_leases() {
    let world = World::new();
    let node = world.node("node-a");
    let addresses = world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    // A crash between a block's create and the commit that records it: the API has a block
    // of this node that the store does not.
    let orphan = world.blocks.insert(IpBlock::new(crate::model::pod_network::IpBlockSpec {
        pod_network: "medianet".into(),
        cidr: "10.10.200.0/26".into(),
        node_name: "node-a".into(),
        claim: None,
    }));
    // And a recorded block the API lost (deleted by hand) while a pod uses an address of it.
    let v4_block = lock(&node.service.state)
        .ipam
        .blocks()
        .find(|s| s.block.cidr.is_ipv4())
        .map(|s| s.block.clone())
        .unwrap();
    world.blocks.remove(&v4_block.name);
    let node = world.reopen(node, "node-a");
    node.service.reconcile_blocks().await.unwrap();
    {
        let state = lock(&node.service.state);
        let adopted = state.ipam.block(orphan.metadata.name.as_deref().unwrap()).unwrap();
        assert!(adopted.recorded, "adopted and recorded");
        // The lost block was claimed again (the name was free) under a new UID; its lease kept.
        let reclaimed = state.ipam.block(&v4_block.name).unwrap();
        assert!(!reclaimed.lost && reclaimed.block.uid != v4_block.uid, "{reclaimed:?}");
        assert!(state.ipam.leases().any(|l| l.address == addresses[0].ip()));
    }
    assert!(
        world
            .blocks
            .all()
            .iter()
            .any(|b| b.metadata.name.as_deref() == Some(v4_block.name.as_str()))
    );
    // A lost block another node took meanwhile stays lost: no new address from it.
    let node = world.reopen(node, "node-a");
    world.blocks.remove(&v4_block.name);
    world.blocks.insert(IpBlock::new(crate::model::pod_network::IpBlockSpec {
        pod_network: "medianet".into(),
        cidr: v4_block.cidr.to_string(),
        node_name: "node-b".into(),
        claim: None,
    }));
    node.service.reconcile_blocks().await.unwrap();
    assert!(lock(&node.service.state).ipam.block(&v4_block.name).unwrap().lost);
    let next = world.prepare(&node, "node-a", "b", json!({})).await.unwrap();
    assert!(!v4_block.cidr.contains(next[0].ip()), "{next:?} from a lost block");
    assert!(
        lock(&node.service.state).ipam.leases().any(|l| l.address == addresses[0].ip()),
        "the pod keeps its address"
    );
}

#[tokio::test]
async fn empty_blocks_go_after_the_grace_and_at_once_when_the_network_is_deleted() {
    let world = World::new();
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    node.service.unprepare(vec![reference("a", "uid-a")]).await["uid-a"].as_ref().unwrap();
    assert!(
        node.service.release_idle_blocks().await.released.is_empty(),
        "inside the grace and quarantine"
    );
    world.clock.advance(Duration::from_mins(9));
    let upkeep = node.service.release_idle_blocks().await;
    assert!(upkeep.released.is_empty(), "{upkeep:?}");
    assert_eq!(upkeep.pruned, 2, "the release records past their quarantine are pruned");
    assert_eq!(lock(&node.service.state).ipam.releases().count(), 0);
    world.clock.advance(Duration::from_mins(1));
    let upkeep = node.service.release_idle_blocks().await;
    assert_eq!(upkeep.released.len(), 2, "{upkeep:?}");
    assert!(world.blocks.all().is_empty());
    assert_eq!(lock(&node.service.state).ipam.blocks().count(), 0);
    // A network being deleted: its empty blocks go at once (no grace, no quarantine wait).
    world.prepare(&node, "node-a", "b", json!({})).await.unwrap();
    node.service.unprepare(vec![reference("b", "uid-b")]).await["uid-b"].as_ref().unwrap();
    let mut deleting = medianet(json!({}));
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    world.networks.put(deleting);
    assert_eq!(node.service.release_idle_blocks().await.released.len(), 2);
    let node = world.reopen(node, "node-a");
    assert_eq!(lock(&node.service.state).ipam.blocks().count(), 0, "forgotten durably");
    let kinds = journal_kinds(node.dir.path());
    assert_eq!(kinds.get("put:ipam-blocks").copied().unwrap_or(0), 4, "{kinds:?}");
}

#[tokio::test]
async fn a_state_dir_of_release_87c0da8_loads_and_serves_network_claims() {
    let world = World::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/state-87c0da8/journal"),
        dir.path().join("journal"),
    )
    .unwrap();
    let service =
        node_service(&world.api, dir.path(), NODE, &world.blocks, &world.networks, &world.clock);
    let mut names: Vec<String> = service.all_prepared().into_iter().map(|c| c.name).collect();
    names.sort();
    assert_eq!(names, ["db-nic", "media-net", "web-net"]);
    // The claim that named medianet before networks were served keeps its node-local lease.
    let media = service.prepared("0c6f3f4e-5b7d-4c39-9d55-2f1f6f1c0a01").unwrap();
    assert_eq!(media.devices[0].config.pod_network.as_deref(), Some("medianet"));
    assert!(matches!(media.devices[0].config.addressing, Addressing::Pool(_)));
    let leases: Vec<String> =
        lock(&service.state).ipam.leases().map(|l| l.address.to_string()).collect();
    assert_eq!(leases, ["10.9.0.2", "10.9.1.5", "10.10.0.1"]);
    // gone-net's release predates release records: its address is not quarantined.
    world.api.put(claim_with_pool(
        "fresh",
        "uid-fresh",
        &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.1"}),
    ));
    prepare_one(&service, &reference("fresh", "uid-fresh")).await.unwrap();
    assert_eq!(
        service.prepared("uid-fresh").unwrap().devices[0].addresses,
        ["10.9.0.3/24".parse().unwrap()]
    );
    // A network claim beside them.
    world.api.put(network_claim("net-1", "uid-net-1", NODE, json!({})));
    prepare_one(&service, &reference("net-1", "uid-net-1")).await.unwrap();
    drop(service);
    // The journal is in the current format now (a release before it refuses it), records
    // written back.
    let text = std::fs::read_to_string(dir.path().join("journal")).unwrap();
    assert!(
        text.starts_with(&format!(
            r#"{{"format":"netclaim-state","version":{}}}"#,
            crate::store::FORMAT_VERSION
        )),
        "{text}"
    );
    assert!(
        prepared_claim_versions(&dir.path().join("journal"))
            .iter()
            .filter(|v| **v == u64::from(PreparedClaim::VERSION))
            .count()
            >= 3
    );
    let service =
        node_service(&world.api, dir.path(), NODE, &world.blocks, &world.networks, &world.clock);
    assert_eq!(service.all_prepared().len(), 5);
    let unprepared =
        service.unprepare(vec![reference("web-net", "7a0f00be-daef-426e-901c-c8766c92ab18")]).await;
    assert!(unprepared["7a0f00be-daef-426e-901c-c8766c92ab18"].is_ok());
    let _ = OwnedBlock::clone;
}

#[tokio::test]
async fn a_network_claims_plan_carries_its_addresses_and_routes_for_the_status() {
    // What the attach and the claim status get: the prepared addresses (one per family, the
    // subnets' prefixes) planned onto the interface, and the network's routes; a static
    // address plans as given.
    use crate::podnet::plan::{AttachRequest, HostDevice, PodNetns, plan_attach};
    let world = World::new();
    world.networks.put(medianet(
        json!({"mtu": 1400, "routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.0.1"}]}),
    ));
    let node = world.node("node-a");
    for (name, own) in
        [("blocks", json!({})), ("fixed", json!({"ipam": {"addresses": ["10.10.0.9/16"]}}))]
    {
        let addresses = world.prepare(&node, "node-a", name, own).await.unwrap();
        let prepared = node.service.prepared(&format!("uid-{name}")).unwrap();
        let device = &prepared.devices[0];
        let host = HostDevice {
            if_name: device.if_name.clone(),
            kind: DeviceKind::Physical,
            sharing: Sharing::Shared,
            mtu: 1500,
            mac: None,
        };
        let pod = PodNetns { pod_uid: "pod-1".into(), path: "/run/netns/pod-1".into() };
        let plan = plan_attach(&AttachRequest {
            claim_uid: &prepared.uid,
            config: &device.config,
            device: &host,
            pod: &pod,
            interface_name: "net1",
            pool_addresses: &device.addresses,
        })
        .unwrap();
        assert_eq!(plan.addresses(), addresses, "{name}");
        assert_eq!(plan.routes().len(), 1, "{name}: the network's route");
        assert_eq!(device.config.interface.mtu, 1400, "{name}: the network's MTU");
        assert_eq!(device.config.pod_network.as_deref(), Some("medianet"));
    }
    // A plan given addresses outside the network is refused (a record edited by hand).
    let prepared = node.service.prepared("uid-blocks").unwrap();
    let device = &prepared.devices[0];
    let host = HostDevice {
        if_name: "eth2".into(),
        kind: DeviceKind::Physical,
        sharing: Sharing::Shared,
        mtu: 1500,
        mac: None,
    };
    let pod = PodNetns { pod_uid: "pod-1".into(), path: "/run/netns/pod-1".into() };
    let outside: Vec<IpNetwork> =
        vec!["10.99.0.5/16".parse().unwrap(), "fd00:10::5/64".parse().unwrap()];
    let refused = plan_attach(&AttachRequest {
        claim_uid: &prepared.uid,
        config: &device.config,
        device: &host,
        pod: &pod,
        interface_name: "net1",
        pool_addresses: &outside,
    });
    assert!(refused.is_err());
}

// ---- Decision 0017: what the node trusts (ipam-trust) ----

fn spec(network: &str, cidr: &str, node: &str) -> crate::model::pod_network::IpBlockSpec {
    crate::model::pod_network::IpBlockSpec {
        pod_network: network.into(),
        cidr: cidr.into(),
        node_name: node.into(),
        claim: None,
    }
}

/// The node's first IPv4 block of medianet when nothing else is taken.
async fn first_v4_block(node_name: &str) -> IpNetwork {
    let world = World::new();
    let node = world.node(node_name);
    world.prepare(&node, node_name, "probe", json!({})).await.unwrap();
    world
        .blocks
        .all()
        .iter()
        .map(|b| b.spec.cidr.parse::<IpNetwork>().unwrap())
        .find(IpNetwork::is_ipv4)
        .unwrap()
}

/// Every lease of `node` lies in a block the node holds, verified and not lost.
fn leases_in_owned_blocks(node: &Node) -> Result<(), String> {
    let state = lock(&node.service.state);
    for lease in state.ipam.leases().filter(|l| l.block.is_some()) {
        let inside = state
            .ipam
            .blocks()
            .any(|s| s.block.cidr.contains(lease.address) && !s.lost && !s.releasing && s.verified);
        if !inside {
            return Err(format!("{} is leased outside the node's blocks", lease.address));
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_block_of_another_drivers_network_or_an_unknown_one_is_never_adopted_nor_released() {
    let world = World::new();
    let mut other = medianet(json!({"provider": "other.example.com"}));
    other.metadata.name = Some("othernet".into());
    world.networks.put(other);
    let foreign = world.blocks.insert(IpBlock::new(spec("othernet", "10.30.0.0/26", "node-a")));
    let unknown = world.blocks.insert(IpBlock::new(spec("ghost", "10.31.0.0/26", "node-a")));
    let node = world.node("node-a");
    let summary = node.service.reconcile_blocks().await.unwrap();
    assert_eq!(summary.adopted, 0, "{summary:?}");
    assert!(node.service.owned_blocks().is_empty(), "{:?}", node.service.owned_blocks());
    world.clock.advance(Duration::from_mins(11));
    node.service.release_idle_blocks().await;
    for block in [foreign, unknown] {
        let name = block.metadata.name.unwrap();
        assert!(world.blocks.get(&name).is_some(), "{name} was deleted");
    }
}

#[tokio::test]
async fn a_release_is_journaled_before_its_delete_and_a_lost_answer_never_serves_the_block_again() {
    let world = World::new();
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    node.service.unprepare(vec![reference("a", "uid-a")]).await["uid-a"].as_ref().unwrap();
    world.clock.advance(Duration::from_mins(11));
    // The deletes reach the server, their answers do not.
    world.blocks.lost_delete_answers.store(true, Ordering::SeqCst);
    let upkeep = node.service.release_idle_blocks().await;
    assert!(upkeep.released.is_empty(), "{upkeep:?}");
    assert!(world.blocks.all().is_empty(), "deleted in the API");
    // Another node takes the same CIDRs meanwhile.
    let other = world.node("node-b");
    let theirs = world.prepare(&other, "node-b", "b", json!({})).await.unwrap();
    let ours = world.prepare(&node, "node-a", "c", json!({})).await.unwrap();
    assert!(ours.iter().all(|a| !theirs.contains(a)), "{ours:?} {theirs:?}");
    leases_in_owned_blocks(&node).unwrap();
    // The API is the truth: every address of node-a lies in a block the API has for it.
    let api_blocks: Vec<IpNetwork> = world
        .blocks
        .all()
        .iter()
        .filter(|b| b.spec.node_name == "node-a")
        .map(|b| b.spec.cidr.parse().unwrap())
        .collect();
    for address in &ours {
        assert!(
            api_blocks.iter().any(|b| b.contains(address.ip())),
            "{address} outside {api_blocks:?}"
        );
    }
    // The intents are durable: after a crash the old blocks are still going, then gone.
    let kinds = journal_kinds(node.dir.path());
    assert_eq!(kinds.get("put:ipam-block-releases"), Some(&2), "{kinds:?}");
    world.blocks.lost_delete_answers.store(false, Ordering::SeqCst);
    let node = world.reopen(node, "node-a");
    node.service.reconcile_blocks().await.unwrap();
    node.service.release_idle_blocks().await;
    let owned: Vec<IpNetwork> = node.service.owned_blocks().iter().map(|b| b.cidr).collect();
    for block in world.blocks.all().iter().filter(|b| b.spec.node_name == "node-a") {
        assert!(owned.contains(&block.spec.cidr.parse().unwrap()), "{block:?}");
    }
    assert_eq!(owned.len(), 2, "only the blocks of claim c remain: {owned:?}");
}

#[tokio::test]
async fn loaded_blocks_serve_only_after_the_first_reconcile() {
    let world = World::new();
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    node.service.unprepare(vec![reference("a", "uid-a")]).await["uid-a"].as_ref().unwrap();
    let v4 = node.service.owned_blocks().into_iter().find(|b| b.cidr.is_ipv4()).unwrap();
    // While the daemon is down its block is deleted and another node takes the CIDR.
    world.blocks.remove(&v4.name);
    world.blocks.insert(IpBlock::new(spec("medianet", &v4.cidr.to_string(), "node-b")));
    let node = world.reopen(node, "node-a");
    let got = world.prepare(&node, "node-a", "b", json!({})).await.unwrap();
    assert!(!v4.cidr.contains(got[0].ip()), "{got:?} from a block node-b owns now");
    leases_in_owned_blocks(&node).unwrap();
}

#[tokio::test]
async fn a_prepare_waiting_for_the_first_reconcile_fails_naming_why_at_its_deadline() {
    let world = World::new();
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    let Node { service, dir } = node;
    drop(service);
    world.blocks.failing_lists.store(true, Ordering::SeqCst);
    let service = node_service(
        &world.api,
        dir.path(),
        "node-a",
        &world.blocks,
        &world.networks,
        &world.clock,
    )
    .with_reconcile_patience(Duration::from_millis(300));
    let node = Node { service, dir };
    let err = world.prepare(&node, "node-a", "b", json!({})).await.unwrap_err();
    assert!(
        err.contains("podNetwork medianet")
            && err.contains("has not confirmed its IPBlocks")
            && err.contains("unreachable"),
        "{err}"
    );
    // The prepared claim is still answered from its record.
    prepare_one(&node.service, &reference("a", "uid-a")).await.unwrap();
    world.blocks.failing_lists.store(false, Ordering::SeqCst);
    world.prepare(&node, "node-a", "b", json!({})).await.unwrap();
}

#[tokio::test]
async fn a_block_chosen_to_be_forgotten_hands_out_nothing_while_its_record_goes() {
    let world = World::new();
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    node.service.unprepare(vec![reference("a", "uid-a")]).await["uid-a"].as_ref().unwrap();
    node.service.reconcile_blocks().await.unwrap();
    let v4 = node.service.owned_blocks().into_iter().find(|b| b.cidr.is_ipv4()).unwrap();
    world.blocks.remove(&v4.name);
    // The reconcile decides to forget the block, then waits for its commit; a prepare runs
    // in that window (join polls the reconcile first).
    let (reconciled, got) = tokio::join!(
        node.service.reconcile_blocks(),
        world.prepare(&node, "node-a", "b", json!({}))
    );
    assert_eq!(reconciled.unwrap().forgotten, 1);
    let got = got.unwrap();
    assert!(!v4.cidr.contains(got[0].ip()), "{got:?} from the block being forgotten");
    leases_in_owned_blocks(&node).unwrap();
}

#[tokio::test]
async fn a_claims_reservation_on_another_node_is_not_adopted_by_claim_uid_alone() {
    let world = World::new();
    let (a, b) = (world.node("node-a"), world.node("node-b"));
    let own = json!({"ipam": {"addresses": ["10.10.0.50/16"]}});
    world.prepare(&a, "node-a", "db", own.clone()).await.unwrap();
    // The same claim, allocated on node-b now, while node-a still holds its reservation.
    let err = world.prepare(&b, "node-b", "db", own).await.unwrap_err();
    assert!(err.contains("ipam.addresses[0]") && err.contains("node-a"), "{err}");
    assert!(b.service.owned_blocks().is_empty());
}

#[tokio::test]
async fn a_reservation_being_released_does_not_count_as_held() {
    let world = World::new();
    let node = world.node("node-a");
    let own = json!({"ipam": {"addresses": ["10.10.0.50/16"]}});
    world.prepare(&node, "node-a", "db", own.clone()).await.unwrap();
    world.blocks.failing_deletes.store(true, Ordering::SeqCst);
    node.service.unprepare(vec![reference("db", "uid-db")]).await["uid-db"].as_ref().unwrap();
    world.blocks.failing_deletes.store(false, Ordering::SeqCst);
    // The upkeep deletes the reservation while the same claim is prepared again.
    let (_, again) = tokio::join!(
        node.service.release_idle_blocks(),
        world.prepare(&node, "node-a", "db", own.clone())
    );
    let reserved = |world: &World| {
        world.blocks.all().iter().any(|b| {
            b.spec.cidr == "10.10.0.50/32"
                && b.spec.claim.as_ref().is_some_and(|c| c.uid == "uid-db")
        })
    };
    match again {
        Ok(_) => assert!(reserved(&world), "prepared without its reservation in the API"),
        Err(err) => assert!(err.contains("being released"), "{err}"),
    }
    node.service.release_idle_blocks().await;
    world.prepare(&node, "node-a", "db", own).await.unwrap();
    assert!(reserved(&world));
}

#[tokio::test]
async fn a_block_is_never_carved_over_a_live_object_of_another_name() {
    let first = first_v4_block("node-a").await;
    let world = World::new();
    // A reservation (an edit that bypassed the rules put a static there) inside it.
    let inside: std::net::IpAddr = match first.network() {
        std::net::IpAddr::V4(v4) => std::net::Ipv4Addr::from(u32::from(v4) + 5).into(),
        std::net::IpAddr::V6(_) => unreachable!(),
    };
    let mut reservation = IpBlock::new(spec("medianet", &format!("{inside}/32"), "node-b"));
    reservation.spec.claim = Some(crate::model::pod_network::IpBlockClaim {
        namespace: "default".into(),
        name: "db".into(),
        uid: "uid-other".into(),
    });
    world.blocks.insert(reservation);
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    for block in node.service.owned_blocks() {
        assert!(
            !block.cidr.contains(inside),
            "{} carved over the reservation of {inside}",
            block.cidr
        );
    }
}

#[tokio::test]
async fn a_static_inside_another_nodes_live_block_is_refused() {
    let world = World::new();
    let b = world.node("node-b");
    world.prepare(&b, "node-b", "web", json!({})).await.unwrap();
    let theirs = b.service.owned_blocks().into_iter().find(|x| x.cidr.is_ipv4()).unwrap();
    // An edit that bypassed the CRD's rules makes node-b's block a static range.
    world.networks.put(medianet(json!({"ipam": {
        "subnets": ["10.10.0.0/16", "fd00:10::/64"],
        "gateways": ["10.10.0.1"],
        "exclude": ["10.10.0.0/24"],
        "staticRanges": ["10.10.0.0/24", theirs.cidr.to_string()],
        "blockSize": {"ipv4": 26, "ipv6": 120}
    }})));
    let address = match theirs.cidr.network() {
        std::net::IpAddr::V4(v4) => std::net::Ipv4Addr::from(u32::from(v4) + 9),
        std::net::IpAddr::V6(_) => unreachable!(),
    };
    let a = world.node("node-a");
    let err = world
        .prepare(&a, "node-a", "db", json!({"ipam": {"addresses": [format!("{address}/16")]}}))
        .await
        .unwrap_err();
    assert!(err.contains("ipam.addresses[0]") && err.contains("node-b"), "{err}");
    assert!(world.blocks.all().iter().all(|x| x.spec.claim.is_none()), "no reservation made");
}

#[tokio::test]
async fn a_block_deleted_under_the_node_stops_serving_at_once_and_its_leases_stay() {
    use crate::claims::networks::{BlockEvent, LossCause};
    let world = World::new();
    let node = world.node("node-a");
    let first = world.prepare(&node, "node-a", "web-0", json!({})).await.unwrap();
    let owned = node.service.owned_blocks();
    let v4 = owned.iter().find(|b| b.cidr.is_ipv4()).unwrap().clone();
    let v6 = owned.iter().find(|b| b.cidr.is_ipv6()).unwrap().clone();
    // The watch's first list shows both; a stale event of another UID is no loss.
    let listed: Vec<IpBlock> = world.blocks.all();
    assert!(node.service.observe_block(BlockEvent::Relisted(listed.clone())).await.is_empty());
    let mut older = listed[0].clone();
    older.metadata.uid = Some("an-older-incarnation".into());
    assert!(node.service.observe_block(BlockEvent::Applied(older)).await.is_empty());
    // An administrator deletes the v4 block.
    let object = world.blocks.get(&v4.name).unwrap();
    world.blocks.remove(&v4.name);
    let losses = node.service.observe_block(BlockEvent::Deleted(object)).await;
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!((losses[0].cause.clone(), losses[0].leases), (LossCause::Deleted, 1));
    assert!(losses[0].to_string().contains(&v4.name), "{}", losses[0]);
    let next = world.prepare(&node, "node-a", "web-1", json!({})).await.unwrap();
    assert!(!v4.cidr.contains(next[0].ip()), "{next:?} from the lost block");
    {
        let state = lock(&node.service.state);
        assert!(state.ipam.leases().any(|l| l.address == first[0].ip()), "the pod keeps it");
        let conflicts: Vec<_> = state.ipam.conflicting_leases().iter().map(|l| l.address).collect();
        assert_eq!(conflicts, [first[0].ip()]);
    }
    // A delete missed while the watch was down: the relist lacks the v6 block it showed.
    world.blocks.remove(&v6.name);
    let losses = node.service.observe_block(BlockEvent::Relisted(world.blocks.all())).await;
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(
        (losses[0].name.as_str(), &losses[0].cause),
        (v6.name.as_str(), &LossCause::MissingFromList)
    );
    let next = world.prepare(&node, "node-a", "web-2", json!({})).await.unwrap();
    assert!(!v6.cidr.contains(next[1].ip()), "{next:?} from the lost block");
}

#[tokio::test]
async fn a_network_with_a_conflict_condition_gets_no_new_claims() {
    let world = World::new();
    let node = world.node("node-a");
    world.prepare(&node, "node-a", "before", json!({})).await.unwrap();
    let mut network = medianet(json!({}));
    network.status = Some(crate::model::pod_network::PodNetworkStatus {
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Conflict".into(),
            status: "True".into(),
            reason: "LiveObjects".into(),
            message: "10.10.4.0/26 of node-b overlaps spec.ipam.staticRanges[1]".into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: Some(1),
        }],
        ..Default::default()
    });
    world.networks.put(network);
    let err = world.prepare(&node, "node-a", "after", json!({})).await.unwrap_err();
    assert!(
        err.contains("podNetwork medianet")
            && err.contains("Conflict")
            && err.contains("10.10.4.0/26 of node-b"),
        "{err}"
    );
    // A claim prepared before is still answered.
    prepare_one(&node.service, &reference("before", "uid-before")).await.unwrap();
}

#[tokio::test]
async fn a_block_named_by_an_older_release_is_adopted_used_and_released_by_that_name() {
    use crate::model::pod_network::legacy_ip_block_name;
    let world = World::new();
    let first = first_v4_block("node-a").await;
    let mut old = IpBlock::new(spec("medianet", &first.to_string(), "node-a"));
    let old_name = legacy_ip_block_name("medianet", &first.to_string());
    old.metadata.name = Some(old_name.clone());
    world.blocks.insert(old);
    let node = world.node("node-a");
    assert_eq!(node.service.reconcile_blocks().await.unwrap().adopted, 1);
    let got = world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    assert!(first.contains(got[0].ip()), "{got:?}");
    assert!(
        world.blocks.all().iter().all(|b| b.spec.cidr != first.to_string()
            || b.metadata.name.as_deref() == Some(old_name.as_str())),
        "no second object for the CIDR"
    );
    node.service.unprepare(vec![reference("a", "uid-a")]).await["uid-a"].as_ref().unwrap();
    world.clock.advance(Duration::from_mins(11));
    let upkeep = node.service.release_idle_blocks().await;
    assert!(upkeep.released.contains(&old_name), "{upkeep:?}");
    assert!(world.blocks.all().is_empty());
}

#[tokio::test]
async fn a_lost_block_of_an_older_name_is_claimed_again_under_the_derived_name() {
    use crate::model::pod_network::{ip_block_name, legacy_ip_block_name};
    let world = World::new();
    let first = first_v4_block("node-a").await;
    let mut old = IpBlock::new(spec("medianet", &first.to_string(), "node-a"));
    let old_name = legacy_ip_block_name("medianet", &first.to_string());
    old.metadata.name = Some(old_name.clone());
    world.blocks.insert(old);
    let node = world.node("node-a");
    node.service.reconcile_blocks().await.unwrap();
    let got = world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    assert!(first.contains(got[0].ip()), "{got:?}");
    // Deleted by hand while the pod runs: the restart finds it lost and claims it again.
    world.blocks.remove(&old_name);
    let node = world.reopen(node, "node-a");
    assert_eq!(node.service.reconcile_blocks().await.unwrap().lost, 1);
    let new_name = ip_block_name("medianet", &first.to_string());
    assert!(world.blocks.get(&new_name).is_some(), "{:?}", world.blocks.all());
    let owned: Vec<String> = node.service.owned_blocks().into_iter().map(|b| b.name).collect();
    assert!(owned.contains(&new_name) && !owned.contains(&old_name), "{owned:?}");
    leases_in_owned_blocks(&node).unwrap();
    // Recorded under the new name: a restart keeps it.
    let node = world.reopen(node, "node-a");
    assert_eq!(
        node.service.reconcile_blocks().await.unwrap(),
        crate::claims::networks::BlockReconcile::default()
    );
    leases_in_owned_blocks(&node).unwrap();
}

/// F1 of the IPAM simulation (seed 325): a block create that took effect in the API but
/// whose answer was lost left a block with this node's name that the node did not know,
/// until a restart. The next upkeep pass (after one whose list failed) adopts it as an empty
/// block, and the idle release deletes it after the grace.
#[tokio::test]
async fn a_block_whose_create_answer_was_lost_is_adopted_by_the_next_upkeep_and_released() {
    let world = World::new();
    let node = world.node("node-a");
    world.blocks.lost_create_answers.store(true, Ordering::SeqCst);
    world.prepare(&node, "node-a", "a", json!({})).await.unwrap_err();
    world.blocks.lost_create_answers.store(false, Ordering::SeqCst);
    let created: Vec<String> =
        world.blocks.all().iter().filter_map(|b| b.metadata.name.clone()).collect();
    assert_eq!(created.len(), 1, "the create took effect: {created:?}");
    assert!(node.service.owned_blocks().is_empty(), "the node does not know it yet");
    // A pass whose list fails keeps the name uncertain.
    world.blocks.failing_lists.store(true, Ordering::SeqCst);
    node.service.release_idle_blocks().await;
    world.blocks.failing_lists.store(false, Ordering::SeqCst);
    assert!(node.service.owned_blocks().is_empty());
    let upkeep = node.service.release_idle_blocks().await;
    assert!(upkeep.released.is_empty(), "adopted empty, inside the grace: {upkeep:?}");
    let owned: Vec<String> = node.service.owned_blocks().into_iter().map(|b| b.name).collect();
    assert_eq!(owned, created, "adopted by the upkeep");
    world.clock.advance(Duration::from_mins(11));
    let upkeep = node.service.release_idle_blocks().await;
    assert_eq!(upkeep.released, created, "released after the grace");
    assert!(world.blocks.all().is_empty(), "no block left in the API");
    assert!(node.service.owned_blocks().is_empty());
}

#[tokio::test]
async fn a_node_that_loses_more_races_than_one_list_allows_lists_again_and_gets_a_block() {
    let world = World::new();
    // 20 blocks claimed by another node between this node's list and its creates: more
    // than one list's 16 lost races.
    world.blocks.raced_by_others.store(20, Ordering::SeqCst);
    let node = world.node("node-a");
    let addresses = world.prepare(&node, "node-a", "a", json!({})).await.unwrap();
    assert_eq!(addresses.len(), 2, "{addresses:?}");
    let theirs = world.blocks.all().iter().filter(|b| b.spec.node_name == "node-z").count();
    assert_eq!(theirs, 20);
    assert!(world.blocks.lists.load(Ordering::SeqCst) >= 2, "listed again");
    leases_in_owned_blocks(&node).unwrap();
}

#[tokio::test]
async fn a_claim_that_keeps_losing_races_fails_naming_the_contention_not_a_full_network() {
    let world = World::new();
    world.blocks.raced_by_others.store(usize::MAX, Ordering::SeqCst);
    let node = world.node("node-a");
    let lists_before = world.blocks.lists.load(Ordering::SeqCst);
    let refused = world.prepare(&node, "node-a", "a", json!({})).await.unwrap_err();
    // Four lists, each followed by 17 lost races.
    assert!(refused.contains("no free IPv4 /26 block"), "{refused}");
    assert!(refused.contains("(68 candidate blocks taken by other nodes"), "{refused}");
    assert_eq!(world.blocks.lists.load(Ordering::SeqCst) - lists_before, 4);
    assert!(node.service.owned_blocks().is_empty());
}
