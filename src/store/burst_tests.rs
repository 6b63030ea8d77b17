//! Group commit under a burst of prepares (issue 36): kubelet prepares each pod in a call of
//! its own, concurrently, so 100 single-claim prepares whose API reads end at different
//! moments must share a few `fdatasync`s, every answer must come after its records are on
//! disk, and a failed shared `fdatasync` must fail every commit it carried.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::Store;
use super::claims::tests::{any_claim, eth2};
use super::sim_disk::{SimDisk, SimOp};
use crate::claims::{ClaimPreparer, ClaimService, ClaimSource, ReadError, ServiceIdentity};
use crate::model::ClaimRef;
use crate::testing::claims::MapClaims;
use crate::testing::devices::FixedDevices;

/// Claims made up from their names; the GET of claim `c<i>` ends `i` × `step` after it
/// started, so the prepares of a burst reach their commits one after the other, as their
/// API reads end, not all at once.
struct Staggered {
    claims: MapClaims,
    step: Duration,
}

impl ClaimSource for Staggered {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ReadError> {
        let index: u32 = name.trim_start_matches('c').parse().unwrap_or(0);
        tokio::time::sleep(self.step * index).await;
        self.claims.get(namespace, name).await
    }

    async fn pod_claim_names(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<Vec<String>>, ReadError> {
        self.claims.pod_claim_names(namespace, pod).await
    }
}

type Service = ClaimService<Staggered, FixedDevices, Arc<Store>>;

fn open(disk: &SimDisk) -> Arc<Store> {
    Arc::new(Store::open_on(Arc::new(disk.clone()), PathBuf::from("/state")).unwrap())
}

/// [`open`] with a group commit leader that waits up to `window` for announced commits.
fn open_collecting_for(disk: &SimDisk, window: Duration) -> Arc<Store> {
    let mut store = Store::open_on(Arc::new(disk.clone()), PathBuf::from("/state")).unwrap();
    store.set_collect_window(window);
    Arc::new(store)
}

fn service(store: &Arc<Store>, step: Duration) -> Arc<Service> {
    let identity = ServiceIdentity { driver: "netclaim.dev".into(), node: "n".into() };
    let claims = MapClaims::made_by(|namespace, name| Some(any_claim(namespace, name)));
    Arc::new(
        ClaimService::load(identity, Staggered { claims, step }, eth2(), Arc::clone(store))
            .unwrap(),
    )
}

fn reference(i: usize) -> ClaimRef {
    let name = format!("c{i}");
    ClaimRef { namespace: "ns".into(), name: name.clone(), uid: name }
}

/// `count` single-claim prepare calls at once, as kubelet's pod workers send them; each
/// call's answer for its claim.
async fn burst(service: &Arc<Service>, count: usize) -> Vec<Result<(), String>> {
    let calls = (0..count).map(|i| {
        let service = Arc::clone(service);
        tokio::spawn(async move {
            let claim = reference(i);
            let mut answers = service.prepare(vec![claim.clone()]).await;
            match answers.remove(&claim.uid) {
                Some(Ok(_)) => Ok(()),
                Some(Err(failure)) => Err(failure.message),
                None => Err("unanswered".to_owned()),
            }
        })
    });
    let mut answers = Vec::with_capacity(count);
    for call in futures::future::join_all(calls).await {
        answers.push(call.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_single_claim_prepares_shares_at_most_10_fdatasyncs_and_loses_nothing() {
    // The simulated disk syncs at once, so syncs never group by taking long: only the
    // collection of announced commits does. The reads end over ~20 ms (0.2 ms apart):
    // without it every prepare would sync alone. The collection window is long here: on a
    // loaded machine (CI runs this beside two QEMU guests) the burst's reads spread over far
    // more than 20 ms, and the window, which only bounds what one slow prepare costs the
    // others, would then end collections that the group's size is meant to end.
    let disk = SimDisk::new(36);
    let store = open_collecting_for(&disk, Duration::from_secs(5));
    let service = service(&store, Duration::from_micros(200));
    let before = store.syncs();
    let answers = burst(&service, 100).await;
    let syncs = store.syncs() - before;
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer, &Ok(()), "claim c{i}");
    }
    assert!(syncs <= 10, "100 concurrent prepares cost {syncs} fdatasyncs");
    assert!(syncs >= 1, "nothing was synced");
    // Every answered prepare is on disk: power loss keeps only what was synced.
    drop(service);
    drop(store);
    disk.power_loss();
    let store = open(&disk);
    let claims = crate::claims::ClaimStore::load_claims(&store).unwrap();
    assert_eq!(claims.len(), 100, "prepares answered but lost");
    let leases = crate::ipam::LeaseStore::load_leases(&store).unwrap();
    assert_eq!(leases.len(), 100, "leases answered but lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shared_fdatasync_fails_every_prepare_it_carried_and_answers_none() {
    let disk = SimDisk::new(37);
    let store = open(&disk);
    // All reads end together: the commits reach the store at once and share syncs.
    let service = service(&store, Duration::ZERO);
    disk.fail(SimOp::SyncData, 1, nix::libc::EIO);
    let before = disk.syncs_done();
    let answers = burst(&service, 20).await;
    for (i, answer) in answers.iter().enumerate() {
        let err = answer.as_ref().expect_err(&format!("claim c{i} answered success"));
        assert!(err.contains("fdatasync") || err.contains("restart to recover"), "c{i}: {err}");
        assert!(service.prepared(&reference(i).uid).is_none(), "c{i} prepared");
    }
    assert_eq!(disk.syncs_done() - before, 1, "one fdatasync failed, none was retried");
    assert!(store.is_poisoned());
    assert!(service.leased_per_pool().values().all(|n| *n == 0), "addresses kept");
}
