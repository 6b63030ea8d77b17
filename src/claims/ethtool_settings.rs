//! `ethtool` settings of exclusive devices in the claim service (DESIGN §3, §6): checked on
//! the device and applied at prepare after a durable snapshot of what they replace, set
//! back at unprepare (in the same boot only), when a prepare is undone, or at the next start
//! for a prepare killed before its claim was recorded.
//!
//! The snapshot ([`EthtoolSnapshot`], one per host interface) is committed (synced) before
//! the first change, as the VF settings' are (`super::vf_snapshots`): the claim's record is
//! written only after the changes, so killed in between the daemon would otherwise read the
//! claim's own values as "before" on kubelet's repeated prepare. The claim's commit removes
//! it in the same batch (the store's `save_prepared`); a failed prepare and an unprepare
//! remove it once the device is set back; at start, [`ClaimService::restore_unrecorded_ethtool`]
//! sets back each device that has one and no prepared claim. Only prepares with `ethtool`
//! pay the extra `fdatasync`.

use serde::{Deserialize, Serialize};

use super::error::ClaimError;
use super::ethtool::{self, EthtoolBefore, EthtoolError, EthtoolPort};
use super::ports::{ClaimSource, ClaimStore, DeviceSource};
use super::record::PreparedClaim;
use super::service::ClaimService;
use super::state::lock;
use crate::ipam::LeaseStore;

/// A device's `ethtool` values as read before a prepare changed them, and the claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EthtoolSnapshot {
    /// The host interface (the record key).
    pub if_name: String,
    /// The boot the values were read in.
    pub boot_id: String,
    /// The claim whose prepare took it.
    pub claim_uid: String,
    /// The values before the claim.
    pub before: EthtoolBefore,
}

/// Durable [`EthtoolSnapshot`]s, one per host interface; part of the claims' store. Calls
/// block on disk I/O.
pub trait EthtoolSnapshotStore: LeaseStore {
    /// Every snapshot.
    fn load_ethtool_snapshots(&self) -> Result<Vec<EthtoolSnapshot>, Self::Error>;
    /// The snapshot of `if_name`, if there is one (no disk I/O).
    fn ethtool_snapshot(&self, if_name: &str) -> Result<Option<EthtoolSnapshot>, Self::Error>;
    /// Creates or replaces the snapshot of its interface in one synced commit.
    fn save_ethtool_snapshot(&self, snapshot: &EthtoolSnapshot) -> Result<(), Self::Error>;
    /// Removes the snapshots of `if_names` in one synced commit; without any, writes nothing.
    fn remove_ethtool_snapshots(&self, if_names: &[String]) -> Result<(), Self::Error>;
}

/// Why the devices of unrecorded prepares could not be checked at start.
#[derive(Debug, thiserror::Error)]
pub enum EthtoolSnapshotError {
    /// The store failed.
    #[error("ethtool snapshots: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The blocking task doing the store I/O failed.
    #[error("ethtool snapshots: the store task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Applies the `ethtool` settings of each device of `prepared` that has some, recording
    /// what they replace in the device. On a failure every device whose snapshot is durable
    /// (the failing one too) keeps its "before" in the record for the caller's undo
    /// ([`super::staged::StagedClaim::undo`]) to set back; the failing device's own changes
    /// are already set back.
    pub(super) async fn apply_ethtool_settings(
        &self,
        prepared: &mut PreparedClaim,
    ) -> Result<(), ClaimError> {
        for index in 0..prepared.devices.len() {
            let device = &prepared.devices[index];
            let Some(wanted) = device.ethtool.clone() else { continue };
            let (request, name) = (device.request.clone(), device.device.clone());
            let Some(port) = &self.ethtool_port else {
                return Err(ClaimError::NoEthtoolPort { request, device: name });
            };
            let port = port.as_ref();
            let fail = |source| ClaimError::Ethtool {
                request: request.clone(),
                device: name.clone(),
                source: Box::new(source),
            };
            let dev = wanted.if_name.as_str();
            let boot_id = port.boot_id().map_err(|source| fail(EthtoolError::BootId { source }))?;
            let found = ethtool::check(port, dev, &wanted.settings).await.map_err(fail)?;
            // Durable before the first change (DESIGN §6).
            let before = self.hold_ethtool_snapshot(&prepared.uid, dev, &boot_id, found).await?;
            if let Some(record) = prepared.devices[index].ethtool.as_mut() {
                record.boot_id = Some(boot_id);
                record.before = Some(before.clone());
            }
            crate::failpoint!("claims.prepare.before_ethtool_apply");
            ethtool::apply(port, dev, &wanted.settings, &before).await.map_err(fail)?;
        }
        Ok(())
    }

