//! `netclaim inventory`: discover, select and print the slices this node would publish;
//! with `--kubeconfig`, also the devices of the node's PodNetworks.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;

use super::document::{DocumentError, write_json, write_yaml};
use super::{InventoryArgs, OutputFormat, SharingModeArg};
use crate::host::discovery::{self, DiscoveryError};
use crate::host::sysfs::Sysfs;
use crate::inventory::networks::{NetworkInputs, NodeNetworks};
use crate::inventory::slices::{PoolIdentity, build_slices};
use crate::inventory::{Inventory, InventoryError, Selection, SharingMode};
use crate::k8s::ClientError;
use crate::model::device::{Device, Sharing};
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::pod_network::PodNetwork;

/// Why `netclaim inventory` failed.
#[derive(Debug, thiserror::Error)]
pub enum InventoryCommandError {
    /// The selection flags are invalid.
    #[error(transparent)]
    Selection(#[from] InventoryError),
    /// Discovery failed.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// No node name was given and the host name could not be read.
    #[error("no --node-name and the host name is unreadable ({path})")]
    HostName {
        /// Where the host name was read from.
        path: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The async runtime could not start.
    #[error("starting the async runtime")]
    Runtime(#[source] io::Error),
    /// Writing the JSON or YAML document failed.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// Writing to stdout failed.
    #[error("writing output")]
    Write(#[from] io::Error),
    /// `--kubeconfig` gives no client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Reading the PodNetworks or the Node failed.
    #[error("{what}")]
    Api {
        /// What was read.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl InventoryCommandError {
    /// Whether this is a usage error (exit code 2): a flag value only checked after parsing.
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Selection(_))
    }
}

/// The generation `inventory` prints; the daemon continues from the pool's existing one.
const PREVIEW_GENERATION: i64 = 1;

const HOSTNAME_PATH: &str = "/proc/sys/kernel/hostname";

/// Runs the command, writing to `out`.
pub fn run(args: &InventoryArgs, out: &mut impl Write) -> Result<(), InventoryCommandError> {
    let mode = match args.selection.sharing_mode {
        // Without an API server there is nothing to read back; show what `auto` starts with.
        SharingModeArg::Auto | SharingModeArg::Capacity => SharingMode::Capacity,
        SharingModeArg::Slots => SharingMode::Slots,
    };
    let selection = Selection::new(
        &args.selection.include_interfaces,
        &args.selection.exclude_interfaces,
        &args.selection.shared_parents,
        mode,
    )?
    .with_parent_bandwidth(&args.selection.parent_bandwidth);
    let node = match &args.node_name {
        Some(node) => node.clone(),
        None => default_node_name()?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(InventoryCommandError::Runtime)?;
    let sysfs = Sysfs::new(&args.sysfs_root);
    let interfaces = runtime.block_on(discovery::discover(&sysfs))?;
    let networks = match &args.kubeconfig {
        Some(kubeconfig) => {
            runtime.block_on(read_networks(kubeconfig, &args.driver_name, &node))?
        }
        None => NodeNetworks::default(),
    };
    let inventory = Inventory::build_with(&interfaces, &selection, &networks);
    let pool =
        PoolIdentity { driver: args.driver_name.clone(), node, generation: PREVIEW_GENERATION };
    let slices = build_slices(&pool, &inventory.devices);
    match args.output {
        OutputFormat::Json => write_slices_json(&slices, out),
        OutputFormat::Yaml => write_slices_yaml(&slices, out),
        OutputFormat::Table => write_table(&inventory, &networks, out),
    }
}

/// The node's PodNetworks as the daemon judges them: every PodNetwork (none when the kind is
/// not served) and the labels of Node `node` (none when it does not exist).
async fn read_networks(
    kubeconfig: &Path,
    driver: &str,
    node: &str,
) -> Result<NodeNetworks, InventoryCommandError> {
    let client = crate::k8s::client(Some(kubeconfig)).await?;
    let networks: BTreeMap<String, PodNetwork> =
        match Api::<PodNetwork>::all(client.clone()).list(&ListParams::default()).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|network| Some((network.metadata.name.clone()?, network)))
                .collect(),
            Err(kube::Error::Api(status)) if status.code == 404 => BTreeMap::new(),
            Err(source) => {
                return Err(InventoryCommandError::Api { what: "listing PodNetworks", source });
            }
        };
    let labels = Api::<Node>::all(client)
        .get_opt(node)
        .await
        .map_err(|source| InventoryCommandError::Api { what: "reading the Node", source })?
        .and_then(|found| found.metadata.labels)
        .unwrap_or_default();
    let inputs = NetworkInputs {
        pod_networks: Some(Arc::new(networks)),
        node_labels: Some(Arc::new(labels)),
    };
    Ok(NodeNetworks::evaluate(driver, &inputs))
}

/// `$NODE_NAME` (the downward-API convention of DaemonSets), else the kernel host name.
fn default_node_name() -> Result<String, InventoryCommandError> {
    if let Some(node) = std::env::var("NODE_NAME").ok().filter(|node| !node.is_empty()) {
        return Ok(node);
    }
    std::fs::read_to_string(HOSTNAME_PATH)
        .map(|name| name.trim().to_ascii_lowercase())
        .map_err(|source| InventoryCommandError::HostName { path: HOSTNAME_PATH, source })
}

/// The slices as a `List`, as `kubectl get -o json` prints several objects.
fn write_slices_json(
    slices: &[ResourceSlice],
    out: &mut impl Write,
) -> Result<(), InventoryCommandError> {
    let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": slices });
    Ok(write_json(&list, out)?)
}

/// The slices as a YAML stream, one document each.
fn write_slices_yaml(
    slices: &[ResourceSlice],
    out: &mut impl Write,
) -> Result<(), InventoryCommandError> {
    for slice in slices {
        writeln!(out, "---")?;
        write_yaml(slice, out)?;
    }
    Ok(())
}

fn write_table(
    inventory: &Inventory,
    networks: &NodeNetworks,
    out: &mut impl Write,
) -> Result<(), InventoryCommandError> {
    let header =
        ["NAME", "INTERFACE", "TYPE", "SHARING", "PCI", "NUMA", "MTU", "STATE", "POD NETWORK"];
    let rows: Vec<[String; 9]> = inventory.devices.iter().map(table_row).collect();
    write_columns(&header, &rows, out)?;
    if rows.is_empty() {
        writeln!(out, "(no devices to publish)")?;
    }
    if !inventory.skipped.is_empty() {
        writeln!(out, "\nNot published:")?;
        let rows: Vec<[String; 2]> = inventory
            .skipped
            .iter()
            .map(|skipped| [skipped.if_name.clone(), skipped.reason.to_string()])
            .collect();
        write_columns(&["INTERFACE", "REASON"], &rows, out)?;
    }
    if !networks.all().is_empty() {
        writeln!(out, "\nPodNetworks:")?;
        let rows: Vec<[String; 3]> = networks
            .all()
            .iter()
            .map(|network| {
                let served = match &network.state {
                    Ok(()) => "served".to_owned(),
                    Err(why) => format!("not served: {why}"),
                };
                [network.name.clone(), network.mode.to_string(), served]
            })
            .collect();
        write_columns(&["NAME", "MODE", "ON THIS NODE"], &rows, out)?;
    }
    for conflict in &inventory.conflicts {
        writeln!(out, "conflict: {conflict}")?;
    }
    Ok(())
}

fn table_row(device: &Device) -> [String; 9] {
    let text = |name: &str| {
        device
            .string_attribute(&format!("{ATTRIBUTE_DOMAIN}/{name}"))
            .map_or_else(|| "-".to_owned(), str::to_owned)
    };
    let number = |name: &str| {
        device
            .int_attribute(&format!("{ATTRIBUTE_DOMAIN}/{name}"))
            .map_or_else(|| "-".to_owned(), |value| value.to_string())
    };
    let sharing = match &device.sharing {
        Sharing::Exclusive => "exclusive".to_owned(),
        Sharing::Shared => format!("shared ({})", device.shared_capacity.unwrap_or_default()),
        Sharing::Slot => format!("slot {}", device.slot_index.unwrap_or_default()),
    };
    [
        device.name.clone(),
        device.if_name.clone(),
        device.kind.as_str().to_owned(),
        sharing,
        text(attr::PCI_ADDRESS),
        number(attr::NUMA_NODE),
        number(attr::MTU),
        text(attr::OPER_STATE),
        text(attr::POD_NETWORK),
    ]
}

fn write_columns<const N: usize>(
    header: &[&str; N],
    rows: &[[String; N]],
    out: &mut impl Write,
) -> io::Result<()> {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> =
            cells.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        padded.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;
    use crate::model::device::HostInterface;

    fn networks() -> NodeNetworks {
        let network = |name: &str, enabled: bool| -> (String, PodNetwork) {
            let mut network: PodNetwork = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "generation": 1},
                "spec": {"parents": ["eth1"], "enabled": enabled},
                "status": {"observedGeneration": 1, "conditions": [{
                    "type": "Ready", "status": if enabled { "True" } else { "False" },
                    "reason": if enabled { "Ready" } else { "Disabled" }, "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))
            .unwrap();
            network.metadata.name = Some(name.to_owned());
            (name.to_owned(), network)
        };
        let inputs = NetworkInputs {
            pod_networks: Some(Arc::new([network("medianet", true), network("off", false)].into())),
            node_labels: Some(Arc::default()),
        };
        NodeNetworks::evaluate("netclaim.dev", &inputs)
    }

    #[test]
    fn the_table_shows_network_devices_and_why_a_network_is_not_served() {
        let mut eth1 = HostInterface::new(2, "eth1", 1500);
        eth1.hardware.has_device = true;
        let selection = Selection::new(&[], &[], &[], SharingMode::Capacity).unwrap();
        let networks = networks();
        let inventory = Inventory::build_with(&[eth1], &selection, &networks);
        let mut out = Vec::new();
        write_table(&inventory, &networks, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let device = text.lines().find(|l| l.starts_with("medianet-eth1")).unwrap();
        assert!(device.contains("shared (256)") && device.ends_with("medianet"), "{text}");
        assert!(text.contains("POD NETWORK"), "{text}");
        let off = text.lines().find(|l| l.starts_with("off")).unwrap();
        assert!(off.contains("not served: spec.enabled is false"), "{text}");
    }
}
