//! The CDI spec of a claim's RDMA devices (DESIGN §3 `rdma`): one file per claim,
//! `<cdi-spec-dir>/<driver>_rdma_<claimUID>.json`, kind `<driver>/rdma`, one CDI device per
//! allocated device whose `rdma` resolved to `exclusive` or `shared` (`<claimUID>_<device>`),
//! whose container edits add the RDMA device's character devices (`/dev/infiniband/uverbsN`,
//! `umadN` of its ports, `rdma_cm`: those the node had at prepare). The runtime reads each
//! node's type and numbers from the host path when it creates the container (the CDI
//! library's `fillMissingInfo`), so a number the kernel gives out again after a driver reload
//! is never stale in the spec. A character device node is not namespaced: in exclusive netns
//! mode the kernel itself refuses a process outside the device's netns (`ib_uverbs_open`
//! answers `EPERM`), which is why the device moves.
//!
//! Its CDI id goes with the device in the prepare answer, next to the metadata's. The spec
//! rides with the device metadata ([`super::metadata::DeviceMetadata`]): written after the
//! metadata specs at prepare, removed with them at unprepare and after a failed prepare, put
//! right with them at start (a reboot empties `/var/run/cdi`). With no CDI spec directory
//! (`--cdi-spec-dir ""`) there is no spec and no id: the move still happens.

use std::collections::HashSet;

use super::PreparedClaim;
use super::metadata::{CDI_VERSION, DeviceMetadata, MetadataError};

/// The CDI kind of the specs.
#[must_use]
pub fn kind(driver: &str) -> String {
    format!("{driver}/rdma")
}

/// The CDI id kubelet passes to the runtime for `device` of claim `uid`.
#[must_use]
pub fn cdi_id(driver: &str, uid: &str, device: &str) -> String {
    format!("{}={uid}_{device}", kind(driver))
}

/// The spec file's name.
#[must_use]
pub fn file_name(driver: &str, uid: &str) -> String {
    format!("{driver}_rdma_{uid}.json")
}

/// The spec of `claim`'s RDMA devices; `None` when it has none with character devices.
#[must_use]
pub fn spec(driver: &str, claim: &PreparedClaim) -> Option<Vec<u8>> {
    let devices: Vec<serde_json::Value> = claim
        .devices
        .iter()
        .filter_map(|device| {
            let rdma = device.config.rdma.as_ref().filter(|r| !r.char_devices.is_empty())?;
            let nodes: Vec<serde_json::Value> =
                rdma.char_devices.iter().map(|path| serde_json::json!({"path": path})).collect();
            Some(serde_json::json!({
                "name": format!("{}_{}", claim.uid, device.device),
                "containerEdits": {"deviceNodes": nodes},
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

/// Adds the RDMA CDI id to each device of `claim` that gets character devices (once).
pub fn add_ids(driver: &str, claim: &mut PreparedClaim) {
    let uid = claim.uid.clone();
    for device in &mut claim.devices {
        let has_nodes = device.config.rdma.as_ref().is_some_and(|r| !r.char_devices.is_empty());
        let id = cdi_id(driver, &uid, &device.device);
        if has_nodes && !device.cdi_device_ids.contains(&id) {
            device.cdi_device_ids.push(id);
        }
    }
}

/// Writes `claim`'s spec (nothing when it has no RDMA device with character devices).
pub fn write(metadata: &DeviceMetadata, claim: &PreparedClaim) -> Result<(), MetadataError> {
    let driver = metadata.layout().driver();
    let Some(bytes) = spec(driver, claim) else { return Ok(()) };
    let path = metadata.layout().cdi_dir().join(file_name(driver, &claim.uid));
    metadata.files().replace(&path, &bytes).map_err(|source| MetadataError::Write { path, source })
}

/// Removes claim `uid`'s spec (a missing one is fine).
pub fn remove(metadata: &DeviceMetadata, uid: &str) -> Result<(), MetadataError> {
    let path = metadata.layout().cdi_dir().join(file_name(metadata.layout().driver(), uid));
    metadata.files().remove_file(&path).map_err(|source| MetadataError::Remove { path, source })
}

/// At start: every prepared claim's spec written again when it differs or is missing, and
/// specs of claims that are not prepared removed.
pub fn restore(metadata: &DeviceMetadata, claims: &[PreparedClaim]) -> Result<(), MetadataError> {
    let (driver, dir) = (metadata.layout().driver(), metadata.layout().cdi_dir());
    let files = metadata.files();
    let mut kept = HashSet::new();
    for claim in claims {
        let Some(bytes) = spec(driver, claim) else { continue };
        let name = file_name(driver, &claim.uid);
        let path = dir.join(&name);
        let current = files
            .read(&path)
            .map_err(|source| MetadataError::List { path: path.clone(), source })?;
        if current.as_deref() != Some(bytes.as_slice()) {
            files.replace(&path, &bytes).map_err(|source| MetadataError::Write { path, source })?;
        }
        kept.insert(name);
    }
    let ours = format!("{driver}_rdma_");
    let names =
        files.list(dir).map_err(|source| MetadataError::List { path: dir.to_owned(), source })?;
    for name in names.into_iter().filter(|n| n.starts_with(&ours) && !kept.contains(n)) {
        let path = dir.join(name);
        files.remove_file(&path).map_err(|source| MetadataError::Remove { path, source })?;
    }
    Ok(())
}
