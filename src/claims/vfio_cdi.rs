//! The CDI spec of a claim's `vfio` devices (DESIGN §3): one file per claim,
//! `<cdi-spec-dir>/<driver>_vfio_<claimUID>.json`, kind `<driver>/vfio`, one CDI device per
//! bound function (`<claimUID>_<device>`) whose container edits add the group's character
//! device `/dev/vfio/<group>` and the container device `/dev/vfio/vfio` (a userspace driver
//! opens the container, then attaches the group to it: the kernel's VFIO API). The runtime
//! reads each node's type and numbers from the host path. Written through the device
//! metadata's files port beside its specs (replaced atomically), after the bind and before
//! the claim's record; removed at unprepare; put right at start (a reboot empties
//! `/var/run/cdi`, a crash before the record leaves a spec of no claim).

use std::collections::HashSet;
use std::path::PathBuf;

use super::PreparedClaim;
use super::metadata::{CDI_VERSION, MetadataStore};
use crate::model::cause::Cause;

/// The container device every VFIO user opens first.
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";

/// The CDI kind of the specs.
#[must_use]
pub fn kind(driver: &str) -> String {
    format!("{driver}/vfio")
}

/// The CDI id kubelet passes to the runtime for `device` of claim `uid`.
#[must_use]
pub fn cdi_id(driver: &str, uid: &str, device: &str) -> String {
    format!("{}={uid}_{device}", kind(driver))
}

/// The spec file's name.
#[must_use]
pub fn file_name(driver: &str, uid: &str) -> String {
    format!("{driver}_vfio_{uid}.json")
}

/// The group's character device.
#[must_use]
pub fn group_device(group: u32) -> String {
    format!("/dev/vfio/{group}")
}

/// The spec of `claim`'s bound functions; `None` when it has none.
#[must_use]
pub fn spec(driver: &str, claim: &PreparedClaim) -> Option<Vec<u8>> {
    let devices: Vec<serde_json::Value> = claim
        .devices
        .iter()
        .filter_map(|device| {
            let vfio = device.vfio.as_ref()?;
            Some(serde_json::json!({
                "name": format!("{}_{}", claim.uid, device.device),
                "containerEdits": {
                    "deviceNodes": [
                        {"path": VFIO_CONTAINER},
                        {"path": group_device(vfio.group)},
                    ],
                },
            }))
        })
        .collect();
    if devices.is_empty() {
        return None;
    }
    let spec =
        serde_json::json!({"cdiVersion": CDI_VERSION, "kind": kind(driver), "devices": devices});
    let mut bytes = spec.to_string().into_bytes();
    bytes.push(b'\n');
    Some(bytes)
}

/// Why a spec could not be written or removed.
#[derive(Debug, thiserror::Error)]
#[error("{step} the vfio CDI spec {path}: {source}")]
pub struct VfioCdiError {
    /// What was being done.
    step: &'static str,
    /// The file or directory.
    path: PathBuf,
    /// The filesystem's error.
    #[source]
    source: Cause,
}

/// Writes `claim`'s spec into `cdi_dir` (nothing when it has no bound function).
pub fn write(
    files: &dyn MetadataStore,
    cdi_dir: &std::path::Path,
    driver: &str,
    claim: &PreparedClaim,
) -> Result<(), VfioCdiError> {
    let Some(bytes) = spec(driver, claim) else { return Ok(()) };
    let path = cdi_dir.join(file_name(driver, &claim.uid));
    files.replace(&path, &bytes).map_err(|source| VfioCdiError { step: "writing", path, source })
}

/// Removes claim `uid`'s spec (a missing one is fine).
pub fn remove(
    files: &dyn MetadataStore,
    cdi_dir: &std::path::Path,
    driver: &str,
    uid: &str,
) -> Result<(), VfioCdiError> {
    let path = cdi_dir.join(file_name(driver, uid));
    files.remove_file(&path).map_err(|source| VfioCdiError { step: "removing", path, source })
}

/// At start: the spec of every prepared claim with bound functions is written again when it
/// differs (or is missing), and specs of claims not prepared are removed.
pub fn restore(
    files: &dyn MetadataStore,
    cdi_dir: &std::path::Path,
    driver: &str,
    claims: &[PreparedClaim],
) -> Result<(), VfioCdiError> {
    let mut kept = HashSet::new();
    for claim in claims {
        let Some(bytes) = spec(driver, claim) else { continue };
        let name = file_name(driver, &claim.uid);
        let path = cdi_dir.join(&name);
        let current = files.read(&path).map_err(|source| VfioCdiError {
            step: "reading",
            path: path.clone(),
            source,
        })?;
        if current.as_deref() != Some(bytes.as_slice()) {
            files.replace(&path, &bytes).map_err(|source| VfioCdiError {
                step: "writing",
                path,
                source,
            })?;
        }
        kept.insert(name);
    }
    let ours = format!("{driver}_vfio_");
    let names = files.list(cdi_dir).map_err(|source| VfioCdiError {
        step: "listing",
        path: cdi_dir.to_owned(),
        source,
    })?;
    for name in names.into_iter().filter(|n| n.starts_with(&ours) && !kept.contains(n)) {
        let path = cdi_dir.join(name);
        files.remove_file(&path).map_err(|source| VfioCdiError {
            step: "removing",
            path,
            source,
        })?;
    }
    Ok(())
}
