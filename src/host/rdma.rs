//! RDMA discovery (DESIGN §2): which netdevs have an RDMA function, and its facts
//! ([`RdmaFacts`]), from the RDMA netlink family (`crates/rdma-netlink`) joined with sysfs.
//!
//! Sources, per RDMA device (`/sys/class/infiniband/<dev>`):
//! - netlink `RDMA_NLDEV_CMD_GET`: index, port count, node GUID; `RDMA_NLDEV_CMD_PORT_GET`:
//!   each port's netdev (`RDMA_NLDEV_ATTR_NDEV_NAME`, RoCE and iWARP); `RDMA_NLDEV_CMD_SYS_GET`:
//!   the node's netns mode;
//! - sysfs: `device` (the PCI function; absent for software devices), `ports/<n>/link_layer`,
//!   `node_guid`, `ports/<n>/gid_attrs/ndevs/*` (the netdev of a RoCE port when netlink does
//!   not name it), and a netdev on the same PCI function for ports netlink and the GID table
//!   leave unnamed (IPoIB on InfiniBand ports);
//! - the character devices: `class/infiniband_verbs/uverbsN/ibdev`,
//!   `class/infiniband_mad/umadN/ibdev` and `class/misc/rdma_cm`; the kernel names their
//!   nodes `/dev/infiniband/<name>` (the `devnode` callbacks of `ib_uverbs`, `ib_umad` and
//!   `rdma_ucm`).
//!
//! Nothing is read when `/sys/class/infiniband` does not exist (`ib_core` not loaded): the
//! netlink socket is not even opened, so discovery never loads RDMA modules on a node
//! without them. RDMA facts are optional: a failure is logged and leaves them unknown,
//! never failing the node's discovery.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rdma_netlink::{Device, Port, RdmaSocket};

use super::sysfs::{SysfsError, canonical, exists, file_name, link_name, read_trimmed};
use crate::model::device::{HostInterface, PciAddress};
use crate::model::rdma::{RdmaFacts, RdmaLinkLayer, RdmaNetnsMode, format_guid};

/// Where the kernel puts the character devices of RDMA (`devnode` callbacks).
const DEV_INFINIBAND: &str = "/dev/infiniband";

/// An RDMA discovery step that failed.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// An RDMA netlink request failed.
    #[error("RDMA netlink: {0}")]
    Netlink(#[source] rdma_netlink::Error),
    /// Reading sysfs failed.
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
}

/// What the RDMA netlink family answered in one round (the calling thread's netns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetlinkView {
    /// The device dump.
    pub devices: Vec<Device>,
    /// The ports of every device.
    pub ports: Vec<Port>,
    /// The node's netns mode.
    pub netns_mode: Option<RdmaNetnsMode>,
}

impl NetlinkView {
    /// Asks the kernel: the device dump, each device's ports, and the netns mode.
    pub fn read() -> Result<Self, RdmaError> {
        let mut socket = RdmaSocket::open().map_err(RdmaError::Netlink)?;
        let devices = socket.devices().map_err(RdmaError::Netlink)?;
        let mut ports = Vec::new();
        for device in &devices {
            match socket.ports(device.index) {
                Ok(found) => ports.extend(found),
                // Unregistered since the dump (`rdma link delete`, a driver unbound): the
                // kernel refuses the index; sysfs no longer lists it either.
                Err(err @ rdma_netlink::Error::Kernel { .. }) => {
                    tracing::debug!(device = %device.name, error = %err, "ports of a device gone");
                }
                Err(err) => return Err(RdmaError::Netlink(err)),
            }
        }
        let netns_mode =
            Some(RdmaNetnsMode::from_kernel(socket.netns_mode().map_err(RdmaError::Netlink)?));
        Ok(Self { devices, ports, netns_mode })
    }
}

/// Reads RDMA facts below a sysfs root, joined with netlink's answers.
#[derive(Debug, Clone)]
pub struct RdmaSysfs {
    root: PathBuf,
}

impl RdmaSysfs {
    /// A reader below `root` (normally `/sys`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Whether the kernel has RDMA at all (`ib_core` registered its class).
    pub fn has_rdma(&self) -> Result<bool, SysfsError> {
        exists(&self.root.join("class/infiniband"))
    }

