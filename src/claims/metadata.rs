//! Device metadata for the pod (KEP-5304, DESIGN §5 item 7): per (claim, top-level request)
//! a `DeviceMetadata` file that a CDI spec bind-mounts read-only into the pod's containers,
//! rewritten in place with a higher generation whenever the interface's `networkData`
//! changes (attached, stopped), and removed at unprepare.
//!
//! [`MetadataLayout`] knows the paths, the CDI spec and the CDI device id (pure);
//! [`DeviceMetadata`] keeps each prepared claim's documents and their generations and writes
//! them through the [`MetadataStore`] port, the only way this module touches a filesystem.

pub use super::ports::MetadataStore;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData};
use serde::{Deserialize, Serialize};

use super::PreparedClaim;
use super::state::lock;
use crate::inventory::naming::is_dns_label;
use crate::model::ClaimRef;
use crate::model::cause::Cause;
use crate::model::device::AttributeValue;
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};

/// Directory under the kubelet plugin dir that holds the host side of the metadata files.
pub const HOST_SUBDIR: &str = "dra-device-metadata";
/// Root of the metadata files inside a container (KEP-5304; the KEP README's older
/// `/var/run/dra-device-attributes` is not what kubelet-era consumers read).
pub const CONTAINER_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// CDI spec version: 0.5.0 is the oldest that has everything the spec uses (mounts with
/// options) and is what runtimes bundled with Kubernetes 1.34+ accept.
pub const CDI_VERSION: &str = "0.5.0";
/// API versions written into each file, newest first: a consumer takes the first it knows.
/// `v1beta1` is what Kubernetes 1.37 documents; `v1alpha1` is all that consumers built
/// against the 1.36 helper read. Both stay while 1.36 and 1.37 are supported.
pub const API_VERSIONS: [&str; 2] =
    ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"];
/// `v1beta1` validation allows at most this many attributes per device.
pub const MAX_ATTRIBUTES: usize = 32;
/// Standard attribute holding a PCI device's address in extended BDF notation
/// (`dddd:bb:dd.f`): KubeVirt reads it from the metadata file to find the device a VM gets.
pub const ATTRIBUTE_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Domain of the standard attributes (`resource.kubernetes.io/pcieRoot`, `…/pciBusID`).
const STANDARD_ATTRIBUTE_PREFIX: &str = "resource.kubernetes.io/";
/// Annotation of a claim made from a template: the pod's `spec.resourceClaims[].name`.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The request a container can name: `<req>` of a `firstAvailable` result `<req>/<sub>`
/// (kubelet matches containers' `resources.claims[].request` against top-level names only).
#[must_use]
pub fn top_level(request: &str) -> &str {
    request.split_once('/').map_or(request, |(main, _)| main)
}

/// Where metadata files and CDI specs of one driver go, and how they are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataLayout {
    driver: String,
    host_root: PathBuf,
    cdi_dir: PathBuf,
}

impl MetadataLayout {
    /// Files of `driver` under `<plugin_dir>/dra-device-metadata`, CDI specs in `cdi_dir`.
    #[must_use]
    pub fn new(driver: &str, plugin_dir: &Path, cdi_dir: &Path) -> Self {
        Self {
            driver: driver.to_owned(),
            host_root: plugin_dir.join(HOST_SUBDIR),
            cdi_dir: cdi_dir.to_owned(),
        }
    }

    /// The directory holding every claim's metadata.
    #[must_use]
    pub fn host_root(&self) -> &Path {
        &self.host_root
    }

    /// The CDI spec directory.
    #[must_use]
    pub fn cdi_dir(&self) -> &Path {
        &self.cdi_dir
    }

    /// The driver name the files and specs are named after.
    #[must_use]
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// `<namespace>_<claim>`: namespaces and claim names are DNS names, which have no `_`,
    /// so the pair is unambiguous.
    #[must_use]
    pub fn claim_dir_name(namespace: &str, name: &str) -> String {
        format!("{namespace}_{name}")
    }

