//! `sriov-vf` settings on the PF: applied at prepare after a durable snapshot of what they
//! replace, set back at unprepare or when a prepare is undone (DESIGN §6).

use super::error::ClaimError;
use super::ports::{ClaimSource, ClaimStore, DeviceSource};
use super::record::{PreparedClaim, PreparedVf};
use super::service::ClaimService;
use super::vf::{self, VfError, VfRef};
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
            if device.config.mode != ResolvedMode::SriovVf {
                continue;
            }
            let (request, name) = (device.request.clone(), device.device.clone());
            // The VF whose snapshot is durable: a failure from then on sets it back too.
            let mut snapshot_held = None;
            let outcome = match (&self.vf_port, vfs.get(index).cloned().flatten()) {
                (None, _) => Err(ClaimError::NoVfPort { request, device: name }),
                (_, None) => Err(ClaimError::NotAVf { request, device: name }),
                (Some(port), Some(vf)) => {
                    let port = port.as_ref();
                    let vf_error = |source: VfError| ClaimError::Vf {
                        request: request.clone(),
                        device: name.clone(),
                        source: Box::new(source),
                    };
                    match port.read(&vf).await {
                        Err(source) => Err(vf_error(VfError::Read { vf: vf.clone(), source })),
                        // Durable before the first change (DESIGN §6): killed before the
                        // claim's record, the daemon still knows what to set back.
                        Ok(found) => match self.hold_vf_snapshot(&prepared.uid, &vf, found).await {
                            Err(err) => Err(err),
                            Ok(before) => {
                                snapshot_held = Some(PreparedVf { vf: vf.clone(), before });
                                let wanted = vf::wanted(&before, &device.config);
                                vf::apply(port, &vf, &device.if_name, &wanted)
                                    .await
                                    .map(|_| PreparedVf { vf, before })
                                    .map_err(vf_error)
                            }
                        },
                    }
                }
            };
            match outcome {
                Ok(done) => {
                    prepared.devices[index].vf = Some(done);
                    crate::failpoint!("claims.prepare.after_vf_apply");
                }
                Err(err) => {
                    prepared.devices[index].vf = snapshot_held;
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Sets the VFs of `prepared` back to the settings found before it and removes their
    /// snapshots ([`vf_snapshots`]); every device is tried, the first failure is returned.
    pub(super) async fn restore_vf_settings(
        &self,
        prepared: &PreparedClaim,
    ) -> Result<(), ClaimError> {
        let mut first_error = None;
        let mut restored = Vec::new();
        for device in &prepared.devices {
            let Some(done) = &device.vf else { continue };
            let Some(port) = &self.vf_port else {
                first_error.get_or_insert(ClaimError::NoVfPort {
                    request: device.request.clone(),
                    device: device.device.clone(),
                });
                continue;
            };
            match vf::restore(port.as_ref(), &done.vf, &done.before).await {
                Ok(()) => {
                    tracing::info!(vf = %done.vf, claim = %prepared.name,
                        "VF settings set back as found before the claim");
                    restored.push(done.vf.clone());
                }
                Err(source) => {
                    first_error.get_or_insert(ClaimError::Vf {
                        request: device.request.clone(),
                        device: device.device.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        if let Err(err) = self.drop_vf_snapshots(restored).await {
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }
}
