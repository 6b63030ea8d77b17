//! Prepared claims in the store: one record per claim UID, loaded at start so a restarted
//! daemon still knows what it prepared (kubelet repeats prepare and unprepare after
//! restarts and expects the same answers).

use std::sync::Arc;

use super::ethtool_snapshots::add_ethtool_snapshot_removals;
use super::leases::add_ipam;
use super::vf_snapshots::add_vf_snapshot_removals;
use super::{Batch, Record, Store, StoreError};
use crate::claims::{ClaimStore, PreparedClaim};
use crate::ipam::IpamCommit;

impl Record for PreparedClaim {
    const KIND: &'static str = "prepared-claims";
    /// 2: `podClaimIndex` (optional; absent in version 1, which reads as unknown order).
    /// 3: `podClaimName`, and per device `attributes` and `cdiDeviceIds` (device metadata;
    /// all optional: an older record is a claim prepared without metadata).
    /// 4: addressing `network` (a `PodNetwork`'s plan; older records never have it).
    /// 5: per device `vf` (mode `sriov-vf`: the VF and its settings before the claim, set
    /// back at unprepare), and `sriov.vlanProtocol` in the resolved config. No release before
    /// prepared `sriov-vf` (it refused the mode), so an older record has neither.
    /// 6 (state format 3): per device `vf.pci` and `vf.bootId` (the VF by PCI address, the
    /// boot its "before" values were read in) and `vf.unresolved`. A version-5 record has
    /// neither: the claims service looks the PCI address up from the PF name and index at
    /// start (`ClaimService::restore_unrecorded_vfs`), where the port is.
    const VERSION: u32 = 6;

    fn migrate(from: u32, data: serde_json::Value) -> Result<serde_json::Value, String> {
        match from {
            // Every field added since is optional: an older record is a valid current one.
            1..=5 => Ok(data),
            _ => Err(format!("no migration from version {from}")),
        }
    }
}

impl ClaimStore for Arc<Store> {
    fn load_claims(&self) -> Result<Vec<PreparedClaim>, StoreError> {
        self.load_all::<PreparedClaim>()?
            .into_iter()
            .map(|(key, claim)| {
                if key == claim.uid {
                    Ok(claim)
                } else {
                    Err(StoreError::KeyMismatch { kind: PreparedClaim::KIND, key })
                }
            })
            .collect()
    }

