//! `sriov-vf` settings on the PF: applied at prepare after a durable snapshot of what they
//! replace, set back at unprepare (in the same boot only) or when a prepare is undone
//! (DESIGN §6). The VF is identified by its PCI address; its PF's name and its index are
//! looked up from it through the port whenever it is used.

use super::error::ClaimError;
use super::ports::{ClaimSource, ClaimStore, DeviceSource};
use super::record::{PreparedClaim, PreparedClaimDevice, PreparedVf};
use super::service::ClaimService;
use super::vf::{self, VfError, VfPort, VfRef};
use super::vf_snapshots::{restorable, snapshot_key};
use crate::model::network_config::ResolvedMode;

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Applies the settings of each `sriov-vf` device of `prepared` on its PF and records
    /// what they replaced in the device. On a failure every VF whose snapshot is durable
    /// (the failing one too) is left recorded in its device for the caller's undo
    /// ([`super::staged::StagedClaim::undo`]) to set back. `vfs` holds each allocation
    /// result's VF (in the order of `prepared.devices`).
    pub(super) async fn apply_vf_settings(
        &self,
        prepared: &mut PreparedClaim,
        vfs: &[Option<VfRef>],
    ) -> Result<(), ClaimError> {
        for index in 0..prepared.devices.len() {
            let device = &prepared.devices[index];
            // A VF bound to vfio-pci keeps its VF settings (its config has them resolved).
            let vfio_vf = device.config.mode == ResolvedMode::Vfio && device.config.sriov.is_some();
            if device.config.mode != ResolvedMode::SriovVf && !vfio_vf {
                continue;
            }
            let (request, name) = (device.request.clone(), device.device.clone());
            let (held, outcome) = match (&self.vf_port, vfs.get(index).cloned().flatten()) {
                (None, _) => (None, Err(ClaimError::NoVfPort { request, device: name })),
                (_, None) => (None, Err(ClaimError::NotAVf { request, device: name })),
                (Some(port), Some(vf)) => {
                    let (held, outcome) =
                        self.apply_one(port.as_ref(), &prepared.uid, device, vf).await;
                    let outcome = outcome.map_err(|source| match source {
                        ApplyError::Claim(err) => err,
                        ApplyError::Vf(source) => {
                            ClaimError::Vf { request, device: name, source: Box::new(source) }
                        }
                    });
                    (held, outcome)
                }
            };
            match outcome {
                Ok(done) => {
                    prepared.devices[index].vf = Some(done);
                    crate::failpoint!("claims.prepare.after_vf_apply");
                }
                Err(err) => {
                    // The VF whose snapshot is durable is set back by the undo.
                    prepared.devices[index].vf = held;
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// The VF settings of one device: the VF's PCI address and the boot id, the values found
    /// (made durable first), then the claim's. Returns the record once its snapshot is
    /// durable (for the undo), and the outcome.
    async fn apply_one(
        &self,
        port: &dyn VfPort,
        claim_uid: &str,
        device: &PreparedClaimDevice,
        vf: VfRef,
    ) -> (Option<PreparedVf>, Result<PreparedVf, ApplyError>) {
        let identity = async {
            let what = || vf.to_string();
            let pci = match port.pci_address(&vf).await {
                Ok(Some(pci)) => pci,
                Ok(None) => return Err(VfError::NotFound { what: what() }),
                Err(source) => return Err(VfError::Locate { what: what(), source }),
            };
            let boot_id = port.boot_id().map_err(|source| VfError::BootId { source })?;
            let found =
                port.read(&vf).await.map_err(|source| VfError::Read { vf: vf.clone(), source })?;
            Ok((pci, boot_id, found))
        };
        let (pci, boot_id, found) = match identity.await {
            Ok(found) => found,
            Err(err) => return (None, Err(ApplyError::Vf(err))),
        };
        // Durable before the first change (DESIGN §6): killed before the claim's record,
        // the daemon still knows what to set back.
        let before = match self.hold_vf_snapshot(claim_uid, &vf, (pci, &boot_id), found).await {
            Ok(before) => before,
            Err(err) => return (None, Err(ApplyError::Claim(err))),
        };
        let record = PreparedVf {
            vf: vf.clone(),
            pci: Some(pci),
            boot_id: Some(boot_id),
            unresolved: false,
            before,
        };
        let wanted = vf::wanted(&before, &device.config);
        let outcome = vf::apply(port, &vf, &device.if_name, &wanted)
            .await
            .map(|_| record.clone())
            .map_err(|err| ApplyError::Vf(vf::name_ceiling(err, &device.config)));
        (Some(record), outcome)
    }

    /// Sets the VFs of `prepared` back to the settings found before it, when they were read
    /// in this boot, and removes their snapshots ([`super::vf_snapshots`]); every device is
    /// tried, the first failure is returned. Values of another boot are dropped with a log:
    /// the reboot reset the VF and the boot configured it since, so it keeps that.
    pub(super) async fn restore_vf_settings(
        &self,
        prepared: &PreparedClaim,
    ) -> Result<(), ClaimError> {
        let mut first_error = None;
        let mut done_keys = Vec::new();
        for device in &prepared.devices {
            let Some(done) = &device.vf else { continue };
            let Some(port) = &self.vf_port else {
                first_error.get_or_insert(ClaimError::NoVfPort {
                    request: device.request.clone(),
                    device: device.device.clone(),
                });
                continue;
            };
            let port = port.as_ref();
            let pci = done.pci.filter(|_| !done.unresolved);
            let outcome = match restorable(port, pci, done.boot_id.as_deref(), &done.vf).await {
                Ok(None) => Ok(()),
                Ok(Some(now)) => vf::restore(port, &now, &done.before).await.inspect(|()| {
                    tracing::info!(vf = %now, claim = %prepared.name,
                        "VF settings set back as found before the claim");
                }),
                Err(err) => Err(err),
            };
            match outcome {
                Ok(()) => done_keys.push(snapshot_key(done.pci, &done.vf)),
                Err(source) => {
                    first_error.get_or_insert(ClaimError::Vf {
                        request: device.request.clone(),
                        device: device.device.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        if let Err(err) = self.drop_vf_snapshots(done_keys).await {
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Why one device's VF settings failed: the VF, or the store.
enum ApplyError {
    Claim(ClaimError),
    Vf(VfError),
}