    /// The host directory of one claim's metadata.
    #[must_use]
    pub fn claim_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.host_root.join(Self::claim_dir_name(namespace, name))
    }

    /// The host file of one (claim, top-level request).
    #[must_use]
    pub fn host_file(&self, namespace: &str, name: &str, request: &str) -> PathBuf {
        self.claim_dir(namespace, name).join(request).join("metadata.json")
    }

    /// `<driver>_metadata_<claimUID>_`: the start of every CDI spec file name of a claim.
    #[must_use]
    pub fn cdi_spec_prefix(&self, uid: &str) -> String {
        format!("{}_metadata_{uid}_", self.driver)
    }

    /// The CDI spec file of one (claim, top-level request).
    #[must_use]
    pub fn cdi_spec_file(&self, uid: &str, request: &str) -> PathBuf {
        self.cdi_dir.join(format!("{}{request}.json", self.cdi_spec_prefix(uid)))
    }

    /// The CDI kind of our specs.
    #[must_use]
    pub fn cdi_kind(&self) -> String {
        format!("{}/metadata", self.driver)
    }

    /// The fully qualified CDI device name kubelet passes to the runtime.
    #[must_use]
    pub fn cdi_device_id(&self, uid: &str, request: &str) -> String {
        format!("{}={uid}_{request}", self.cdi_kind())
    }

    /// Where a container finds the file: under `resourceclaimtemplates/<pod-claim-name>` for
    /// a claim made from a template (its generated name is not known when the pod is
    /// written), else under `resourceclaims/<claim>`.
    #[must_use]
    pub fn container_path(&self, document: &RequestMetadata) -> String {
        let (kind, name) = match &document.pod_claim_name {
            Some(entry) => ("resourceclaimtemplates", entry.as_str()),
            None => ("resourceclaims", document.name.as_str()),
        };
        format!("{CONTAINER_ROOT}/{kind}/{name}/{}/{}-metadata.json", document.request, self.driver)
    }

    /// The CDI spec that mounts `document`'s host file into the container, read-only.
    #[must_use]
    pub fn cdi_spec(&self, document: &RequestMetadata) -> Vec<u8> {
        let spec = serde_json::json!({
            "cdiVersion": CDI_VERSION,
            "kind": self.cdi_kind(),
            "devices": [{
                "name": format!("{}_{}", document.uid, document.request),
                "containerEdits": {
                    "mounts": [{
                        "hostPath": self.host_file(&document.namespace, &document.name, &document.request),
                        "containerPath": self.container_path(document),
                        "options": ["ro", "bind"],
                    }],
                },
            }],
        });
        let mut bytes = spec.to_string().into_bytes();
        bytes.push(b'\n');
        bytes
    }
}

/// One device of a request's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataDevice {
    /// The allocation result's request (`<req>` or `<req>/<sub>`).
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// `shareID` of a share (matches status entries; not part of the file).
    pub share_id: Option<String>,
    /// The device's attributes as published.
    pub attributes: BTreeMap<String, AttributeValue>,
    /// The interface while it is attached.
    pub network: Option<NetworkDeviceData>,
}

/// The metadata of one (claim, top-level request): what its file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMetadata {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// The pod's entry name for a claim made from a template.
    pub pod_claim_name: Option<String>,
    /// The top-level request.
    pub request: String,
    /// Grows on every rewrite, so a consumer can tell a new version from an old one.
    pub generation: i64,
    /// The request's devices, in allocation order.
    pub devices: Vec<MetadataDevice>,
}