    fn save_prepared(
        &self,
        claims: &[&PreparedClaim],
        ipam: &IpamCommit,
    ) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        add_ipam(&mut batch, ipam)?;
        for claim in claims {
            batch.put(&claim.uid, *claim)?;
            add_vf_snapshot_removals(self, &mut batch, claim)?;
            add_ethtool_snapshot_removals(self, &mut batch, claim)?;
        }
        self.commit(batch)
    }

    fn remove_prepared(&self, uid: &str, ipam: &IpamCommit) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        batch.remove::<PreparedClaim>(uid)?;
        add_ipam(&mut batch, ipam)?;
        self.commit(batch)
    }

    fn commit_ipam(&self, ipam: &IpamCommit) -> Result<(), StoreError> {
        self.as_ref().commit_ipam(ipam)
    }

    fn announce_commit(&self) -> crate::claims::ports::CommitNotice {
        Box::new(Store::announce_commit(self))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::{HashMap, HashSet};
    use std::io::Write;
    use std::net::IpAddr;
    use std::time::{Duration, Instant};

    use k8s_openapi::api::resource::v1::ResourceClaim;
    use serde_json::json;

    use super::*;
    use crate::claims::ClaimPreparer;
    use crate::claims::{ClaimService, ServiceIdentity};
    use crate::model::ClaimRef;
    use crate::store::tests::{KillAt, run_child_and_kill};
    use crate::testing::claims::MapClaims;
    use crate::testing::devices::{FixedDevices, if_name_attribute};
    use crate::testing::facts::{FactsBuilder as _, physical_nic};

    /// Every claim is allocated `eth2` (a shared parent) with a pool; its UID is its name.
    pub(in crate::store) fn any_claim(namespace: &str, name: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name, "uid": name},
            "spec": {},
            "status": {"allocation": {"devices": {
                "results": [{"request": "nic", "driver": "netclaim.dev", "pool": "n", "device": "eth2"}],
                "config": [{"source": "FromClaim", "opaque": {"driver": "netclaim.dev", "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "mode": "macvlan",
                    "ipam": {"pool": {"subnet": "10.88.0.0/16"}}
                }}}]
            }}}
        }))
        .expect("a valid claim")
    }

    /// Whatever the device, `eth2`: a shared parent.
    pub(in crate::store) fn eth2() -> FixedDevices {
        FixedDevices::any(physical_nic("eth2").shared(), if_name_attribute("eth2"))
    }

    type Service = ClaimService<MapClaims, FixedDevices, Arc<Store>>;

    fn load(dir: &str) -> Service {
        let identity = ServiceIdentity { driver: "netclaim.dev".into(), node: "n".into() };
        ClaimService::load(
            identity,
            MapClaims::made_by(|namespace, name| Some(any_claim(namespace, name))),
            eth2(),
            Arc::new(Store::open(dir).expect("open")),
        )
        .expect("load")
    }

    fn reference(uid: &str) -> ClaimRef {
        ClaimRef { namespace: "ns".into(), name: uid.into(), uid: uid.into() }
    }

    fn address_of(service: &Service, uid: &str) -> Option<IpAddr> {
        service.prepared(uid).map(|c| c.devices[0].addresses[0].ip())
    }

    const CHILD_ENV: &str = "NETCLAIM_CLAIMS_CRASH_CHILD_DIR";
    const ROUND_ENV: &str = "NETCLAIM_CLAIMS_CRASH_ROUND";

    /// The child: prepares new claims and unprepares older ones through the real service,
    /// printing `ack`/`rel` only after the call returned.
    fn claims_writer(dir: &str, round: &str) {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let service = load(dir);
            let deadline = Instant::now() + Duration::from_secs(20);
            let stdout = std::io::stdout();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let uid = format!("r{round}-{i}");
                let mut results = service.prepare(vec![reference(&uid)]).await;
                results.remove(&uid).expect("answered").expect("prepared");
                let address = address_of(&service, &uid).expect("stored");
                writeln!(stdout.lock(), "ack {uid} {address}").expect("stdout");
                if i >= 3 && i.is_multiple_of(2) {
                    let old = format!("r{round}-{}", i - 3);
                    writeln!(stdout.lock(), "releasing {old}").expect("stdout");
                    let mut results = service.unprepare(vec![reference(&old)]).await;
                    results.remove(&old).expect("answered").expect("unprepared");
                    writeln!(stdout.lock(), "rel {old}").expect("stdout");
                }
                i += 1;
            }
        });
    }

    #[test]
    fn kill_9_while_preparing_keeps_claims_and_leases_whole() {
        if let (Ok(dir), Ok(round)) = (std::env::var(CHILD_ENV), std::env::var(ROUND_ENV)) {
            claims_writer(&dir, &round);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dir_name = dir.path().to_string_lossy().into_owned();
        let mut live: HashMap<String, IpAddr> = HashMap::new();
        let mut releasing: HashMap<String, IpAddr> = HashMap::new();
        let mut acks = 0;
        let mut rng = fastrand::Rng::with_seed(0xc1a1);
        for round in 0..20 {
            let envs = [(CHILD_ENV, dir_name.clone()), (ROUND_ENV, round.to_string())];
            let (lines, _) = run_child_and_kill(
                "store::claims::tests::kill_9_while_preparing_keeps_claims_and_leases_whole",
                &envs,
                KillAt::AfterFirstAck(rng.u64(0..60_000)),
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
            // The restarted service knows every acknowledged claim with its address; an
            // unprepare in flight is either done or not; no address is held twice, and
            // every lease belongs to a prepared claim (half-prepared ones were cleaned up).
            let service = load(&dir_name);
            for (uid, addr) in &live {
                assert_eq!(address_of(&service, uid), Some(*addr), "round {round}: {uid} lost");
            }
            for (uid, addr) in &releasing {
                let found = address_of(&service, uid);
                assert!(found.is_none() || found == Some(*addr), "round {round}: {uid} {found:?}");
            }
            let uids = service.prepared_uids();
            let addresses: HashSet<IpAddr> =
                uids.iter().filter_map(|uid| address_of(&service, uid)).collect();
            assert_eq!(addresses.len(), uids.len(), "round {round}: an address held twice");
            let store = Store::open(&dir_name);
            assert!(store.is_err(), "the service still holds the state dir lock");
            drop(service);
            let store = Arc::new(Store::open(&dir_name).unwrap());
            let leases = crate::ipam::LeaseStore::load_leases(&store).unwrap();
            assert_eq!(
                leases.len(),
                uids.len(),
                "round {round}: leases {leases:?} vs claims {uids:?}"
            );
            assert!(leases.iter().all(|l| uids.contains(&l.owner.claim_uid)), "round {round}");
            // Releasing the claims of a `releasing` entry that survived keeps `live` exact.
            for uid in &uids {
                if let Some(addr) = releasing.remove(uid) {
                    live.insert(uid.clone(), addr);
                }
            }
            releasing.clear();
        }
        eprintln!(
            "claims crash test: 20 rounds, {acks} acknowledged prepares, {} live",
            live.len()
        );
        assert!(acks >= 20, "children prepared too little to test anything: {acks}");
    }
}
