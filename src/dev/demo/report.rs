//! What the demo reports (pure, no I/O): one row per pod from its Pod and claim status, the
//! checks that decide success, the table for people and the JSON document for machines.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Serialize;

use crate::dev::kubelet::pod_status::is_running_and_ready;

/// One pod's interface as the claim status reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    /// Pod name.
    pub name: String,
    /// Its generated claim.
    pub claim: String,
    /// Pod phase.
    pub phase: String,
    /// Pod `Ready` condition is True.
    pub ready: bool,
    /// The claim's device has condition `Ready` True with reason `NetworkReady`.
    pub network_ready: bool,
    /// `networkData.interfaceName`.
    pub interface: String,
    /// `networkData.hardwareAddress`.
    pub mac: String,
    /// `networkData.ips` (CIDR form).
    pub addresses: Vec<String>,
    /// The device and share the claim got.
    pub device: String,
    /// The pod's network namespace (bare mode: under the run dir; containerd: its own).
    pub netns: Option<String>,
    /// The node it runs on (reported by the demo of several nodes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// One ping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PingResult {
    /// Source pod.
    pub from: String,
    /// Target (pod name or `peer`).
    pub to: String,
    /// Target address.
    pub address: String,
    /// Whether replies came back.
    pub ok: bool,
    /// ping's summary line, or the error.
    pub detail: String,
}

/// Timings of the phases, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// Start to the end of cleanup.
    pub wall_seconds: f64,
    /// Starting the cluster (API server, node daemon, allocator, kubelet).
    pub cluster_start_seconds: f64,
    /// Creating the pods until all are Ready with NetworkReady claims.
    pub pods_ready_seconds: f64,
    /// Deleting everything.
    pub cleanup_seconds: f64,
}

/// Whether the host is clean afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleanup {
    /// Nothing left.
    pub ok: bool,
    /// Host links still carrying the demo's name prefix.
    pub leftover_links: Vec<String>,
    /// Files or directories of the demo still present.
    pub leftover_paths: Vec<String>,
}

/// The demo's result: `--output json` prints it as one document.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DemoReport {
    /// Every step succeeded and every check passed.
    pub success: bool,
    /// `bare-netns` or `containerd`.
    pub mode: String,
    /// Node name.
    pub node: String,
    /// The shared parent (host end of the veth).
    pub parent: String,
    /// The peer end's name.
    pub peer: String,
    /// The peer's address.
    pub peer_address: String,
    /// The address pool of the claims.
    pub subnet: String,
    /// One row per pod, by name.
    pub pods: Vec<PodRow>,
    /// The pings.
    pub pings: Vec<PingResult>,
    /// Each pod's traffic counters after the pings, from its claim status (empty when the
    /// cluster runs without counters).
    pub traffic: Vec<TrafficRow>,
    /// One claim's `status.devices`.
    pub claim_status: Option<serde_json::Value>,
    /// Phase timings.
    pub timings: Timings,
    /// Peak resident set of the process (`VmHWM`), KiB.
    pub peak_rss_kib: Option<u64>,
    /// Host state afterwards.
    pub cleanup: Cleanup,
    /// What went wrong, in order.
    pub errors: Vec<String>,
}

/// The row of `pod` whose claim (from `status.resourceClaimStatuses`) is `claim`.
#[must_use]
pub fn pod_row(pod: &Pod, claim: Option<&ResourceClaim>, driver: &str) -> PodRow {
    let mut row = PodRow {
        name: pod.metadata.name.clone().unwrap_or_default(),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        ready: is_running_and_ready(pod.status.as_ref()),
        ..PodRow::default()
    };
    let Some(claim) = claim else { return row };
    row.claim = claim.metadata.name.clone().unwrap_or_default();
    let devices = claim.status.as_ref().and_then(|s| s.devices.as_ref());
    let Some(device) = devices.into_iter().flatten().find(|d| d.driver == driver) else {
        return row;
    };
    row.device = match &device.share_id {
        Some(share) => format!("{} (share {share})", device.device),
        None => device.device.clone(),
    };
    row.network_ready = device
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "NetworkReady");
    if let Some(data) = &device.network_data {
        row.interface = data.interface_name.clone().unwrap_or_default();
        row.mac = data.hardware_address.clone().unwrap_or_default();
        row.addresses = data.ips.clone().unwrap_or_default();
    }
    row
}

