//! `netclaim status`: what the node daemon on this node is doing, read from its local status
//! API (`<state-dir>/netclaim.sock`, DESIGN §5 item 9), printed as a summary and sections
//! (devices, claims, pods) or as the `NodeStatus` document in JSON or YAML.

use std::io::{self, Write};

use super::document::{DocumentError, write_json, write_yaml};
use super::{OutputFormat, StatusArgs};
use crate::node::status_api::{self, NodeStatus, StatusClientError};

/// Why `netclaim status` failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusCommandError {
    /// The async runtime could not start.
    #[error("starting the async runtime")]
    Runtime(#[source] io::Error),
    /// The daemon could not be asked.
    #[error(transparent)]
    Fetch(#[from] StatusClientError),
    /// Writing the JSON or YAML document failed.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// Writing to stdout failed.
    #[error("writing output")]
    Write(#[from] io::Error),
}

/// Runs the command, writing to `out`.
pub fn run(args: &StatusArgs, out: &mut impl Write) -> Result<(), StatusCommandError> {
    let socket = args.state_dir.join(status_api::SOCKET_NAME);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StatusCommandError::Runtime)?;
    let status = runtime.block_on(status_api::fetch(&socket))?;
    match args.output {
        OutputFormat::Table => render_table(&status, out)?,
        OutputFormat::Json => write_json(&status, out)?,
        OutputFormat::Yaml => write_yaml(&status, out)?,
    }
    Ok(())
}

/// The summary, then one section per kind of thing, each a table (like `cilium status`).
pub fn render_table(status: &NodeStatus, out: &mut impl Write) -> io::Result<()> {
    let count = |health: &str| status.devices.iter().filter(|d| d.health == health).count();
    let interfaces: usize = status.pods.iter().map(|p| p.interfaces.len()).sum();
    let summary = [
        (
            "Node",
            format!("{} (driver {}, netclaim {})", status.node, status.driver, status.version),
        ),
        (
            "Ready",
            match &status.not_ready_reason {
                None if status.ready => "yes".to_owned(),
                None => "no".to_owned(),
                Some(why) => format!("no: {why}"),
            },
        ),
        (
            "Devices",
            format!(
                "{} published, pool generation {} ({} healthy, {} unhealthy, {} unknown)",
                status.devices.len(),
                status.pool_generation,
                count("Healthy"),
                count("Unhealthy"),
                count("Unknown"),
            ),
        ),
        ("Claims", format!("{} prepared", status.claims.len())),
        (
            "Pods",
            format!(
                "{} with {} interface{}",
                status.pods.len(),
                interfaces,
                if interfaces == 1 { "" } else { "s" }
            ),
        ),
        ("Counters", if status.counters { "on" } else { "off" }.to_owned()),
        ("Collected", status.collected_at.clone()),
    ];
    for (label, value) in summary {
        writeln!(out, "{:<11}{value}", format!("{label}:"))?;
    }
    // Only when there is one: a sharing change held for prepared claims (operations.md).
    for held in &status.held_sharing_changes {
        writeln!(out, "{:<11}{held}", "Waiting:")?;
    }
    devices_section(status, out)?;
    claims_section(status, out)?;
    pods_section(status, out)
}

fn devices_section(status: &NodeStatus, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "\nDevices:")?;
    let rows: Vec<Vec<String>> = status
        .devices
        .iter()
        .map(|d| {
            let health = if d.health_message.is_empty() || d.health == "Healthy" {
                d.health.clone()
            } else {
                format!("{}: {}", d.health, d.health_message)
            };
            vec![
                d.name.clone(),
                d.interface.clone(),
                d.kind.clone(),
                d.sharing.clone(),
                d.capacity.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                d.pod_network.clone().unwrap_or_else(|| "-".to_owned()),
                health,
            ]
        })
        .collect();
    table(
        out,
        &["NAME", "INTERFACE", "TYPE", "SHARING", "CAPACITY", "POD NETWORK", "HEALTH"],
        &rows,
    )
}

fn claims_section(status: &NodeStatus, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "\nClaims:")?;
    let rows: Vec<Vec<String>> = status
        .claims
        .iter()
        .flat_map(|claim| {
            claim.devices.iter().map(move |d| {
                vec![
                    format!("{}/{}", claim.namespace, claim.name),
                    claim.pod.clone().unwrap_or_else(|| "-".to_owned()),
                    d.request.clone(),
                    d.device.clone(),
                    d.mode.clone(),
                    d.host_interface.clone(),
                    list(&d.addresses),
                ]
            })
        })
        .collect();
    table(out, &["CLAIM", "POD", "REQUEST", "DEVICE", "MODE", "HOST", "ADDRESSES"], &rows)
}