    /// The RDMA facts of every netdev that has an RDMA function, by netdev name. `netlink`
    /// is `None` when the RDMA netlink family could not be asked: everything but the device
    /// index and the netns mode then comes from sysfs alone.
    pub fn facts(
        &self,
        netlink: Option<&NetlinkView>,
    ) -> Result<BTreeMap<String, RdmaFacts>, SysfsError> {
        let mut by_netdev = BTreeMap::new();
        let class = self.root.join("class/infiniband");
        let verbs = self.class_by_ibdev("infiniband_verbs", "uverbs")?;
        let mads = self.class_by_ibdev("infiniband_mad", "umad")?;
        let rdma_cm = exists(&self.root.join("class/misc/rdma_cm"))?;
        for name in entries(&class)? {
            let dir = class.join(&name);
            let device = netlink.and_then(|n| n.devices.iter().find(|d| d.name == name));
            let port_count = match device {
                Some(device) => device.ports,
                None => u32::try_from(entries(&dir.join("ports"))?.len()).unwrap_or(u32::MAX),
            };
            let node_guid = match device.and_then(|d| d.node_guid) {
                Some(guid) => Some(format_guid(guid)),
                None => read_trimmed(&dir.join("node_guid"))?,
            };
            let device_dir = canonical(&dir.join("device"))?;
            let pci_address = match &device_dir {
                Some(device_dir)
                    if link_name(&device_dir.join("subsystem"))?.as_deref() == Some("pci") =>
                {
                    file_name(device_dir).and_then(|n| n.parse::<PciAddress>().ok())
                }
                _ => None,
            };
            let mut char_devices = Vec::new();
            char_devices.extend(verbs.get(&name).into_iter().flatten().map(dev_node));
            char_devices.extend(mads.get(&name).into_iter().flatten().map(dev_node));
            if rdma_cm {
                char_devices.push(dev_node("rdma_cm"));
            }
            let mut facts = RdmaFacts::new(&name, port_count);
            facts.index = device.map(|d| d.index);
            facts.node_guid = node_guid;
            facts.pci_address = pci_address;
            facts.netns_mode = netlink.and_then(|n| n.netns_mode);
            facts.char_devices = char_devices;
            for port in 1..=port_count {
                let netdev = match netlink
                    .and_then(|n| n.ports.iter().find(|p| p.device_name == name && p.port == port))
                {
                    Some(Port { netdev_name: Some(netdev), .. }) => Some(netdev.clone()),
                    _ => Self::gid_netdev(&dir, port)?,
                };
                let netdev = match netdev {
                    Some(netdev) => Some(netdev),
                    None => Self::same_function_netdev(device_dir.as_deref(), port)?,
                };
                let Some(netdev) = netdev else { continue };
                let mut port_facts = facts.clone();
                port_facts.port = Some(port);
                port_facts.link_layer =
                    read_trimmed(&dir.join(format!("ports/{port}/link_layer")))?
                        .and_then(|text| RdmaLinkLayer::from_kernel(&text));
                // One netdev on several ports (rare): its first port speaks for it.
                by_netdev.entry(netdev).or_insert(port_facts);
            }
        }
        Ok(by_netdev)
    }

    /// `class/<class>/<prefix>N/ibdev` → the `<prefix>N` entries of each RDMA device, sorted.
    fn class_by_ibdev(
        &self,
        class: &str,
        prefix: &str,
    ) -> Result<BTreeMap<String, Vec<String>>, SysfsError> {
        let dir = self.root.join("class").join(class);
        let mut by_device: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // `issmN` shares `infiniband_mad`: it takes the port's SM role, which no pod needs.
        for entry in entries(&dir)?.into_iter().filter(|e| e.starts_with(prefix)) {
            if let Some(ibdev) = read_trimmed(&dir.join(&entry).join("ibdev"))? {
                by_device.entry(ibdev).or_default().push(entry);
            }
        }
        Ok(by_device)
    }