impl RequestMetadata {
    /// The documents of a prepared claim, one per top-level request in allocation order, at
    /// generation 1 and without `networkData`.
    #[must_use]
    pub fn of_claim(claim: &PreparedClaim) -> Vec<Self> {
        let mut documents: Vec<Self> = Vec::new();
        for device in &claim.devices {
            let request = top_level(&device.request);
            let entry = MetadataDevice {
                request: device.request.clone(),
                pool: device.pool.clone(),
                device: device.device.clone(),
                share_id: device.share_id.clone(),
                attributes: device.attributes.clone(),
                network: None,
            };
            match documents.iter_mut().find(|d| d.request == request) {
                Some(document) => document.devices.push(entry),
                None => documents.push(Self {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    uid: claim.uid.clone(),
                    // Validated at prepare; a record of an older release may hold anything.
                    pod_claim_name: claim.pod_claim_name.clone().filter(|n| is_dns_label(n)),
                    request: request.to_owned(),
                    generation: 1,
                    devices: vec![entry],
                }),
            }
        }
        documents
    }

    /// The file's contents: the document once per version of [`API_VERSIONS`], each followed
    /// by a newline (a JSON stream).
    #[must_use]
    pub fn encode(&self, driver: &str) -> Vec<u8> {
        let mut requests: Vec<WireRequest> = Vec::new();
        for device in &self.devices {
            let entry = WireDevice {
                driver: driver.to_owned(),
                pool: device.pool.clone(),
                name: device.device.clone(),
                attributes: wire_attributes(&device.attributes),
                network_data: device.network.clone(),
            };
            match requests.iter_mut().find(|r| r.name == device.request) {
                Some(request) => request.devices.push(entry),
                None => {
                    requests
                        .push(WireRequest { name: device.request.clone(), devices: vec![entry] });
                }
            }
        }
        let mut out = Vec::new();
        for api_version in API_VERSIONS {
            let document = WireDocument {
                api_version: api_version.to_owned(),
                kind: "DeviceMetadata".to_owned(),
                metadata: WireMeta {
                    name: self.name.clone(),
                    namespace: self.namespace.clone(),
                    uid: self.uid.clone(),
                    generation: self.generation,
                },
                pod_claim_name: self.pod_claim_name.clone(),
                requests: requests.clone(),
            };
            // Plain data with string keys: serialising cannot fail.
            let line = serde_json::to_vec(&document).unwrap_or_default();
            out.extend_from_slice(&line);
            out.push(b'\n');
        }
        out
    }
}

/// The attributes of a device's entry: its published attributes, plus
/// `resource.kubernetes.io/pciBusID` taken from our `pciAddress` when the pod gets the PCI
/// device itself (not a sub-interface of a shared parent, whose address is the parent's) and
/// the slice does not carry it already. At most [`MAX_ATTRIBUTES`]: the standard
/// `resource.kubernetes.io/` ones first, so a consumer that looks for them finds them.
fn wire_attributes(
    attributes: &BTreeMap<String, AttributeValue>,
) -> BTreeMap<String, WireAttribute> {
    let get = |key: &str| {
        attributes.get(&format!("{ATTRIBUTE_DOMAIN}/{key}")).or_else(|| attributes.get(key))
    };
    let mut all: BTreeMap<&str, WireAttribute> =
        attributes.iter().map(|(k, v)| (k.as_str(), WireAttribute::from(v))).collect();
    let shared = matches!(get(attr::SHARING), Some(AttributeValue::String(s)) if s == "shared");
    if !shared
        && !all.contains_key(ATTRIBUTE_PCI_BUS_ID)
        && let Some(AttributeValue::String(address)) = get(attr::PCI_ADDRESS)
    {
        all.insert(ATTRIBUTE_PCI_BUS_ID, WireAttribute::String(address.clone()));
    }
    let (standard, own): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|(k, _)| k.starts_with(STANDARD_ATTRIBUTE_PREFIX));
    standard.into_iter().chain(own).take(MAX_ATTRIBUTES).map(|(k, v)| (k.to_owned(), v)).collect()
}

/// What a file on disk says, as far as a restart needs it: whose it is, its generation and
/// each device's `networkData`.
#[derive(Debug, Clone, PartialEq)]
pub struct WrittenMetadata {
    /// Claim UID in the file.
    pub uid: String,
    /// Its generation.
    pub generation: i64,
    /// `networkData` by (request, pool, device).
    pub network: Vec<((String, String, String), NetworkDeviceData)>,
}