/// The checks of a finished run: every pod Ready with a NetworkReady claim and an address
/// in `subnet`, all addresses distinct, at least `expected_pods` pods, every ping answered.
/// Returns what failed.
#[must_use]
pub fn check(report: &DemoReport, expected_pods: usize, subnet: IpNetwork) -> Vec<String> {
    let mut problems = Vec::new();
    if report.pods.len() != expected_pods {
        problems.push(format!("{} pods reported, {expected_pods} expected", report.pods.len()));
    }
    let mut seen = BTreeSet::new();
    for pod in &report.pods {
        if !pod.ready {
            problems
                .push(format!("pod {} is not Running and Ready (phase {})", pod.name, pod.phase));
        }
        if !pod.network_ready {
            problems.push(format!("claim {} of pod {} is not NetworkReady", pod.claim, pod.name));
        }
        let inside: Vec<&String> = pod
            .addresses
            .iter()
            .filter(|a| a.parse::<IpNetwork>().is_ok_and(|n| subnet.contains(n.ip())))
            .collect();
        if inside.is_empty() {
            problems
                .push(format!("pod {} has no address in {subnet}: {:?}", pod.name, pod.addresses));
        }
        for address in inside {
            if !seen.insert(address.clone()) {
                problems.push(format!("address {address} is handed out twice (pod {})", pod.name));
            }
        }
    }
    if report.pings.is_empty() {
        problems.push("no ping was run".to_owned());
    }
    for ping in report.pings.iter().filter(|p| !p.ok) {
        problems.push(format!(
            "ping {} → {} ({}) failed: {}",
            ping.from, ping.to, ping.address, ping.detail
        ));
    }
    problems
}

/// The table of pods for people (with a NODE column when the rows name nodes).
#[must_use]
pub fn render_table(rows: &[PodRow]) -> String {
    if rows.iter().any(|r| r.node.is_some()) {
        let cells: Vec<[String; 6]> = rows
            .iter()
            .map(|r| {
                [
                    r.name.clone(),
                    r.node.clone().unwrap_or_default(),
                    r.interface.clone(),
                    r.mac.clone(),
                    r.addresses.join(","),
                    if r.ready && r.network_ready { "yes".to_owned() } else { "no".to_owned() },
                ]
            })
            .collect();
        return render_columns(["POD", "NODE", "INTERFACE", "MAC", "ADDRESS", "READY"], &cells);
    }
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.interface.clone(),
                r.mac.clone(),
                r.addresses.join(","),
                if r.ready && r.network_ready { "yes".to_owned() } else { "no".to_owned() },
            ]
        })
        .collect();
    render_columns(["POD", "INTERFACE", "MAC", "ADDRESS", "READY"], &cells)
}

/// The table of traffic counters for people.
#[must_use]
pub fn render_traffic(rows: &[TrafficRow]) -> String {
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.pod.clone(),
                r.interface.clone(),
                r.rx_packets.to_string(),
                r.rx_bytes.to_string(),
                r.tx_packets.to_string(),
                r.tx_bytes.to_string(),
                format!("{}/{}", r.rx_dropped, r.tx_dropped),
            ]
        })
        .collect();
    render_columns(
        ["POD", "INTERFACE", "RX PACKETS", "RX BYTES", "TX PACKETS", "TX BYTES", "DROPPED RX/TX"],
        &cells,
    )
}

/// Left-aligned columns two spaces apart, the last one unpadded.
fn render_columns<const N: usize>(headers: [&str; N], cells: &[[String; N]]) -> String {
    let mut widths = headers.map(str::len);
    for row in cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&headers.map(str::to_owned));
    for row in cells {
        line(row);
    }
    out
}

/// One pod interface's traffic counters, as its claim's `data.stats` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficRow {
    /// Pod name.
    pub pod: String,
    /// Interface.
    pub interface: String,
    /// `rxPackets`.
    pub rx_packets: u64,
    /// `rxBytes`.
    pub rx_bytes: u64,
    /// `txPackets`.
    pub tx_packets: u64,
    /// `txBytes`.
    pub tx_bytes: u64,
    /// `rxDropped`.
    pub rx_dropped: u64,
    /// `txDropped`.
    pub tx_dropped: u64,
}

impl TrafficRow {
    /// The row of `pod` from the `data.stats` of its claim's entry; `None` without counters.
    #[must_use]
    pub fn from_status(pod: &PodRow, claim: &ResourceClaim) -> Option<Self> {
        let entries = claim.status.as_ref()?.devices.as_ref()?;
        let stats = entries.iter().find_map(|entry| {
            let name = entry.network_data.as_ref()?.interface_name.as_deref()?;
            (name == pod.interface).then_some(entry.data.as_ref()?.0.get("stats")?)
        })?;
        let field = |name: &str| stats.get(name).and_then(serde_json::Value::as_u64).unwrap_or(0);
        Some(Self {
            pod: pod.name.clone(),
            interface: pod.interface.clone(),
            rx_packets: field("rxPackets"),
            rx_bytes: field("rxBytes"),
            tx_packets: field("txPackets"),
            tx_bytes: field("txBytes"),
            rx_dropped: field("rxDropped"),
            tx_dropped: field("txDropped"),
        })
    }
}