fn pods_section(status: &NodeStatus, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "\nPods:")?;
    let rows: Vec<Vec<String>> = status
        .pods
        .iter()
        .flat_map(|pod| {
            pod.interfaces.iter().map(move |i| {
                let (rx, tx, drops) = i.counters.map_or_else(
                    || ("-".to_owned(), "-".to_owned(), "-".to_owned()),
                    |c| {
                        (
                            format!("{} {} pkt", bytes(c.rx_bytes), c.rx_packets),
                            format!("{} {} pkt", bytes(c.tx_bytes), c.tx_packets),
                            format!("{}/{}", c.rx_dropped, c.tx_dropped),
                        )
                    },
                );
                vec![
                    format!("{}/{}", pod.namespace, pod.name),
                    i.name.clone(),
                    i.claim.clone(),
                    i.mode.clone(),
                    i.host_interface.clone(),
                    i.mac.clone().unwrap_or_else(|| "-".to_owned()),
                    i.mtu.map_or_else(|| "-".to_owned(), |m| m.to_string()),
                    list(&i.addresses),
                    rx,
                    tx,
                    drops,
                    pod.state.clone(),
                ]
            })
        })
        .collect();
    table(
        out,
        &[
            "POD",
            "INTERFACE",
            "CLAIM",
            "MODE",
            "HOST",
            "MAC",
            "MTU",
            "ADDRESSES",
            "RX",
            "TX",
            "DROPS RX/TX",
            "STATE",
        ],
        &rows,
    )
}

/// A comma list, or `-` when empty.
fn list(items: &[String]) -> String {
    if items.is_empty() { "-".to_owned() } else { items.join(",") }
}

/// Bytes with a binary unit (`512 B`, `1.5 KiB`, `3.2 GiB`).
fn bytes(value: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if value < 1024 {
        return format!("{value} B");
    }
    #[allow(clippy::cast_precision_loss, reason = "one decimal of a byte count")]
    let mut scaled = value as f64 / 1024.0;
    let mut unit = 0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    format!("{scaled:.1} {}", UNITS[unit])
}

/// An indented table with columns as wide as their widest cell; `(none)` without rows.
fn table(out: &mut impl Write, headers: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    if rows.is_empty() {
        return writeln!(out, "  (none)");
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header_row: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        write!(out, " ")?;
        let last = row.len().saturating_sub(1);
        for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if index == last {
                write!(out, " {cell}")?;
            } else {
                write!(out, " {cell:<width$} ")?;
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::status_api::tests::sample;

    fn rendered(status: &NodeStatus) -> String {
        let mut out = Vec::new();
        render_table(status, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_table_has_a_summary_then_devices_claims_and_pods() {
        let text = rendered(&sample());
        let lines: Vec<&str> = text.lines().collect();
        let node = format!(
            "Node:      node-a (driver netclaim.dev, netclaim {})",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(lines[0], node);
        assert_eq!(lines[1], "Ready:     yes");
        assert!(
            lines[2].starts_with(
                "Devices:   2 published, pool generation 7 (0 healthy, 1 unhealthy, 1 unknown)"
            ),
            "{text}"
        );
        let sections: Vec<usize> = ["Devices:", "Claims:", "Pods:"]
            .iter()
            .map(|s| lines.iter().position(|l| l == s).unwrap_or_else(|| panic!("{s}\n{text}")))
            .collect();
        assert!(sections.windows(2).all(|w| w[0] < w[1]), "{text}");
        let device = lines.iter().find(|l| l.contains("pci-0000-3b-00-1")).unwrap();
        assert!(device.ends_with("Unhealthy: ens1f1: no carrier"), "{device}");
        let shared = lines.iter().find(|l| l.trim_start().starts_with("medianet-eth1")).unwrap();
        assert!(shared.contains("shared") && shared.contains("256") && shared.contains("medianet"));
        let claim = lines.iter().find(|l| l.contains("default/web-net")).unwrap();
        assert!(claim.contains("macvlan") && claim.contains("10.10.1.5/24"), "{claim}");
        let pod = lines.iter().find(|l| l.contains("default/web ")).unwrap();
        for cell in [
            "net1",
            "web-net",
            "02:00:00:00:00:01",
            "1400",
            "1000 B 10 pkt",
            "2.0 KiB 20 pkt",
            "1/2",
            "attached",
        ] {
            assert!(pod.contains(cell), "{cell} missing from {pod}");
        }
    }

    #[test]
    fn columns_line_up_and_empty_sections_say_none() {
        let mut status = sample();
        status.claims.clear();
        status.pods.clear();
        status.ready = false;
        status.not_ready_reason = Some("state: the journal refuses writes".to_owned());
        let text = rendered(&status);
        assert!(text.contains("Ready:     no: state: the journal refuses writes"), "{text}");
        assert!(text.contains("Claims:\n  (none)\n"), "{text}");
        assert!(text.ends_with("Pods:\n  (none)\n"), "{text}");
        let header = text.lines().find(|l| l.trim_start().starts_with("NAME")).unwrap();
        let column = header.find("HEALTH").unwrap();
        for line in text.lines().filter(|l| l.contains("physical")) {
            assert!(line.len() > column, "{line}");
            assert!(!line[column..].starts_with(' '), "HEALTH starts at column {column}: {line}");
        }
    }

    #[test]
    fn held_sharing_changes_are_listed_in_the_summary() {
        let mut status = sample();
        assert!(!rendered(&status).contains("Waiting:"));
        status.held_sharing_changes = vec!["shared device medianet-eth1 on eth1 keeps …".into()];
        let text = rendered(&status);
        assert!(
            text.contains("\nWaiting:   shared device medianet-eth1 on eth1 keeps …\n"),
            "{text}"
        );
    }

    #[test]
    fn byte_counts_are_human() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }
}