impl WrittenMetadata {
    /// Reads the first document of a file; `None` when it is not one of ours.
    #[must_use]
    pub fn parse(contents: &[u8]) -> Option<Self> {
        let first = contents.split(|b| *b == b'\n').next()?;
        let document: WireDocument = serde_json::from_slice(first).ok()?;
        let mut network = Vec::new();
        for request in document.requests {
            for device in request.devices {
                if let Some(data) = device.network_data {
                    network.push(((request.name.clone(), device.pool, device.name), data));
                }
            }
        }
        Some(Self { uid: document.metadata.uid, generation: document.metadata.generation, network })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireDocument {
    api_version: String,
    kind: String,
    metadata: WireMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<String>,
    #[serde(default)]
    requests: Vec<WireRequest>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireMeta {
    name: String,
    namespace: String,
    uid: String,
    generation: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireRequest {
    name: String,
    devices: Vec<WireDevice>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireDevice {
    driver: String,
    pool: String,
    name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<String, WireAttribute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network_data: Option<NetworkDeviceData>,
}

/// A `DeviceAttribute` as a ResourceSlice writes it: exactly one typed member.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum WireAttribute {
    String(String),
    Int(i64),
    Bool(bool),
}

impl From<&AttributeValue> for WireAttribute {
    fn from(value: &AttributeValue) -> Self {
        match value {
            AttributeValue::String(s) => Self::String(s.clone()),
            AttributeValue::Int(i) => Self::Int(*i),
            AttributeValue::Bool(b) => Self::Bool(*b),
        }
    }
}

/// Why device metadata could not be written or removed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetadataError {
    /// A file could not be written.
    #[error("writing device metadata {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Cause,
    },
    /// A file or directory could not be removed.
    #[error("removing device metadata {path}: {source}")]
    Remove {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Cause,
    },
    /// A directory could not be read.
    #[error("listing {path}: {source}")]
    List {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Cause,
    },
}

/// The metadata files of every prepared claim: written at prepare, rewritten when a status
/// changes an interface's `networkData`, removed at unprepare, put right at start.
pub struct DeviceMetadata {
    layout: MetadataLayout,
    files: Box<dyn MetadataStore>,
    /// The current documents by claim UID (with the generation last written).
    documents: Mutex<HashMap<String, Vec<RequestMetadata>>>,
}

impl std::fmt::Debug for DeviceMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMetadata").field("layout", &self.layout).finish_non_exhaustive()
    }
}

impl DeviceMetadata {
    /// Metadata in `layout`, written through `files`.
    pub fn new(layout: MetadataLayout, files: impl MetadataStore) -> Self {
        Self { layout, files: Box::new(files), documents: Mutex::new(HashMap::new()) }
    }

    /// The layout (paths, CDI names).
    #[must_use]
    pub fn layout(&self) -> &MetadataLayout {
        &self.layout
    }

    /// The files port, for the other CDI specs of a claim (the device nodes of mode `vfio`,
    /// `claims::vfio_cdi`), written beside the metadata specs.
    pub(crate) fn files(&self) -> &dyn MetadataStore {
        self.files.as_ref()
    }

    /// The CDI device id of each top-level request of `claim`.
    #[must_use]
    pub fn cdi_device_id(&self, uid: &str, request: &str) -> String {
        self.layout.cdi_device_id(uid, request)
    }

    fn written(
        &self,
        document: &RequestMetadata,
    ) -> Result<Option<WrittenMetadata>, MetadataError> {
        let path = self.layout.host_file(&document.namespace, &document.name, &document.request);
        let contents = self
            .files
            .read(&path)
            .map_err(|source| MetadataError::List { path: path.clone(), source })?;
        Ok(contents.as_deref().and_then(WrittenMetadata::parse))
    }

