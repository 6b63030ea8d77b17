//! IPAM state in the store: one record per leased address (so one address can never be
//! persisted for two claims), one per released address in quarantine, one per owned block.

use std::sync::Arc;

use super::{Batch, Record, Store, StoreError};
use crate::ipam::{BlockRelease, IpamCommit, Lease, LeaseStore, OwnedBlock, ReleasedAddress};

impl Record for Lease {
    const KIND: &'static str = "ipam-leases";
    /// 2: `podNetwork` and `block` (optional; absent in version 1: a node-local pool or
    /// static lease).
    const VERSION: u32 = 2;

    fn migrate(from: u32, data: serde_json::Value) -> Result<serde_json::Value, String> {
        match from {
            // The fields added since are optional: an older record is a valid current one.
            1 => Ok(data),
            _ => Err(format!("no migration from version {from}")),
        }
    }
}

impl Record for ReleasedAddress {
    const KIND: &'static str = "ipam-released";
    const VERSION: u32 = 1;
}

impl Record for OwnedBlock {
    const KIND: &'static str = "ipam-blocks";
    const VERSION: u32 = 1;
}

/// The intent to delete an owned block, keyed by the block's name; written before the
/// delete, removed with the block's record (decision 0017).
impl Record for BlockRelease {
    const KIND: &'static str = "ipam-block-releases";
    const VERSION: u32 = 1;
}

/// The record key of a lease: its address (unique across all pools).
pub(super) fn lease_key(lease: &Lease) -> String {
    lease.address.to_string()
}

/// Adds `changes` to `batch`.
pub(super) fn add_ipam(batch: &mut Batch, changes: &IpamCommit) -> Result<(), StoreError> {
    for lease in &changes.remove_leases {
        batch.remove::<Lease>(&lease_key(lease))?;
    }
    for lease in &changes.put_leases {
        batch.put(&lease_key(lease), lease)?;
    }
    for released in &changes.remove_released {
        batch.remove::<ReleasedAddress>(&released.key())?;
    }
    for released in &changes.put_released {
        batch.put(&released.key(), released)?;
    }
    for name in &changes.remove_blocks {
        batch.remove::<OwnedBlock>(name)?;
        batch.remove::<BlockRelease>(name)?;
    }
    for block in &changes.put_blocks {
        batch.put(&block.name, block)?;
    }
    for release in &changes.releasing_blocks {
        batch.put(&release.name, release)?;
    }
    Ok(())
}

/// Every record of a kind whose key is derived from its content, checked.
fn load_keyed<R: Record>(
    store: &Store,
    key_of: impl Fn(&R) -> String,
) -> Result<Vec<R>, StoreError> {
    store
        .load_all::<R>()?
        .into_iter()
        .map(|(key, record)| {
            if key == key_of(&record) {
                Ok(record)
            } else {
                Err(StoreError::KeyMismatch { kind: R::KIND, key })
            }
        })
        .collect()
}

impl Store {
    /// Commits IPAM changes alone, durably.
    pub fn commit_ipam(&self, changes: &IpamCommit) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        add_ipam(&mut batch, changes)?;
        self.commit(batch)
    }
}

impl LeaseStore for Store {
    type Error = StoreError;

    fn load_leases(&self) -> Result<Vec<Lease>, StoreError> {
        load_keyed(self, lease_key)
    }

    fn load_released(&self) -> Result<Vec<ReleasedAddress>, StoreError> {
        load_keyed(self, ReleasedAddress::key)
    }

    fn load_blocks(&self) -> Result<Vec<OwnedBlock>, StoreError> {
        load_keyed(self, |b: &OwnedBlock| b.name.clone())
    }

    fn load_block_releases(&self) -> Result<Vec<BlockRelease>, StoreError> {
        load_keyed(self, |r: &BlockRelease| r.name.clone())
    }