    /// Sets the devices of `prepared` back to the `ethtool` values found before it, when they
    /// were read in this boot, and removes their snapshots; every device is tried, the first
    /// failure is returned.
    pub(super) async fn restore_ethtool_settings(
        &self,
        prepared: &PreparedClaim,
    ) -> Result<(), ClaimError> {
        let mut first_error = None;
        let mut done = Vec::new();
        for device in &prepared.devices {
            let Some(record) = &device.ethtool else { continue };
            let Some(before) = &record.before else { continue };
            let Some(port) = &self.ethtool_port else {
                first_error.get_or_insert(ClaimError::NoEthtoolPort {
                    request: device.request.clone(),
                    device: device.device.clone(),
                });
                continue;
            };
            let port = port.as_ref();
            let outcome = match same_boot(port, record.boot_id.as_deref(), &record.if_name) {
                Ok(false) => Ok(()),
                Ok(true) => ethtool::restore(port, &record.if_name, before).await.inspect(|()| {
                    tracing::info!(dev = %record.if_name, claim = %prepared.name,
                        "ethtool values set back as found before the claim");
                }),
                Err(err) => Err(err),
            };
            match outcome {
                Ok(()) => done.push(record.if_name.clone()),
                Err(source) => {
                    first_error.get_or_insert(ClaimError::Ethtool {
                        request: device.request.clone(),
                        device: device.device.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        if let Err(err) = self.drop_ethtool_snapshots(done).await {
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Makes `found` on `dev` durable before a prepare of `claim_uid` changes it, and returns
    /// the values to keep as "before": those of a snapshot of this boot still there (an
    /// earlier prepare changed the device and was killed before recording its claim), else
    /// `found`.
    async fn hold_ethtool_snapshot(
        &self,
        claim_uid: &str,
        dev: &str,
        boot_id: &str,
        found: EthtoolBefore,
    ) -> Result<EthtoolBefore, ClaimError> {
        let store = self.store.clone();
        let snapshot = EthtoolSnapshot {
            if_name: dev.to_owned(),
            boot_id: boot_id.to_owned(),
            claim_uid: claim_uid.to_owned(),
            before: found,
        };
        tokio::task::spawn_blocking(move || {
            let snapshot = match store.ethtool_snapshot(&snapshot.if_name)? {
                // Kept from a prepare of this boot that did not complete: the device shows
                // that prepare's values now. Values it did not read are taken from `found`.
                Some(kept) if kept.boot_id == snapshot.boot_id => {
                    let mut before = snapshot.before.clone();
                    merge_kept(&mut before, &kept.before);
                    before.features.extend(kept.before.features);
                    EthtoolSnapshot { before, ..snapshot }
                }
                _ => snapshot,
            };
            store.save_ethtool_snapshot(&snapshot).map(|()| snapshot.before)
        })
        .await
        .map_err(ClaimError::Task)?
        .map_err(|e| ClaimError::Persist(Box::new(e)))
    }

    /// Removes the snapshots of `if_names`; writes nothing when none has one.
    async fn drop_ethtool_snapshots(&self, if_names: Vec<String>) -> Result<(), ClaimError> {
        if if_names.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.remove_ethtool_snapshots(&if_names))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))
    }

    /// At start, before kubelet is served: every device with a snapshot and no prepared
    /// claim holding it was changed by a prepare killed before its claim was recorded; it is
    /// set back and the snapshot removed (kubelet's repeated prepare then starts from the
    /// device as it was). A snapshot of another boot is removed without being set back. A
    /// device that cannot be set back now keeps its snapshot. Returns how many were set back.
    pub async fn restore_unrecorded_ethtool(&self) -> Result<usize, EthtoolSnapshotError> {
        let store = self.store.clone();
        let snapshots = tokio::task::spawn_blocking(move || store.load_ethtool_snapshots())
            .await
            .map_err(EthtoolSnapshotError::Task)?
            .map_err(|e| EthtoolSnapshotError::Store(Box::new(e)))?;
        let mut done = Vec::new();
        let mut restored = 0;
        for snapshot in snapshots {
            let recorded = lock(&self.state).prepared.values().any(|claim| {
                claim.devices.iter().any(|d| {
                    d.ethtool
                        .as_ref()
                        .is_some_and(|e| e.if_name == snapshot.if_name && e.before.is_some())
                })
            });
            if recorded {
                done.push(snapshot.if_name);
                continue;
            }
            let Some(port) = &self.ethtool_port else {
                tracing::warn!(dev = %snapshot.if_name, claim_uid = %snapshot.claim_uid,
                    "a prepare changed this device's ethtool values and did not complete, and ethtool is not available in this daemon: left as is");
                continue;
            };
            let port = port.as_ref();
            match same_boot(port, Some(&snapshot.boot_id), &snapshot.if_name) {
                Ok(false) => done.push(snapshot.if_name),
                Ok(true) => match ethtool::restore(port, &snapshot.if_name, &snapshot.before).await
                {
                    Ok(()) => {
                        tracing::info!(dev = %snapshot.if_name, claim_uid = %snapshot.claim_uid,
                            "ethtool values set back as found before a prepare that did not complete");
                        restored += 1;
                        done.push(snapshot.if_name);
                    }
                    Err(err) => {
                        tracing::warn!(dev = %snapshot.if_name, claim_uid = %snapshot.claim_uid,
                        error = %err, "setting back ethtool values a prepare changed and did not complete; kept for the next start");
                    }
                },
                Err(err) => tracing::warn!(dev = %snapshot.if_name, error = %err,
                    "reading the boot id for an ethtool snapshot; kept for the next start"),
            }
        }
        if !done.is_empty() {
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || store.remove_ethtool_snapshots(&done))
                .await
                .map_err(EthtoolSnapshotError::Task)?
                .map_err(|e| EthtoolSnapshotError::Store(Box::new(e)))?;
        }
        Ok(restored)
    }
}

/// Rings and channels a kept snapshot read win over the fresh reading (the device now shows
/// the interrupted prepare's values).
fn merge_kept(before: &mut EthtoolBefore, kept: &EthtoolBefore) {
    let r = &kept.rings;
    before.rings.rx = r.rx.or(before.rings.rx);
    before.rings.tx = r.tx.or(before.rings.tx);
    before.rings.rx_mini = r.rx_mini.or(before.rings.rx_mini);
    before.rings.rx_jumbo = r.rx_jumbo.or(before.rings.rx_jumbo);
    let c = &kept.channels;
    before.channels.rx = c.rx.or(before.channels.rx);
    before.channels.tx = c.tx.or(before.channels.tx);
    before.channels.other = c.other.or(before.channels.other);
    before.channels.combined = c.combined.or(before.channels.combined);
}

/// Whether values read in boot `recorded` may be set back now; `false` (logged) for
/// another boot or none.
fn same_boot(
    port: &dyn EthtoolPort,
    recorded: Option<&str>,
    dev: &str,
) -> Result<bool, EthtoolError> {
    let boot = port.boot_id().map_err(|source| EthtoolError::BootId { source })?;
    if recorded == Some(boot.as_str()) {
        return Ok(true);
    }
    tracing::info!(
        dev,
        recorded_boot = recorded.unwrap_or("unknown"),
        boot,
        "ethtool values read before the claim are of another boot: not set back, the device keeps what this boot configured"
    );
    Ok(false)
}