    /// The netdev of a RoCE port from its GID table (`gid_attrs/ndevs/<n>`; unused entries
    /// answer `EINVAL`, read as absent). The first entry naming one wins: every entry of a
    /// port names its netdev or a VLAN/macvlan upper of it, and entry 0 (the default GID)
    /// always names the port's own netdev.
    fn gid_netdev(dir: &Path, port: u32) -> Result<Option<String>, SysfsError> {
        let ndevs = dir.join(format!("ports/{port}/gid_attrs/ndevs"));
        let mut indexes: Vec<u32> =
            entries(&ndevs)?.iter().filter_map(|e| e.parse().ok()).collect();
        indexes.sort_unstable();
        for index in indexes {
            if let Some(netdev) =
                read_trimmed(&ndevs.join(index.to_string()))?.filter(|n| !n.is_empty())
            {
                return Ok(Some(netdev));
            }
        }
        Ok(None)
    }

    /// A netdev on the same PCI function as the RDMA device (IPoIB on an InfiniBand port,
    /// which neither netlink nor the GID table names), on `port` by its `dev_port`
    /// (0-based); a single-port device takes its function's only netdev.
    fn same_function_netdev(
        device_dir: Option<&Path>,
        port: u32,
    ) -> Result<Option<String>, SysfsError> {
        let Some(device_dir) = device_dir else { return Ok(None) };
        let net = device_dir.join("net");
        let netdevs = entries(&net)?;
        for netdev in &netdevs {
            let dev_port = read_trimmed(&net.join(netdev).join("dev_port"))?
                .and_then(|text| text.parse::<u32>().ok());
            if dev_port.map(|p| p + 1) == Some(port) {
                return Ok(Some(netdev.clone()));
            }
        }
        Ok(match netdevs.as_slice() {
            [only] if port == 1 => Some(only.clone()),
            _ => None,
        })
    }
}

/// `/dev/infiniband/<name>`.
fn dev_node(name: impl AsRef<Path>) -> PathBuf {
    Path::new(DEV_INFINIBAND).join(name)
}

/// The names in a directory, sorted; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<String>, SysfsError> {
    match fs::read_dir(dir) {
        Ok(list) => {
            let mut names: Vec<String> = list
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
                .collect();
            names.sort();
            Ok(names)
        }
        Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(SysfsError { path: dir.to_owned(), source }),
    }
}

/// Fills in [`HostInterface::rdma`] for the interfaces that have an RDMA function. Never
/// fails: RDMA facts that cannot be read stay unknown (logged), the interfaces are
/// published without them. Netlink answers for the calling thread's netns.
pub fn annotate(sysfs_root: &Path, interfaces: &mut [HostInterface]) {
    let sysfs = RdmaSysfs::new(sysfs_root);
    match sysfs.has_rdma() {
        Ok(true) => {}
        Ok(false) => return,
        Err(err) => {
            tracing::warn!(error = %err, "reading /sys/class/infiniband; RDMA facts unknown");
            return;
        }
    }
    let netlink = match NetlinkView::read() {
        Ok(view) => Some(view),
        Err(err) => {
            tracing::warn!(error = %err, "asking the RDMA netlink family; RDMA facts from sysfs only");
            None
        }
    };
    match sysfs.facts(netlink.as_ref()) {
        Ok(mut by_netdev) => {
            for interface in interfaces {
                interface.rdma = by_netdev.remove(&interface.name);
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "reading RDMA facts from sysfs; RDMA facts unknown");
        }
    }
}

/// The node's RDMA netns mode now (`rdma system show netns`); `None` when the kernel has no
/// RDMA (`ib_core` not loaded: `/sys/class/infiniband` absent). Opens a netlink socket in
/// the calling thread's netns; the mode is node-wide.
pub fn netns_mode(sysfs_root: &Path) -> Result<Option<RdmaNetnsMode>, RdmaError> {
    if !RdmaSysfs::new(sysfs_root).has_rdma()? {
        return Ok(None);
    }
    let mut socket = RdmaSocket::open().map_err(RdmaError::Netlink)?;
    let mode = socket.netns_mode().map_err(RdmaError::Netlink)?;
    Ok(Some(RdmaNetnsMode::from_kernel(mode)))
}

#[cfg(test)]
mod tests;