    fn write(&self, document: &RequestMetadata) -> Result<(), MetadataError> {
        let path = self.layout.host_file(&document.namespace, &document.name, &document.request);
        self.files
            .write_in_place(&path, &document.encode(self.layout.driver.as_str()))
            .map_err(|source| MetadataError::Write { path, source })
    }

    fn write_spec(&self, document: &RequestMetadata) -> Result<(), MetadataError> {
        let path = self.layout.cdi_spec_file(&document.uid, &document.request);
        self.files
            .replace(&path, &self.layout.cdi_spec(document))
            .map_err(|source| MetadataError::Write { path, source })
    }

    /// Writes the files and CDI specs of a newly prepared claim (the file before its spec,
    /// so a runtime never resolves a spec whose file is missing). A file left by an earlier
    /// claim of the same name is overwritten with a higher generation. On failure whatever
    /// was written is removed again.
    pub fn publish(&self, claim: &PreparedClaim) -> Result<(), MetadataError> {
        let mut documents = RequestMetadata::of_claim(claim);
        let outcome = documents.iter_mut().try_for_each(|document| {
            if let Some(old) = self.written(document)? {
                document.generation = old.generation.saturating_add(1);
            }
            self.write(document)?;
            self.write_spec(document)
        });
        // The RDMA character devices' spec rides with the metadata (`super::rdma_cdi`).
        let outcome = outcome.and_then(|()| super::rdma_cdi::write(self, claim));
        if let Err(err) = outcome {
            let reference = ClaimRef {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            };
            if let Err(cleanup) = self.remove(&reference) {
                tracing::warn!(claim = %reference, error = %cleanup, "removing half-written device metadata");
            }
            return Err(err);
        }
        lock(&self.documents).insert(claim.uid.clone(), documents);
        Ok(())
    }

    /// Takes the `networkData` of this driver's status entries of a claim into its files:
    /// every request whose data changed is rewritten with the next generation. Entries
    /// without `networkData` (failed, stopped) clear it. Errors are logged: the status
    /// itself still goes out, and the next change writes again.
    pub fn update_network(&self, uid: &str, entries: &[AllocatedDeviceStatus]) {
        let mut documents = lock(&self.documents);
        let Some(claim_documents) = documents.get_mut(uid) else { return };
        for document in claim_documents.iter_mut() {
            let mut changed = false;
            for device in &mut document.devices {
                let Some(entry) = entries.iter().find(|e| {
                    e.pool == device.pool
                        && e.device == device.device
                        && e.share_id == device.share_id
                }) else {
                    continue;
                };
                if device.network != entry.network_data {
                    device.network.clone_from(&entry.network_data);
                    changed = true;
                }
            }
            if changed {
                document.generation = document.generation.saturating_add(1);
                if let Err(err) = self.write(document) {
                    tracing::warn!(claim = %document.name, namespace = %document.namespace,
                        request = %document.request, error = %err, "rewriting device metadata");
                }
            }
        }
    }

    /// Removes a claim's CDI specs and its metadata directory (unless the directory belongs
    /// to another claim of the same name, prepared since); missing files are fine.
    pub fn remove(&self, claim: &ClaimRef) -> Result<(), MetadataError> {
        lock(&self.documents).remove(&claim.uid);
        let prefix = self.layout.cdi_spec_prefix(&claim.uid);
        let cdi_dir = self.layout.cdi_dir();
        let specs = self
            .files
            .list(cdi_dir)
            .map_err(|source| MetadataError::List { path: cdi_dir.to_owned(), source })?;
        // Our specs only (the temporary `<spec>.<random>.tmp` of an interrupted write too).
        for spec in specs.iter().filter(|s| s.starts_with(&prefix)) {
            let path = cdi_dir.join(spec);
            self.files
                .remove_file(&path)
                .map_err(|source| MetadataError::Remove { path, source })?;
        }
        super::rdma_cdi::remove(self, &claim.uid)?;
        let dir = self.layout.claim_dir(&claim.namespace, &claim.name);
        if self.dir_owner(&dir)?.is_none_or(|owner| owner == claim.uid) {
            self.files
                .remove_dir_all(&dir)
                .map_err(|source| MetadataError::Remove { path: dir, source })?;
        }
        Ok(())
    }

