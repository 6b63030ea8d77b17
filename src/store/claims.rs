//! Prepared claims in the store: one record per claim UID, loaded at start so a restarted
//! daemon still knows what it prepared (kubelet repeats prepare and unprepare after
//! restarts and expects the same answers).

use std::sync::Arc;

use super::{Record, Store, StoreError};
use crate::claims::{ClaimStore, PreparedClaim};

impl Record for PreparedClaim {
    const KIND: &'static str = "prepared-claims";
    const VERSION: u32 = 1;
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

    fn save_claim(&self, claim: &PreparedClaim) -> Result<(), StoreError> {
        self.put(&claim.uid, claim)
    }

    fn remove_claim(&self, uid: &str) -> Result<(), StoreError> {
        self.remove::<PreparedClaim>(uid).map(|_| ())
    }
}