/// `VmHWM` (peak resident set, KiB) from a `/proc/<pid>/status` text.
#[must_use]
pub fn peak_rss_kib(proc_status: &str) -> Option<u64> {
    proc_status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid")},
            "spec": {"containers": [{"name": "app"}]},
            "status": {
                "phase": if ready { "Running" } else { "Pending" },
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    fn claim(name: &str, ip: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {},
            "status": {"devices": [{
                "driver": "netclaim.dev", "pool": "dev-node", "device": "ncdabcdefp",
                "shareID": "11111111-2222-3333-4444-555555555555",
                "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkReady",
                                "message": "", "lastTransitionTime": "2026-11-22T10:00:00Z"}],
                "networkData": {"interfaceName": "net1", "ips": [ip],
                                "hardwareAddress": "02:00:00:00:00:01"},
            }]},
        }))
        .unwrap()
    }

    fn report(rows: Vec<PodRow>) -> DemoReport {
        DemoReport {
            pods: rows,
            pings: vec![PingResult {
                from: "a".into(),
                to: "peer".into(),
                address: "10.10.1.254".into(),
                ok: true,
                detail: String::new(),
            }],
            ..DemoReport::default()
        }
    }

    fn subnet() -> IpNetwork {
        "10.10.1.0/24".parse().unwrap()
    }

    #[test]
    fn a_row_takes_interface_mac_and_addresses_from_the_claim_status() {
        let row = pod_row(
            &pod("demo-01", true),
            Some(&claim("demo-01-net-x", "10.10.1.10/24")),
            "netclaim.dev",
        );
        assert_eq!(row.interface, "net1");
        assert_eq!(row.mac, "02:00:00:00:00:01");
        assert_eq!(row.addresses, ["10.10.1.10/24"]);
        assert!(row.ready && row.network_ready);
        assert!(row.device.starts_with("ncdabcdefp (share "), "{}", row.device);
        // Another driver's entry is not ours.
        let other = pod_row(&pod("demo-01", true), Some(&claim("c", "10.10.1.10/24")), "other.dev");
        assert!(!other.network_ready && other.interface.is_empty());
    }

    #[test]
    fn checks_pass_for_distinct_ready_addresses_and_name_each_problem() {
        let good: Vec<PodRow> = (10..12)
            .map(|i| {
                pod_row(
                    &pod(&format!("p{i}"), true),
                    Some(&claim(&format!("c{i}"), &format!("10.10.1.{i}/24"))),
                    "netclaim.dev",
                )
            })
            .collect();
        assert_eq!(check(&report(good.clone()), 2, subnet()), Vec::<String>::new());

        let mut bad = good;
        bad[1].addresses = bad[0].addresses.clone();
        bad[0].ready = false;
        let mut with_failed_ping = report(bad);
        with_failed_ping.pings[0].ok = false;
        let problems = check(&with_failed_ping, 3, subnet());
        let text = problems.join("\n");
        assert!(text.contains("2 pods reported, 3 expected"), "{text}");
        assert!(text.contains("pod p10 is not Running and Ready"), "{text}");
        assert!(text.contains("handed out twice"), "{text}");
        assert!(text.contains("ping a → peer"), "{text}");
    }

    #[test]
    fn an_address_outside_the_pool_fails_the_check() {
        let row = pod_row(&pod("p", true), Some(&claim("c", "192.168.9.9/24")), "netclaim.dev");
        let problems = check(&report(vec![row]), 1, subnet());
        assert!(problems.iter().any(|p| p.contains("no address in 10.10.1.0/24")), "{problems:?}");
    }

    #[test]
    fn the_table_aligns_columns() {
        let row =
            pod_row(&pod("demo-01", true), Some(&claim("c", "10.10.1.10/24")), "netclaim.dev");
        let table = render_table(&[row]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("POD      INTERFACE  MAC"), "{table}");
        assert_eq!(lines[0].find("MAC"), lines[1].find("02:00"), "{table}");
    }

    #[test]
    fn the_table_has_a_node_column_when_rows_name_nodes() {
        let mut row =
            pod_row(&pod("demo-01", true), Some(&claim("c", "10.10.1.10/24")), "netclaim.dev");
        assert!(!render_table(std::slice::from_ref(&row)).contains("NODE"));
        row.node = Some("dev-node-2".to_owned());
        let table = render_table(&[row]);
        assert!(table.starts_with("POD      NODE        INTERFACE"), "{table}");
        assert!(table.contains("demo-01  dev-node-2  net1"), "{table}");
    }

    #[test]
    fn peak_rss_is_read_from_proc_status() {
        let status = "Name:\tnetclaim\nVmPeak:\t  100 kB\nVmHWM:\t   23456 kB\nVmRSS:\t 20000 kB\n";
        assert_eq!(peak_rss_kib(status), Some(23456));
        assert_eq!(peak_rss_kib("Name: x\n"), None);
    }
}