    /// The claim UID the files of a claim directory name; `None` when none can be read.
    fn dir_owner(&self, dir: &Path) -> Result<Option<String>, MetadataError> {
        let requests = self
            .files
            .list(dir)
            .map_err(|source| MetadataError::List { path: dir.to_owned(), source })?;
        for request in requests {
            let path = dir.join(request).join("metadata.json");
            let contents = self
                .files
                .read(&path)
                .map_err(|source| MetadataError::List { path: path.clone(), source })?;
            if let Some(written) = contents.as_deref().and_then(WrittenMetadata::parse) {
                return Ok(Some(written.uid));
            }
        }
        Ok(None)
    }

    /// At start: takes over the files of the prepared claims that have metadata (kept
    /// generation and `networkData`; a file or spec that is missing, e.g. after a reboot
    /// emptied `/var/run`, is written again) and removes files and specs of claims that are
    /// not prepared (a crash between writing them and recording the claim, or between
    /// forgetting the claim and removing them).
    pub fn restore(&self, claims: &[PreparedClaim]) -> Result<(), MetadataError> {
        let mut restored = HashMap::new();
        for claim in
            claims.iter().filter(|c| c.devices.iter().any(|d| !d.cdi_device_ids.is_empty()))
        {
            let mut documents = RequestMetadata::of_claim(claim);
            for document in &mut documents {
                match self.written(document)? {
                    Some(old) if old.uid == document.uid => {
                        document.generation = old.generation;
                        for device in &mut document.devices {
                            let key = (
                                device.request.clone(),
                                device.pool.clone(),
                                device.device.clone(),
                            );
                            device.network =
                                old.network.iter().find(|(k, _)| *k == key).map(|(_, d)| d.clone());
                        }
                    }
                    other => {
                        if let Some(old) = other {
                            document.generation = old.generation.saturating_add(1);
                        }
                        self.write(document)?;
                    }
                }
                let spec = self.layout.cdi_spec_file(&document.uid, &document.request);
                let current = self
                    .files
                    .read(&spec)
                    .map_err(|source| MetadataError::List { path: spec.clone(), source })?;
                if current.as_deref() != Some(self.layout.cdi_spec(document).as_slice()) {
                    self.write_spec(document)?;
                }
            }
            restored.insert(claim.uid.clone(), documents);
        }
        self.remove_leftovers(claims)?;
        super::rdma_cdi::restore(self, claims)?;
        *lock(&self.documents) = restored;
        Ok(())
    }