    fn save_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        self.put(&lease_key(lease), lease)
    }

    fn remove_lease(&self, lease: &Lease, released: &ReleasedAddress) -> Result<(), StoreError> {
        self.commit_ipam(&IpamCommit {
            remove_leases: vec![lease.clone()],
            put_released: vec![released.clone()],
            ..IpamCommit::default()
        })
    }
}

/// The daemon shares one store between record kinds.
impl LeaseStore for Arc<Store> {
    type Error = StoreError;

    fn load_leases(&self) -> Result<Vec<Lease>, StoreError> {
        self.as_ref().load_leases()
    }

    fn load_released(&self) -> Result<Vec<ReleasedAddress>, StoreError> {
        self.as_ref().load_released()
    }

    fn load_blocks(&self) -> Result<Vec<OwnedBlock>, StoreError> {
        self.as_ref().load_blocks()
    }

    fn load_block_releases(&self) -> Result<Vec<BlockRelease>, StoreError> {
        self.as_ref().load_block_releases()
    }

    fn save_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        self.as_ref().save_lease(lease)
    }

    fn remove_lease(&self, lease: &Lease, released: &ReleasedAddress) -> Result<(), StoreError> {
        self.as_ref().remove_lease(lease, released)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;
    use std::net::IpAddr;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::ipam::{Ipam, IpamError, LeaseOwner};
    use crate::model::network_config::PoolSpec;

    fn pool() -> PoolSpec {
        PoolSpec {
            subnet: "10.77.0.0/20".parse().unwrap(),
            range_start: "10.77.0.1".parse().unwrap(),
            range_end: "10.77.15.254".parse().unwrap(),
            gateway: Some("10.77.0.1".parse().unwrap()),
            exclude: vec!["10.77.0.8/29".parse().unwrap()],
        }
    }

    fn owner(uid: &str) -> LeaseOwner {
        LeaseOwner {
            claim_uid: uid.into(),
            request: "nic".into(),
            device: "eth1".into(),
            share_id: Some("3f1c0c3e-0000-4000-8000-000000000001".into()),
        }
    }

    #[test]
    fn leases_survive_a_restart_and_keep_their_address() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = {
            let mut ipam = Ipam::load(Store::open(dir.path()).unwrap()).unwrap();
            let a = ipam.reserve(&owner("a"), &pool()).unwrap();
            let b = ipam.reserve(&owner("b"), &pool()).unwrap();
            ipam.release(&owner("a")).unwrap();
            (a, b)
        };
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let mut ipam = Ipam::load(Arc::clone(&store)).unwrap();
        assert_eq!(ipam.leases().cloned().collect::<Vec<_>>(), vec![b.clone()]);
        assert_eq!(ipam.reserve(&owner("b"), &pool()).unwrap(), b);
        assert_ne!(
            ipam.reserve(&owner("c"), &pool()).unwrap().address,
            a.address,
            "a's address is quarantined for 30 s, across the restart too"
        );
        // The journal is readable JSON: the lease is keyed by its address.
        let text = std::fs::read_to_string(dir.path().join("journal")).unwrap();
        assert!(text.contains(r#""kind":"ipam-leases","key":"10.77.0.3""#), "{text}");
        assert!(text.contains(r#""claimUid":"b""#), "{text}");
    }

    #[test]
    fn a_lease_stored_under_another_address_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let lease = Lease::new(pool().subnet, "10.77.0.5".parse().unwrap(), owner("x"));
        store.put("10.77.0.6", &lease).unwrap();
        let err = Ipam::load(store).expect_err("key mismatch");
        assert!(matches!(err, IpamError::Load { .. }), "{err}");
    }

    const CHILD_ENV: &str = "NETCLAIM_IPAM_CRASH_CHILD_DIR";
    const ROUND_ENV: &str = "NETCLAIM_IPAM_CRASH_ROUND";

    /// The child: reserves for new claims and releases older ones, printing `ack`/`rel`
    /// only after the call returned.
    fn ipam_writer(dir: &str, round: &str) {
        let mut ipam = Ipam::load(Store::open(dir).expect("open")).expect("load");
        let deadline = Instant::now() + Duration::from_secs(20);
        let stdout = std::io::stdout();
        let mut i = 0u64;
        while Instant::now() < deadline {
            let uid = format!("r{round}-{i}");
            let lease = ipam.reserve(&owner(&uid), &pool()).expect("reserve");
            writeln!(stdout.lock(), "ack {uid} {}", lease.address).expect("stdout");
            if i >= 3 && i.is_multiple_of(2) {
                let old = format!("r{round}-{}", i - 3);
                writeln!(stdout.lock(), "releasing {old}").expect("stdout");
                ipam.release_claim(&old).expect("release");
                writeln!(stdout.lock(), "rel {old}").expect("stdout");
            }
            i += 1;
        }
    }

    #[test]
    fn kill_9_never_gives_one_address_to_two_claims() {
        if let (Ok(dir), Ok(round)) = (std::env::var(CHILD_ENV), std::env::var(ROUND_ENV)) {
            ipam_writer(&dir, &round);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut live: HashMap<String, IpAddr> = HashMap::new();
        // Releases in flight at the kill: the lease may or may not be gone.
        let mut releasing: HashMap<String, IpAddr> = HashMap::new();
        let mut acks = 0;
        let mut rng = fastrand::Rng::with_seed(0x1ea5e);
        for round in 0..30 {
            let envs = [
                (CHILD_ENV, dir.path().to_string_lossy().into_owned()),
                (ROUND_ENV, round.to_string()),
            ];
            let (lines, _) = crate::store::tests::run_child_and_kill(
                "store::leases::tests::kill_9_never_gives_one_address_to_two_claims",
                &envs,
                crate::store::tests::KillAt::AfterFirstAck(rng.u64(0..60_000)),
            );
            for line in lines {
                let parts: Vec<&str> = line.split_whitespace().collect();
                match parts.as_slice() {
                    ["ack", uid, addr] => {
                        acks += 1;
                        live.insert((*uid).to_owned(), addr.parse().unwrap());
                    }
                    ["releasing", uid] => {
                        let addr = live.remove(*uid).expect("releasing an acked claim");
                        releasing.insert((*uid).to_owned(), addr);
                    }
                    ["rel", uid] => {
                        releasing.remove(*uid);
                    }
                    _ => {}
                }
            }
            // Load refuses two leases for one address; every acknowledged, unreleased
            // reservation is there with its address; no claim holds two addresses.
            let ipam = Ipam::load(Store::open(dir.path()).unwrap())
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            for (uid, addr) in &live {
                let lease = ipam.lease_of(&owner(uid), pool().subnet);
                assert_eq!(
                    lease.map(|l| l.address),
                    Some(*addr),
                    "round {round}: lease of {uid} lost"
                );
            }
            for (uid, addr) in &releasing {
                let lease = ipam.lease_of(&owner(uid), pool().subnet).map(|l| l.address);
                assert!(
                    lease.is_none() || lease == Some(*addr),
                    "round {round}: {uid} moved to {lease:?}"
                );
            }
            let mut per_claim: HashMap<&str, usize> = HashMap::new();
            for lease in ipam.leases() {
                *per_claim.entry(lease.owner.claim_uid.as_str()).or_default() += 1;
                assert!(
                    crate::ipam::pool::is_allocatable(&pool(), lease.address),
                    "round {round}: {lease:?}"
                );
            }
            assert!(
                per_claim.values().all(|n| *n == 1),
                "round {round}: a claim holds two addresses"
            );
        }
        eprintln!(
            "ipam crash test: 30 rounds, {acks} acknowledged reservations, {} live",
            live.len()
        );
        assert!(acks >= 30, "children reserved too little to test anything: {acks}");
    }
}
