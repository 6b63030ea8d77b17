//! `sriov-vf` settings across reboots (DESIGN §6, decision 0018): kernel state does not
//! survive a reboot, the state dir does, and kubelet answers a repeated prepare from our
//! record, so settings applied only at prepare would be gone: the VF would reach the pod
//! untagged, with spoof checking at the driver's default.
//!
//! - [`ClaimService::reapply_vf_settings`]: the attach calls it each time it moves a VF into
//!   a pod. It reads the VF back and sends only what differs (a no-op costs no netlink
//!   write); after a reboot it first records the values the boot gave the VF as the ones to
//!   set back at unprepare, with the new boot id.
//! - [`ClaimService::migrate_vf_records`]: at start, the records of a release before state
//!   format 3 (VFs by PF name and index, no boot id) get their PCI address.

use super::error::ClaimError;
use super::ports::{ClaimSource, ClaimStore, DeviceSource};
use super::record::{PreparedClaim, PreparedVf};
use super::service::ClaimService;
use super::state::lock;
use super::vf::{self, VfError, VfPort};
use super::vf_snapshots::VfSnapshotError;
use crate::ipam::IpamCommit;

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Makes the VF of request `request` of claim `claim_uid` carry the claim's settings,
    /// right before the attach moves it into the pod; nothing for a device without a VF
    /// record (not `sriov-vf`). The VF is found by its PCI address. Values found in another
    /// boot than the record's are the boot's own: they become the values to set back at
    /// unprepare (recorded, synced) before the first change.
    ///
    /// # Errors
    /// The VF cannot be found or read, or the PF refuses a setting (the error names the
    /// field): the attach fails rather than hand the pod a VF without its VLAN or spoof
    /// checking.
    pub async fn reapply_vf_settings(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> Result<(), ClaimError> {
        self.serialised(claim_uid, async {
            let found = lock(&self.state).prepared.get(claim_uid).and_then(|claim| {
                let index = claim.devices.iter().position(|d| d.request == request)?;
                let done = claim.devices[index].vf.clone()?;
                Some((claim.clone(), index, done))
            });
            let Some((claim, index, done)) = found else { return Ok(()) };
            let device = &claim.devices[index];
            let vf_error = |source: VfError| ClaimError::Vf {
                request: device.request.clone(),
                device: device.device.clone(),
                source: Box::new(source),
            };
            let Some(port) = &self.vf_port else {
                return Err(ClaimError::NoVfPort {
                    request: device.request.clone(),
                    device: device.device.clone(),
                });
            };
            let port = port.as_ref();
            let Some(pci) = done.pci.filter(|_| !done.unresolved) else {
                return Err(vf_error(VfError::Unidentified { vf: done.vf }));
            };
            let what = || format!("the VF at PCI {pci}");
            let now = match port.locate(pci).await {
                Ok(Some(now)) => now,
                Ok(None) => return Err(vf_error(VfError::NotFound { what: what() })),
                Err(source) => return Err(vf_error(VfError::Locate { what: what(), source })),
            };
            let boot = port.boot_id().map_err(|source| vf_error(VfError::BootId { source }))?;
            let before = if done.boot_id.as_deref() == Some(boot.as_str()) {
                done.before
            } else {
                let current = port
                    .read(&now)
                    .await
                    .map_err(|source| vf_error(VfError::Read { vf: now.clone(), source }))?;
                let mut updated = claim.clone();
                updated.devices[index].vf = Some(PreparedVf {
                    vf: now.clone(),
                    pci: Some(pci),
                    boot_id: Some(boot.clone()),
                    unresolved: false,
                    before: current,
                });
                self.save_claim_record(updated).await?;
                tracing::info!(vf = %now, %pci, claim = %claim.name,
                    recorded_boot = done.boot_id.as_deref().unwrap_or("unknown"), boot,
                    "the node rebooted since the claim's VF values were read: the values this boot gave the VF are now the ones set back at unprepare");
                current
            };
            // The VF's netdev by its PCI address too: the name recorded at prepare may be
            // another's after a reboot (udev, PF renames), and the MAC must reach this VF.
            let netdev = match port.netdev(pci).await {
                Ok(Some(name)) => name,
                Ok(None) => device.if_name.clone(),
                Err(source) => return Err(vf_error(VfError::Locate { what: what(), source })),
            };
            let wanted = vf::wanted(&before, &device.config);
            vf::apply(port, &now, &netdev, &wanted)
                .await
                .map_err(|err| vf_error(vf::name_ceiling(err, &device.config)))?;
            Ok(())
        })
        .await
    }

    /// The name the netdev of the VF of request `request` of claim `claim_uid` has now in
    /// the host netns, found by the VF's PCI address; `None` for a device without a VF
    /// record of this release (its recorded name is all there is) or a VF without a netdev
    /// here. The attach moves the VF by this name: the one recorded at prepare may be
    /// another device's after a reboot.
    ///
    /// # Errors
    /// Sysfs cannot be read.
    pub async fn vf_netdev_name(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> Result<Option<String>, ClaimError> {
        let device = lock(&self.state)
            .prepared
            .get(claim_uid)
            .and_then(|claim| claim.devices.iter().find(|d| d.request == request).cloned());
        let Some(device) = device else { return Ok(None) };
        let Some(pci) = device.vf.and_then(|done| done.pci.filter(|_| !done.unresolved)) else {
            return Ok(None);
        };
        let Some(port) = &self.vf_port else { return Ok(None) };
        port.netdev(pci).await.map_err(|source| ClaimError::Vf {
            request: device.request.clone(),
            device: device.device.clone(),
            source: Box::new(VfError::Locate {
                what: format!("the netdev of the VF at PCI {pci}"),
                source,
            }),
        })
    }

    /// Replaces a prepared claim's record (durably, then in memory).
    async fn save_claim_record(&self, claim: PreparedClaim) -> Result<(), ClaimError> {
        let store = self.store.clone();
        let saved = claim.clone();
        tokio::task::spawn_blocking(move || store.save_prepared(&[&saved], &IpamCommit::default()))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))?;
        lock(&self.state).add_prepared(claim);
        Ok(())
    }

    /// At start (from [`Self::restore_unrecorded_vfs`]): gives each VF record of a release
    /// before state format 3 (PF name and index, no PCI address, no boot id) the PCI address
    /// the PF's `virtfn<index>` names now. Its "before" values get this boot's id only if the
    /// VF still carries the claim's settings (nothing reset it since, so they are still the
    /// values of this VF in this boot); otherwise they are of an earlier boot and are never
    /// set back (the next attach records the boot's values instead). A VF that cannot be
    /// found keeps its record marked `unresolved`: never set back, never re-applied (an
    /// attach of it fails naming the reason), logged. Returns how many records changed.
    pub(super) async fn migrate_vf_records(
        &self,
        port: &dyn VfPort,
    ) -> Result<usize, VfSnapshotError> {
        let legacy: Vec<PreparedClaim> = lock(&self.state)
            .prepared
            .values()
            .filter(|claim| claim.devices.iter().any(|d| d.vf.as_ref().is_some_and(is_legacy)))
            .cloned()
            .collect();
        if legacy.is_empty() {
            return Ok(0);
        }
        let boot = match port.boot_id() {
            Ok(boot) => boot,
            Err(err) => {
                tracing::warn!(%err, "reading the boot id to migrate VF records; tried again at the next start");
                return Ok(0);
            }
        };
        let mut changed = 0;
        for mut claim in legacy {
            for device in &mut claim.devices {
                let Some(done) = device.vf.as_mut().filter(|done| is_legacy(done)) else {
                    continue;
                };
                match port.pci_address(&done.vf).await {
                    Ok(Some(pci)) => {
                        done.pci = Some(pci);
                        let carries = port
                            .read(&done.vf)
                            .await
                            .is_ok_and(|now| now == vf::wanted(&done.before, &device.config));
                        if carries {
                            done.boot_id = Some(boot.clone());
                            tracing::info!(vf = %done.vf, %pci, claim = %claim.name,
                                "VF record of the release before identified by PCI address");
                        } else {
                            tracing::warn!(vf = %done.vf, %pci, claim = %claim.name,
                                "VF record of the release before identified by PCI address; the VF no longer carries the claim's settings (a reboot or a driver reload reset it), so its values before the claim are of an earlier boot and are never set back");
                        }
                    }
                    outcome => {
                        done.unresolved = true;
                        let err = outcome.err().map(|e| e.to_string()).unwrap_or_default();
                        tracing::warn!(vf = %done.vf, claim = %claim.name, err,
                            "VF record of the release before: no VF at that PF and index, so it cannot be identified by PCI address; kept for the claim, never set back or re-applied (unprepare the claim)");
                    }
                }
            }
            let name = claim.name.clone();
            self.save_claim_record(claim).await.map_err(|e| {
                tracing::warn!(claim = %name, "saving a migrated VF record");
                VfSnapshotError::Store(Box::new(e))
            })?;
            changed += 1;
        }
        Ok(changed)
    }
}

/// A VF record of a release before state format 3 not migrated yet.
fn is_legacy(done: &PreparedVf) -> bool {
    done.pci.is_none() && !done.unresolved
}