    fn remove_leftovers(&self, claims: &[PreparedClaim]) -> Result<(), MetadataError> {
        let uids: HashSet<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
        let dirs: HashSet<String> =
            claims.iter().map(|c| MetadataLayout::claim_dir_name(&c.namespace, &c.name)).collect();
        let ours = format!("{}_metadata_", self.layout.driver);
        let cdi_dir = self.layout.cdi_dir();
        let specs = self
            .files
            .list(cdi_dir)
            .map_err(|source| MetadataError::List { path: cdi_dir.to_owned(), source })?;
        for spec in specs {
            let Some(rest) = spec.strip_prefix(&ours) else { continue };
            // `<uid>_<request>`: UIDs have no `_`.
            let uid = rest.split_once('_').map_or(rest, |(uid, _)| uid);
            if !uids.contains(uid) {
                let path = cdi_dir.join(&spec);
                self.files
                    .remove_file(&path)
                    .map_err(|source| MetadataError::Remove { path, source })?;
            }
        }
        let root = self.layout.host_root();
        let entries = self
            .files
            .list(root)
            .map_err(|source| MetadataError::List { path: root.to_owned(), source })?;
        for entry in entries.into_iter().filter(|e| !dirs.contains(e)) {
            let path = root.join(entry);
            self.files
                .remove_dir_all(&path)
                .map_err(|source| MetadataError::Remove { path, source })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    fn document(attributes: usize) -> RequestMetadata {
        RequestMetadata {
            namespace: "team".into(),
            name: "web-net".into(),
            uid: "u1".into(),
            pod_claim_name: None,
            request: "net".into(),
            generation: 7,
            devices: vec![MetadataDevice {
                request: "net/fast".into(),
                pool: "node-a".into(),
                device: "eth2".into(),
                share_id: Some("s1".into()),
                attributes: (0..attributes)
                    .map(|i| {
                        (
                            format!("netclaim.dev/a{i:02}"),
                            AttributeValue::Int(i64::try_from(i).unwrap()),
                        )
                    })
                    .collect(),
                network: Some(NetworkDeviceData {
                    interface_name: Some("net1".into()),
                    ips: Some(vec!["10.0.0.2/24".into()]),
                    hardware_address: None,
                }),
            }],
        }
    }

    #[test]
    fn top_level_cuts_the_subrequest() {
        assert_eq!(top_level("net/fast"), "net");
        assert_eq!(top_level("net"), "net");
    }

    #[test]
    fn v1beta1_gets_at_most_32_attributes_and_the_file_parses_back() {
        let encoded = document(40).encode("netclaim.dev");
        let lines: Vec<serde_json::Value> = encoded
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        let device = &lines[0]["requests"][0]["devices"][0];
        assert_eq!(device["attributes"].as_object().unwrap().len(), MAX_ATTRIBUTES);
        assert_eq!(device["attributes"]["netclaim.dev/a00"], serde_json::json!({"int": 0}));
        assert!(device.get("shareID").is_none() && device.get("shareId").is_none());
        let written = WrittenMetadata::parse(&encoded).unwrap();
        assert_eq!((written.uid.as_str(), written.generation), ("u1", 7));
        assert_eq!(written.network[0].0, ("net/fast".into(), "node-a".into(), "eth2".into()));
        assert_eq!(WrittenMetadata::parse(b"not json\n"), None);
    }

    /// The lines of a metadata stream, parsed.
    fn lines(encoded: &[u8]) -> Vec<serde_json::Value> {
        encoded
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    #[test]
    fn the_stream_carries_v1beta1_then_v1alpha1_with_the_same_fields() {
        let mut doc = document(2);
        doc.pod_claim_name = Some("net-entry".into());
        let lines = lines(&doc.encode("netclaim.dev"));
        let versions: Vec<&str> = lines.iter().map(|l| l["apiVersion"].as_str().unwrap()).collect();
        // 1.37 reads v1beta1, consumers built against the 1.36 helper only v1alpha1: both
        // stay, newest first, while those releases are supported.
        assert_eq!(
            versions,
            ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
        );
        assert_eq!(versions, API_VERSIONS);
        for line in &lines {
            assert_eq!(line["kind"], "DeviceMetadata");
            assert_eq!(
                line["metadata"],
                serde_json::json!({"name": "web-net", "namespace": "team", "uid": "u1", "generation": 7})
            );
            assert_eq!(line["podClaimName"], "net-entry");
            let device = &line["requests"][0]["devices"][0];
            assert_eq!(line["requests"][0]["name"], "net/fast");
            assert_eq!(
                (&device["driver"], &device["pool"], &device["name"]),
                (&"netclaim.dev".into(), &"node-a".into(), &"eth2".into())
            );
            assert_eq!(device["networkData"]["interfaceName"], "net1");
            assert_eq!(device["networkData"]["ips"], serde_json::json!(["10.0.0.2/24"]));
        }
        // Apart from the version, the documents are the same.
        let mut without_version = lines.clone();
        for line in &mut without_version {
            line.as_object_mut().unwrap().remove("apiVersion");
        }
        assert_eq!(without_version[0], without_version[1]);
    }

    fn with(attributes: &[(&str, AttributeValue)]) -> BTreeMap<String, AttributeValue> {
        attributes.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    fn text(value: &str) -> AttributeValue {
        AttributeValue::String(value.to_owned())
    }

    #[test]
    fn a_pci_device_of_its_own_carries_pci_bus_id() {
        let vf = with(&[
            ("netclaim.dev/pciAddress", text("0000:3b:02.1")),
            ("netclaim.dev/sharing", text("exclusive")),
            ("netclaim.dev/type", text("sriov-vf")),
        ]);
        let wire = serde_json::to_value(wire_attributes(&vf)).unwrap();
        assert_eq!(wire[ATTRIBUTE_PCI_BUS_ID], serde_json::json!({"string": "0000:3b:02.1"}));
        assert_eq!(wire["netclaim.dev/pciAddress"], serde_json::json!({"string": "0000:3b:02.1"}));
        // Unqualified keys (the 1.38 published form) are read too.
        let unqualified = with(&[("pciAddress", text("0000:3b:02.2"))]);
        let wire = serde_json::to_value(wire_attributes(&unqualified)).unwrap();
        assert_eq!(wire[ATTRIBUTE_PCI_BUS_ID], serde_json::json!({"string": "0000:3b:02.2"}));
        // Published by the slice itself: kept as it is.
        let published = with(&[
            ("netclaim.dev/pciAddress", text("0000:3b:02.1")),
            (ATTRIBUTE_PCI_BUS_ID, text("0000:3b:02.3")),
        ]);
        let wire = serde_json::to_value(wire_attributes(&published)).unwrap();
        assert_eq!(wire[ATTRIBUTE_PCI_BUS_ID], serde_json::json!({"string": "0000:3b:02.3"}));
        // A sub-interface of a shared parent is not the parent's PCI device; a veth has none.
        let shared = with(&[
            ("netclaim.dev/pciAddress", text("0000:3b:00.0")),
            ("netclaim.dev/sharing", text("shared")),
        ]);
        assert!(!wire_attributes(&shared).contains_key(ATTRIBUTE_PCI_BUS_ID));
        let veth = with(&[("netclaim.dev/type", text("virtual"))]);
        assert!(!wire_attributes(&veth).contains_key(ATTRIBUTE_PCI_BUS_ID));
    }

    #[test]
    fn standard_attributes_survive_the_32_attribute_limit() {
        let mut doc = document(40);
        let attributes = &mut doc.devices[0].attributes;
        attributes.insert("netclaim.dev/pciAddress".into(), text("0000:3b:02.1"));
        attributes.insert("resource.kubernetes.io/pcieRoot".into(), text("pci0000:3a"));
        let lines = lines(&doc.encode("netclaim.dev"));
        for line in &lines {
            let kept = line["requests"][0]["devices"][0]["attributes"].as_object().unwrap();
            assert_eq!(kept.len(), MAX_ATTRIBUTES);
            assert!(kept.contains_key(ATTRIBUTE_PCI_BUS_ID), "{kept:?}");
            assert!(kept.contains_key("resource.kubernetes.io/pcieRoot"), "{kept:?}");
        }
    }

    #[test]
    fn names_follow_the_driver() {
        let layout = MetadataLayout::new("net.example.com", Path::new("/p"), Path::new("/cdi"));
        let doc = document(0);
        assert_eq!(layout.cdi_device_id("u1", "net"), "net.example.com/metadata=u1_net");
        assert_eq!(
            layout.cdi_spec_file("u1", "net"),
            Path::new("/cdi/net.example.com_metadata_u1_net.json")
        );
        assert_eq!(
            layout.host_file("team", "web-net", "net"),
            Path::new("/p/dra-device-metadata/team_web-net/net/metadata.json")
        );
        assert_eq!(
            layout.container_path(&doc),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-net/net/net.example.com-metadata.json"
        );
    }
}
